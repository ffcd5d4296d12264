"""Validation gates (seed 001): the rules a snapshot must pass before anyone may approve it.

``validate`` re-verifies every digest, then checks: every pinned source version still readable;
record ids unique and each in exactly one known split; tombstone and benchmark hits 0; unknown
sources 0; no open dead letters; every removed duplicate standing behind a member (a near
duplicate's direct match a member at or above the threshold) and no leakage group across two
splits; lineage complete (every member traces to a pinned object and a
canonical row); member count equal to the table; a canary replay of a fixed subset of objects
from their pinned versions giving exactly the recorded records. It returns the gate report the
blocking asset check shows, and moves BUILDING -> VALIDATED, or -> INCOMPLETE when the freeze was
not a consistent boundary.
"""

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sqlalchemy import select

from corpus_assets.core.governance import states
from corpus_assets.core.governance.lineage import tombstone_matches
from corpus_assets.core.release.verify import Report, load_manifest, resolve, verify
from corpus_assets.core.storage.artifacts import get_json, get_table
from corpus_assets.core.storage.cas import CasError, ContentStore
from corpus_assets.core.storage.catalog import Catalog, benchmark_items, freezes
from corpus_assets.core.storage.digests import json_digest
from corpus_assets.core.storage.tasks import ChunkTask, open_dead_letters

SPLITS = {"train", "validation", "test"}
Replay = Callable[[dict[str, Any], dict[str, Any], list[str]], dict[str, str]]


def validate(
    cas: ContentStore,
    catalog: Catalog,
    digest: str,
    late_changes: Callable[[dict[str, Any]], list[str]] | None = None,
    replay: Replay | None = None,
    current_image: str | None = None,
) -> Report:
    """Run every gate; VALIDATED on success, INCOMPLETE if the freeze was not consistent.

    ``late_changes`` re-reads change logs for late events; ``replay`` re-parses canary chunks
    with this code (chunk key -> output digest); ``current_image`` is this code's transform image.
    """
    report = verify(cas, catalog, digest)
    snapshot = resolve(catalog, digest)
    incomplete: list[str] = []
    try:
        manifest = load_manifest(cas, snapshot)
        freeze = json.loads(cas.get_bytes(manifest["freeze"]["digest"], "freeze spec"))
        rules = _gates(cas, catalog, manifest, freeze, report, replay, current_image)
        incomplete = list(freeze.get("incomplete", []))
        if late_changes is not None:
            incomplete += late_changes(freeze)
    except CasError as error:  # already reported by verify, by object name
        rules = [str(error)]
    report.findings.extend(dict.fromkeys(f for f in rules if f not in report.findings))
    report.findings.extend(incomplete)
    report.gate["incomplete"] = len(incomplete)
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


def _gates(
    cas: ContentStore,
    catalog: Catalog,
    manifest: dict[str, Any],
    freeze: dict[str, Any],
    report: Report,
    replay: Replay | None,
    current_image: str | None,
) -> list[str]:
    findings: list[str] = []
    gate = report.gate
    for key in ("tombstoneWatermark", "benchmarkFence"):
        if manifest[key] != freeze[key]:
            findings.append(f"{key} {manifest[key]} differs from the freeze's {freeze[key]}")

    pinned = {o["sha256"]: s["id"] for s in freeze["sources"] for o in s["objects"]}
    unreadable = [d for d in pinned if not cas.contains(d)]
    findings += [f"pinned source version {d} is not readable" for d in unreadable]
    gate["unversioned_objects"] = sum(
        1 for s in freeze["sources"] for o in s["objects"] if not o.get("sha256")
    )
    gate["source_watermark_coverage"] = _coverage(freeze)

    canonical = json.loads(cas.get_bytes(manifest["layers"]["canonical_records"]["digest"]))
    unaccounted = canonical["counts"].get("unexplained", 0)
    if unaccounted:
        findings.append(f"canonical_records: {unaccounted} source rows are not accounted for")
    gate["canonical_unexplained_rows"] = unaccounted
    dead = [
        f"dead letter open: chunk {d['chunk']}: {d['error']}"
        for d in canonical["outputs"]["dead_letters"]
    ]
    tasks = [
        ChunkTask("canonical_records", c["chunk"], c["input"], canonical["code"])
        for c in canonical["outputs"]["chunks"]
    ]
    dead += [
        f"dead letter open: chunk {t.chunk_key}: {e}" for t, e in open_dead_letters(catalog, tasks)
    ]
    findings += list(dict.fromkeys(dead))
    gate["dead_letters"] = len(set(dead))

    members = pq.read_table(pa.BufferReader(cas.get_bytes(manifest["members"]["digest"])))
    if members.num_rows != manifest["members"]["count"]:
        findings.append(
            f"members table has {members.num_rows} rows, "
            f"manifest says {manifest['members']['count']}"
        )
    ids = members.column("record_id").to_pylist()
    duplicates = sorted(rid for rid, n in Counter(ids).items() if n > 1)
    by_id: dict[str, set[str]] = {}
    for rid, split in zip(ids, members.column("split").to_pylist(), strict=True):
        by_id.setdefault(rid, set()).add(split)
    for rid in duplicates:
        splits = sorted(by_id[rid])
        where = f" in splits {', '.join(splits)}" if len(splits) > 1 else ""
        findings.append(f"record_id {rid!r} appears {ids.count(rid)} times in members{where}")
    gate["duplicate_ids"] = len(duplicates)
    bad_split = set(members.column("split").to_pylist()) - SPLITS
    if bad_split:
        findings.append(f"members with unknown split: {sorted(bad_split)}")
    unknown = set(members.column("source_id").to_pylist()) - {s["id"] for s in freeze["sources"]}
    if unknown:
        findings.append(f"members from unknown sources: {sorted(unknown)}")
    gate["unknown_sources"] = len(unknown)

    records = _canonical_rows(cas, canonical)
    orphans = [
        rid
        for rid, obj, line in zip(
            ids,
            members.column("object").to_pylist(),
            members.column("line").to_pylist(),
            strict=True,
        )
        if obj not in pinned or records.get(rid) != (obj, line)
    ]
    findings += [f"member {rid!r} has no lineage to a pinned object row" for rid in orphans[:20]]
    gate["orphan_ids"] = len(orphans)
    gate["lineage_completeness"] = _percent(len(ids) - len(orphans), len(ids))
    dedup = json.loads(cas.get_bytes(manifest["layers"]["dedup_clusters"]["digest"]))
    unexplained = (
        len(records) - len(ids) - dedup["counts"]["removed"] - dedup["counts"].get("tombstoned", 0)
    )
    if unexplained:
        findings.append(f"{unexplained} canonical rows are neither members nor duplicates")
    gate["unexplained_rows"] = unexplained
    dedup_findings, leaks = dedup_invariants(cas, dedup, members)
    findings += dedup_findings[:20]
    gate["dedup_invariant_violations"] = len(dedup_findings) - leaks
    gate["leakage_group_split_violations"] = leaks

    tombstone_hits = _tombstone_hits(catalog, int(manifest["tombstoneWatermark"]), members)
    findings += tombstone_hits
    gate["tombstone_hits"] = len(tombstone_hits)
    benchmark_hits = _benchmark_hits(catalog, int(manifest["benchmarkFence"]), members)
    findings += benchmark_hits
    gate["benchmark_hits"] = len(benchmark_hits)

    if current_image is not None and current_image != manifest["transformImage"]:
        tag = manifest["transformImage"].partition("@")[0]
        same = " (same tag, another digest)" if tag == current_image.partition("@")[0] else ""
        findings.append(
            f"transform image {manifest['transformImage']} is not this code's {current_image}"
            f"{same}: a replay would not run the manifest's transform"
        )
    if replay is not None:
        findings += _canary(canonical, freeze, replay, gate)
    with catalog.begin() as conn:
        frozen_at = conn.scalar(
            select(freezes.c.created_at).where(freezes.c.partition_key == manifest["partition"])
        )
    gate["build_latency_seconds"] = round(time.time() - frozen_at, 1) if frozen_at else None
    return findings


def dedup_invariants(
    cas: ContentStore, dedup: dict[str, Any], members: pa.Table
) -> tuple[list[str], int]:
    """Algorithm 18.1's invariant and the leakage promise, checked on the published tables.

    Every removed record stands behind a member; a near duplicate's direct match is a member at
    or above the threshold; all members of one leakage group share one split. Returns the
    findings and how many of them are split leaks.
    """
    if "report" not in dedup["outputs"]:  # an index written before near-dedup
        return [], 0
    columns = ["record_id", "verdict", "representative_id", "match_id", "match_jaccard"]
    columns.append("leakage_id")
    clusters = get_table(cas, dedup["outputs"]["clusters"], "dedup clusters", columns)
    report = get_json(cas, dedup["outputs"]["report"], "dedup report")
    threshold = float(report.get("lsh", {}).get("threshold", "0"))
    split_of = dict(
        zip(
            members.column("record_id").to_pylist(),
            members.column("split").to_pylist(),
            strict=True,
        )
    )
    findings = []
    removed = pc.is_in(clusters.column("verdict"), pa.array(["exact_duplicate", "near_duplicate"]))
    for row in clusters.filter(removed).to_pylist():
        rid, rep = row["record_id"], row["representative_id"]
        if rep not in split_of:
            findings.append(f"removed record {rid!r} stands behind {rep!r}, which is no member")
        if row["verdict"] == "near_duplicate" and (
            row["match_id"] not in split_of or row["match_jaccard"] < threshold
        ):
            findings.append(
                f"near duplicate {rid!r}: direct match {row['match_id']!r} at Jaccard "
                f"{row['match_jaccard']} is not a member at or above {threshold}"
            )
    kept = clusters.filter(pc.equal(clusters.column("verdict"), "keep"))
    split_by_group: dict[str, set[str]] = {}
    for rid, group in zip(
        kept.column("record_id").to_pylist(), kept.column("leakage_id").to_pylist(), strict=True
    ):
        if rid in split_of:
            split_by_group.setdefault(group, set()).add(split_of[rid])
    leaks = [
        f"leakage group {group!r} spans splits {', '.join(sorted(splits))}"
        for group, splits in sorted(split_by_group.items())
        if len(splits) > 1
    ]
    return findings + leaks, len(leaks)


def canary_chunks(canonical: dict[str, Any]) -> list[str]:
    """The fixed canary subset: the first chunk of each source, in index order."""
    seen: dict[str, str] = {}
    for chunk in canonical["outputs"]["chunks"]:
        seen.setdefault(chunk["chunk"].split("/", 1)[0], chunk["chunk"])
    return list(seen.values())


def _canary(
    canonical: dict[str, Any], freeze: dict[str, Any], replay: Replay, gate: dict[str, Any]
) -> list[str]:
    chosen = canary_chunks(canonical)
    recorded = {c["chunk"]: c["output"]["digest"] for c in canonical["outputs"]["chunks"]}
    replayed = replay(canonical, freeze, chosen)
    gate["canary_chunks"] = len(chosen)
    gate["transform_replay_hash"] = json_digest(dict(sorted(replayed.items())))
    differ = [c for c in chosen if replayed.get(c) != recorded[c]]
    gate["set_difference"] = len(differ)
    return [
        f"canary replay of {c} gave {replayed.get(c)}, the snapshot recorded {recorded[c]}"
        for c in differ
    ]


def _canonical_rows(cas: ContentStore, canonical: dict[str, Any]) -> dict[str, tuple[str, int]]:
    rows: dict[str, tuple[str, int]] = {}
    for chunk in canonical["outputs"]["chunks"]:
        descriptor = json.loads(cas.get_bytes(chunk["output"]["digest"]))
        table = pq.read_table(
            pa.BufferReader(cas.get_bytes(descriptor["records"]["digest"])),
            columns=["record_id", "object", "line"],
        )
        for rid, obj, line in zip(*(table.column(i).to_pylist() for i in range(3)), strict=True):
            rows[rid] = (obj, line)
    return rows


def _tombstone_hits(catalog: Catalog, watermark: int, members: pa.Table) -> list[str]:
    reasons = sorted(set(tombstone_matches(catalog, watermark, members).values()))
    return [f"{reason} hits this snapshot" for reason in reasons]


def _benchmark_hits(catalog: Catalog, fence: int, members: pa.Table) -> list[str]:
    keys = set(members.column("dedup_key").to_pylist())
    with catalog.begin() as conn:
        items = conn.execute(
            select(benchmark_items.c.benchmark, benchmark_items.c.dedup_key).where(
                benchmark_items.c.seq <= fence
            )
        ).all()
    return [f"benchmark {name!r} item {key} is a member" for name, key in items if key in keys]


def _coverage(freeze: dict[str, Any]) -> dict[str, str]:
    coverage = {}
    for source in freeze["sources"]:
        if source["kind"] == "changelog":
            span = int(source["watermark"]) - int(source["startLsn"]) + 1
            missing = sum(int(hi) - int(lo) + 1 for lo, hi in source["gaps"])
            coverage[source["id"]] = _percent(span - missing, span)
        else:
            coverage[source["id"]] = "100%"
    return coverage


def _percent(part: int, whole: int) -> str:
    return "100%" if whole == 0 else f"{100 * part / whole:.2f}%".replace(".00%", "%")
