"""The held-out near-pair rule, and its bounded form for a child whose parent passed it.

The rule searches again (``splits.heldout``) for near pairs at or above the threshold between a
held-out record and a record of another split (a removed duplicate in its representative's):
there must be none. Candidates and estimates are its own, over the published splits; exact
Jaccards the splits layer verified (its stored, digest-checked ``heldout_verified``, when it
ran this code and spec) are not computed again.

Whether a pair is found depends on its two records only - their texts (signatures, shingles,
thresholds by script) and their splits - under the signature spec and thresholds: no bucket
cap, no other record takes part. So when the parent snapshot's check passed this rule under this
code and config (its outcome is in ``gate_memo`` under the parent's own key), with the same
transform image, signature spec and thresholds, every pair of records the parent searched with
the same (record id, object, line, split) holds in the child too, and the child searches only
the pairs with at least one record that is new or changed against the parent's tables (read by
digest, re-hashed unless unchanged on disk since they last hashed right, as the build's check
trusts its own). Anything else - no parent, a parent not checked under this code, its tables
gone from the store - searches every pair.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.dedup.report import DedupReport
from corpus_assets.core.governance import states
from corpus_assets.core.ingest.freeze_spec import FreezeSpec
from corpus_assets.core.publication import gate_memo
from corpus_assets.core.publication.evidence import Evidence
from corpus_assets.core.publication.heldout_parts import Side, changed_by_parts, unshared_parts
from corpus_assets.core.publication.rules import SHOWN, RuleReport, ValidationRule
from corpus_assets.core.runtime.layer_index import LayerIndex, load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import Manifest, ManifestError, read_manifest
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import PARQUET, get_json
from corpus_assets.core.storage.cas import CasError
from corpus_assets.core.storage.cas_queries import ordered_parts
from corpus_assets.core.storage.table_lookup import TrustedFiles
from corpus_assets.core.training_view.splits import CODE as SPLITS_CODE
from corpus_assets.core.training_view.splits import (
    HeldoutScan,
    narrowed_pairs,
    reuse,
    searched_records,
)

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

RULE = "heldout_near_apart"
# The set difference of (record id, object, line, split) with each object (a 71-character
# digest, the same on most rows) as its number among the objects of both sides in sort order:
# one number per object, the same on both sides, so the difference is the same set and hashes
# a small integer per row (at 1.1 GB the objects were two thirds of its cost). A null object
# stays null, which the difference holds equal to null as before.
OBJECTS = """
CREATE OR REPLACE TEMP TABLE ho_objects AS
SELECT object, dense_rank() OVER (ORDER BY object) AS code FROM (
    SELECT object FROM ({child}) UNION SELECT object FROM ({parent_objects}))
WHERE object IS NOT NULL
"""
CHANGED = """
SELECT record_id FROM (
    SELECT record_id, o.code, line, split FROM ({child}) LEFT JOIN ho_objects o USING (object)
    EXCEPT
    SELECT record_id, o.code, line, split FROM ({parent}) LEFT JOIN ho_objects o USING (object))
"""


def heldout_near_apart(ws: Workspace) -> ValidationRule:
    """The gate (module docstring): no near pair spans a held-out split and another."""

    def heldout_near_apart(ev: Evidence, report: RuleReport) -> list[str]:
        scan = HeldoutScan.open(ws, ev.canonical.chunks(), ev.dedup, ev.files)
        if scan is None:  # near-dedup off: no signatures, no threshold
            return []
        # rows by (record id, object, line) against the records tables: the gate does not take
        # the dedup layer's decisions table (its clusters positions) on trust
        searched = searched_records(ev.clusters(), "members")
        kept = f"SELECT record_id, object, line, split FROM ({searched})"  # what is read
        ev.con.execute(f"CREATE OR REPLACE TEMP TABLE ho_searched AS {kept}")
        try:
            pairs = _searched_pairs(ws, ev, scan)
        finally:  # the gate's next eviction would write them to its spill directory
            ev.con.execute("DROP TABLE IF EXISTS ho_searched")
            ev.con.execute("DROP TABLE IF EXISTS ho_objects")
        cross = pairs.filter(pc.not_equal(pairs["split_a"], pairs["split_b"]))
        report.heldout_near_pairs = cross.num_rows  # only the shown ones become Python objects
        return [
            f"near pair {p['record_a']!r} ({p['split_a']}) ~ {p['record_b']!r} "
            f"({p['split_b']}) at Jaccard {p['jaccard']:.4f} spans two splits"
            for p in cross.slice(0, SHOWN).to_pylist()
        ]

    return heldout_near_apart


def _searched_pairs(ws: Workspace, ev: Evidence, scan: HeldoutScan) -> pa.Table:
    """The near pairs of the records in ``ho_searched``: of the changed ones only when a
    parent passed the rule (``changed_since_parent``), else of all."""
    records = "SELECT * FROM ho_searched"  # read twice: the changed records and the search
    known = reuse(ws, ev.dedup, scan.spec, (ev.splits, SPLITS_CODE, "splits layer"))
    changed = changed_since_parent(ws, ev, records)
    if changed is None:
        return scan.pairs(ev.con, records, known, keep=False)[0]
    ev.narrowed.append(RULE)  # only the changed records' rows and their candidates' are read
    return narrowed_pairs(scan, ev.con, records, known, changed)[0]


def changed_since_parent(ws: Workspace, ev: Evidence, records: str) -> pa.Array | None:
    """The record ids searched in this snapshot but not, as they are, in its parent's passing
    search; None when there is no such parent (search everything)."""
    parent = _passed_parent(ws, ev)
    if parent is None:
        return None
    manifest, dedup = parent
    files = TrustedFiles(ws.cas, ws.catalog)  # the parent's tables: hashed by its check
    try:
        members = manifest.members.paths(files, "parent members table")
        clusters = PartedTable.read(ws.cas, dedup.output("clusters"), "parent dedup clusters")
        ev.con.execute(f"CREATE OR REPLACE VIEW ho_parent AS {ordered_parts(members)}")
        sides = _sides(ws, ev, manifest, clusters)
        if sides is not None:  # both in parts: only the parts they do not share are joined
            ev.parts_checked[RULE] = unshared_parts(*sides)
            return changed_by_parts(ev.con, files, *sides)
        table = clusters.relation(files, "parent dedup clusters")  # whole or parts, either
    except (CasError, ManifestError):
        return None
    theirs = searched_records(table, "ho_parent")  # every object it names is in the table
    return changed_records(ev.con, records, theirs, f"SELECT object FROM {table}")


def _sides(
    ws: Workspace, ev: Evidence, manifest: Manifest, clusters: PartedTable
) -> tuple[Side, Side] | None:
    """The child's and the parent's clusters and members parts (``heldout_parts``), or None
    when either table of either snapshot is stored whole."""
    mine = PartedTable.read(ws.cas, ev.dedup.output("clusters"), "dedup clusters")
    if mine.counts is None or clusters.counts is None or ev.member_parts is None:
        return None
    if manifest.members.media == PARQUET:
        return None
    theirs = manifest.members.parts(ws.cas).parts
    child = Side(mine.parts, tuple(ev.member_parts), "members")
    return child, Side(clusters.parts, tuple(theirs), "ho_parent")


def changed_records(
    con: DuckDBPyConnection, child: str, parent: str, parent_objects: str
) -> pa.Array:
    """The record ids of ``child``'s (record_id, object, line, split) rows not in ``parent``'s;
    ``parent_objects`` is a query whose ``object`` column holds every object ``parent`` names."""
    con.execute(OBJECTS.format(child=child, parent_objects=parent_objects))
    return con.sql(CHANGED.format(child=child, parent=parent)).to_arrow_table()["record_id"]


def _passed_parent(ws: Workspace, ev: Evidence) -> tuple[Manifest, LayerIndex] | None:
    """The parent's manifest and dedup index when its check passed this rule under this code
    and config, with this snapshot's transform image and near-dedup settings."""
    if not ev.freeze.parents:
        return None
    try:
        snapshot = states.get(ws.catalog, ev.freeze.parents[0])
        manifest = read_manifest(ws.cas, snapshot.manifest_digest, "parent manifest")
        key = gate_memo.gate_key(ws, manifest, FreezeSpec.load(ws.cas, manifest.freeze))
        dedup = load_index(ws.cas, manifest.layers["dedup_clusters"], "dedup_clusters")
        same = _near_settings(ws, dedup) == _near_settings(ws, ev.dedup)
    except (CasError, ManifestError, states.StateError):
        return None
    passed = gate_memo.recall(ws.catalog, {RULE: gate_memo.rule_key(key, RULE)})
    if RULE not in passed or not same or manifest.transform_image != ev.manifest.transform_image:
        return None
    return manifest, dedup


def _near_settings(ws: Workspace, dedup: LayerIndex) -> Any:
    """What a pair's outcome depends on besides its records: signature spec and thresholds."""
    near = DedupReport.parse(get_json(ws.cas, dedup.output("report"), "dedup report")).near
    if near is None:
        return None
    scripts = [(r.script, r.threshold) for r in near.near_dedup_by_script]
    return near.signature, near.lsh.threshold, scripts
