"""Deletion lineage: which snapshots, members and packed spans a tombstone reaches.

A revoked record, source object or group is looked up in every snapshot's members table, and
the matching record ids in its packed spans, so an audit can say exactly which training inputs
carried it and which runs (permits) read them. A target that dedup removed is not a member, but
its content reached training through its kept representative: the dedup table's rows keep that
alias, and it is reported under ``carried_by`` (with the verdict and Jaccard) and its
representative's spans are counted. ``hits`` reads each snapshot's deletion index (a few small
shards), ``scan_hits`` the whole tables (the reference it must agree with).
"""

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlalchemy import select

from corpus_assets.core.governance import deletion_index, states, tombstones
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import Manifest, read_manifest
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, permits

COLUMN = deletion_index.COLUMN
CARRIED_ORDER = deletion_index.CARRIED
SPAN_ORDER = ["record_id", "record_offset", "block", "start", "end", "shard"]  # pack order


def revoked_targets(catalog: Catalog, watermark: int) -> dict[str, dict[str, str]]:
    """kind -> target -> "tombstone <seq> (<kind> '<target>')" of the first tombstone in force
    at ``watermark`` revoking it; kinds in the order their first tombstone came."""
    by_kind: dict[str, dict[str, str]] = {}
    for stone in tombstones.in_force(catalog, watermark):
        by_kind.setdefault(stone.kind, {}).setdefault(
            stone.target, f"tombstone {stone.seq} ({stone.kind} {stone.target!r})"
        )
    return by_kind


def tombstone_matches(catalog: Catalog, watermark: int, table: pa.Table) -> dict[int, str]:
    """Row index -> "tombstone <seq> (<kind> '<target>')" for rows of ``table`` (with record_id,
    object and group_id columns) revoked by a tombstone at or below ``watermark``."""
    by_kind = revoked_targets(catalog, watermark)
    if not by_kind or not table.num_rows:
        return {}
    found: dict[int, str] = {}
    for kind, targets in by_kind.items():
        for row, value in enumerate(table.column(COLUMN[kind]).to_pylist()):
            if value in targets:
                found.setdefault(row, targets[value])
    return found


def searchable(catalog: Catalog) -> list[states.Snapshot]:
    """Every snapshot but the EXPIRED: gc removed their tables and manifest (and, unless a
    child's index chains to it, their deletion index), so nothing of them can be searched."""
    return [s for s in states.find(catalog) if s.state != states.EXPIRED]


def hits(cas: ContentStore, catalog: Catalog, kind: str, target: str) -> list[dict[str, Any]]:
    """Per snapshot that holds the target: its state, members hit, spans hit, runs that read it.
    Each snapshot's deletion index (built on first use) is read, not its tables: one shard
    holds the target's members, removed duplicates and their spans; the catalog is asked once
    for every memo row and once for every permit, not once a snapshot."""
    found = searchable(catalog)
    indexes = deletion_index.for_snapshots(cas, catalog, [s.manifest_digest for s in found])
    keys = [
        deletion_index.member_key(kind, target),
        deletion_index.carried_key(kind, target),
        deletion_index.reach_key(kind, target),
    ]
    reached = []
    for snapshot, index in zip(found, indexes, strict=True):
        rows = index.rows(keys)
        if not rows.num_rows:
            continue
        fact = rows.column("key")
        members_hit = rows.filter(pc.equal(fact, keys[0])).column("record_id")
        carried = rows.filter(pc.equal(fact, keys[1])).select(deletion_index.CARRIED)
        spans = rows.filter(pc.equal(fact, keys[2])).select(index.directory["spanColumns"])
        reached.append((snapshot, members_hit, carried, spans))
    runs = _runs(catalog, [snapshot.snapshot_id for snapshot, *_ in reached])
    return [_hit(*entry, runs.get(entry[0].snapshot_id, [])) for entry in reached]


def _runs(catalog: Catalog, snapshot_ids: list[str]) -> dict[str, list[str]]:
    """snapshot id -> the runs its permits name, for every given snapshot in a query or few."""
    found: dict[str, list[str]] = {}
    with catalog.begin() as conn:
        for at in range(0, len(snapshot_ids), 500):  # under any backend's parameter limit
            query = select(permits.c.snapshot_id, permits.c.run_id).where(
                permits.c.snapshot_id.in_(snapshot_ids[at : at + 500])
            )
            for snapshot_id, run_id in conn.execute(query).all():
                found.setdefault(snapshot_id, []).append(run_id)
    return found


def _hit(
    snapshot: states.Snapshot,
    members: pa.ChunkedArray,
    carried: pa.Table,
    spans: pa.Table,
    runs: list[str],
) -> dict[str, Any]:
    """One snapshot's entry in a tombstone's lineage, with the runs that read it; rows in a
    total order, sorted by Arrow (spans in pack order: a repeated record's spans by block)."""
    spans = _sorted(spans, SPAN_ORDER)
    return {
        "snapshotId": snapshot.snapshot_id,
        "partition": snapshot.partition_key,
        "state": snapshot.state,
        "members": pc.take(members, pc.sort_indices(members)).to_pylist(),
        "carried_by": _sorted(carried, CARRIED_ORDER).to_pylist(),
        "spans": spans.to_pylist(),
        "blocks": pc.unique(spans.column("block")).sort().to_pylist(),
        "runs": sorted(runs),
    }


def _sorted(table: pa.Table, fields: list[str]) -> pa.Table:
    """``table`` by ``fields`` (those it has), nulls first."""
    order = [(f, "ascending", "at_start") for f in fields if f in table.column_names]
    return table.sort_by(order) if order else table


def scan_hits(cas: ContentStore, catalog: Catalog, kind: str, target: str) -> list[dict[str, Any]]:
    """``hits`` by reading every snapshot's members and dedup tables whole: the reference the
    deletion index must agree with, and a way to answer without building it."""
    found = []
    for snapshot in searchable(catalog):
        manifest = read_manifest(cas, snapshot.manifest_digest)
        parts = manifest.members.part_refs(cas)
        members = pa.concat_tables([get_table(cas, ref, "members table") for ref in parts])
        matched = members.filter(pc.equal(members.column(COLUMN[kind]), target))
        carried = _carried_by(cas, manifest, kind, target)
        if not matched.num_rows and not carried.num_rows:
            continue
        ids = pa.concat_arrays(
            [
                matched.column("record_id").combine_chunks(),
                carried.column("representative_id").combine_chunks(),
            ]
        )
        spans = _spans_of(cas, manifest, ids)
        found.append((snapshot, matched.column("record_id"), carried, spans))
    runs = _runs(catalog, [snapshot.snapshot_id for snapshot, *_ in found])
    return [_hit(*entry, runs.get(entry[0].snapshot_id, [])) for entry in found]


def _spans_of(cas: ContentStore, manifest: Manifest, ids: pa.Array) -> pa.Table:
    """Every packed span of these records: shard (by digest), block, [start, end), offset."""
    packed = load_index(cas, manifest.layers["packed_blocks"], "packed_blocks")
    spans = get_table(cas, packed.output("spans"), "spans table")
    spans = spans.filter(pc.is_in(spans.column("record_id"), value_set=ids))
    spans = spans.select([c for c in deletion_index.SPANS if c in spans.column_names])
    if "shard" in spans.column_names:  # an index written before shards has none
        shards = pa.array([ref["digest"] for ref in packed.outputs.get("shards", [])], pa.string())
        where = spans.schema.get_field_index("shard")
        spans = spans.set_column(where, "shard", pc.take(shards, spans.column("shard")))
    return spans


def _carried_by(cas: ContentStore, manifest: Manifest, kind: str, target: str) -> pa.Table:
    """Removed duplicates matching the target, with the kept record that carried their content:
    every part of the clusters table read (one table, or its chunk parts in order)."""
    dedup = load_index(cas, manifest.layers["dedup_clusters"], "dedup_clusters")
    parts = PartedTable.read(cas, dedup.output("clusters"), "dedup clusters").refs
    found = [_carried_in(get_table(cas, ref, "dedup clusters"), kind, target) for ref in parts]
    if not found or any(rows is None for rows in found):
        return deletion_index.ROWS.empty_table().select(deletion_index.CARRIED)
    return pa.concat_tables(found)


def _carried_in(clusters: pa.Table, kind: str, target: str) -> pa.Table | None:
    """The rows of one clusters table (or part) a target's removed duplicates are; None for a
    table written before near-dedup (no verdicts)."""
    if "verdict" not in clusters.column_names:
        return None
    rows = clusters.filter(
        pc.and_(
            pc.equal(clusters.column(COLUMN[kind]), target),
            pc.is_in(clusters.column("verdict"), pa.array(["exact_duplicate", "near_duplicate"])),
        )
    )
    return rows.select(deletion_index.CARRIED)


def tombstone_hits(cas: ContentStore, catalog: Catalog, seq: int) -> dict[str, Any]:
    """Deletion lineage of tombstone ``seq``: what it revokes (or, for a lift, what it gave
    back), whether it is still in force, and every snapshot holding its target."""
    entry = tombstones.entry(catalog, seq)
    if entry is None:
        raise LookupError(f"no tombstone {seq}")
    return {**entry, "snapshots": hits(cas, catalog, entry["kind"], entry["target"])}
