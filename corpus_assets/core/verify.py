"""Verification and validation of a built snapshot.

``verify`` recomputes every digest reachable from the manifest (the snapshotId itself, then each
CAS object by walking refs) and names every object that does not match. ``validate`` adds the gate
rules of seed 001 - no open dead letters, unique record ids with exactly one split, no unknown
sources, no tombstone hits, watermarks equal to the freeze - and moves BUILDING -> VALIDATED.
"""

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import select

from corpus_assets.core import states
from corpus_assets.core.artifacts import JSON, PARQUET, is_ref
from corpus_assets.core.cas import CasError, ContentStore
from corpus_assets.core.catalog import Catalog, tombstones
from corpus_assets.core.manifest import snapshot_id as compute_snapshot_id
from corpus_assets.core.tasks import ChunkTask, open_dead_letters


@dataclass
class Report:
    snapshot_id: str
    objects_checked: int = 0
    bytes_checked: int = 0
    findings: list[str] = field(default_factory=list)
    digests: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.findings


def resolve(catalog: Catalog, digest: str) -> states.Snapshot:
    """A snapshot by its snapshotId, or by the CAS digest of its manifest document."""
    for snapshot in states.find(catalog):
        if digest in (snapshot.snapshot_id, snapshot.manifest_digest):
            return snapshot
    raise states.StateError(f"no snapshot with id or manifest digest {digest} in the catalog")


def load_manifest(cas: ContentStore, snapshot: states.Snapshot) -> dict[str, Any]:
    return json.loads(cas.get_bytes(snapshot.manifest_digest, "manifest"))


def verify(cas: ContentStore, catalog: Catalog, digest: str) -> Report:
    snapshot = resolve(catalog, digest)
    report = Report(snapshot.snapshot_id)
    try:
        manifest = load_manifest(cas, snapshot)
    except CasError as error:
        report.findings.append(f"manifest: {error}")
        return report
    report.objects_checked += 1
    recomputed = compute_snapshot_id(manifest)
    if recomputed != manifest.get("snapshotId") or recomputed != snapshot.snapshot_id:
        report.findings.append(
            f"manifest {snapshot.manifest_digest}: snapshotId is {manifest.get('snapshotId')}, "
            f"catalog says {snapshot.snapshot_id}, payload hashes to {recomputed}"
        )
    report.digests.add(snapshot.manifest_digest)
    _walk(cas, manifest, "manifest", report, seen=report.digests)
    members = manifest.get("members", {})
    if report.ok and is_ref(members):
        rows = pq.read_metadata(pa.BufferReader(cas.get_bytes(members["digest"]))).num_rows
        if rows != members.get("count"):
            report.findings.append(
                f"members table {members['digest']}: has {rows} rows, manifest says "
                f"{members.get('count')}"
            )
    return report


def _walk(cas: ContentStore, node: Any, where: str, report: Report, seen: set[str]) -> None:
    """Verify every ref under ``node``; descend into JSON documents."""
    if is_ref(node):
        digest = node["digest"]
        if digest in seen:
            return
        seen.add(digest)
        try:
            data = cas.get_bytes(digest, f"object at {where}")
        except CasError as error:
            report.findings.append(str(error))
            return
        report.objects_checked += 1
        report.bytes_checked += len(data)
        if len(data) != node["size"]:
            report.findings.append(
                f"CAS object at {where} {digest}: {len(data)} bytes, ref says {node['size']}"
            )
        if node["media"] == JSON:
            _walk(cas, json.loads(data), where, report, seen)
        elif node["media"] == PARQUET:
            pq.read_metadata(pa.BufferReader(data))
        return
    if isinstance(node, dict):
        for key, value in node.items():
            _walk(cas, value, f"{where}.{key}", report, seen)
    elif isinstance(node, list):
        for n, value in enumerate(node):
            _walk(cas, value, f"{where}[{n}]", report, seen)


def validate(
    cas: ContentStore,
    catalog: Catalog,
    digest: str,
    late_changes: Callable[[dict[str, Any]], list[str]] | None = None,
) -> Report:
    """Run every gate rule; on success move the snapshot BUILDING -> VALIDATED.

    A freeze that is not a consistent boundary (CDC offset gap at freeze time, or late events at
    or below its watermark found now by ``late_changes``) moves the snapshot to INCOMPLETE, from
    any state before ACTIVE: it can never be published.
    """
    report = verify(cas, catalog, digest)
    snapshot = resolve(catalog, digest)
    try:
        manifest = load_manifest(cas, snapshot)
        freeze = json.loads(cas.get_bytes(manifest["freeze"]["digest"], "freeze spec"))
        rules = _gate_rules(cas, catalog, manifest, freeze)
        incomplete = list(freeze.get("incomplete", []))
        if late_changes is not None:
            incomplete += late_changes(freeze)
    except CasError as error:  # already reported by verify, by object name
        rules, incomplete = [str(error)], []
    report.findings.extend(dict.fromkeys(f for f in rules if f not in report.findings))
    report.findings.extend(incomplete)
    if incomplete and snapshot.state in (states.BUILDING, states.VALIDATED, states.APPROVED):
        states.transition(
            catalog,
            snapshot.snapshot_id,
            snapshot.state,
            states.INCOMPLETE,
            "validator",
            "; ".join(incomplete),
        )
    elif report.ok and snapshot.state == states.BUILDING:
        states.transition(
            catalog,
            snapshot.snapshot_id,
            states.BUILDING,
            states.VALIDATED,
            "validator",
            f"{report.objects_checked} objects verified",
        )
    return report


def _gate_rules(
    cas: ContentStore, catalog: Catalog, manifest: dict[str, Any], freeze: dict[str, Any]
) -> list[str]:
    findings = []
    for key in ("tombstoneWatermark", "benchmarkFence"):
        if manifest[key] != freeze[key]:
            findings.append(f"{key} {manifest[key]} differs from the freeze's {freeze[key]}")
    canonical = json.loads(cas.get_bytes(manifest["layers"]["canonical_records"]["digest"]))
    for dead in canonical["outputs"]["dead_letters"]:
        findings.append(f"dead letter open: chunk {dead['chunk']}: {dead['error']}")
    tasks = [
        ChunkTask("canonical_records", c["chunk"], c["input"], canonical["code"])
        for c in canonical["outputs"]["chunks"]
    ]
    for task, error in open_dead_letters(catalog, tasks):
        findings.append(f"dead letter open: chunk {task.chunk_key}: {error}")
    members = pq.read_table(pa.BufferReader(cas.get_bytes(manifest["members"]["digest"])))
    ids = members.column("record_id").to_pylist()
    for record_id, n in Counter(ids).items():
        if n > 1:
            findings.append(f"record_id {record_id!r} appears {n} times in members")
    known = {s["id"] for s in freeze["sources"]}
    unknown = set(members.column("source_id").to_pylist()) - known
    if unknown:
        findings.append(f"members from unknown sources: {sorted(unknown)}")
    bad_split = set(members.column("split").to_pylist()) - {"train", "validation", "test"}
    if bad_split:
        findings.append(f"members with unknown split: {sorted(bad_split)}")
    watermark = int(manifest["tombstoneWatermark"])
    with catalog.begin() as conn:
        hits = (
            conn.execute(
                select(tombstones.c.record_id)
                .where(tombstones.c.seq <= watermark)
                .where(tombstones.c.record_id.in_(ids))
            )
            .scalars()
            .all()
            if ids
            else []
        )
    findings.extend(f"tombstoned record {rid!r} is a member" for rid in sorted(set(hits)))
    return findings
