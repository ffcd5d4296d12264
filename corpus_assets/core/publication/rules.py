"""The validation rules, one small function each (``ValidationRule``), and the report they fill.

A rule reads the evidence of one snapshot (manifest, freeze spec, layer indexes, members table,
catalog), returns its findings - empty when it holds - and sets its metrics on the
``RuleReport`` that the blocking check shows. Which rules make a snapshot valid is decided in
one place only, ``validation.snapshot_rules``; this module defines them and nothing runs them
but ``validation.validate_snapshot``. (The alias gate that activation passes is another thing:
``governance.alias_gate``.)
"""

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, ConfigDict
from sqlalchemy import select

from corpus_assets.core.dedup.report import DedupReport
from corpus_assets.core.governance.benchmarks import active_items
from corpus_assets.core.governance.deletion_reach import COLUMN, revoked_targets
from corpus_assets.core.ingest.freeze_spec import ChangelogSourceSpec, FreezeSpec
from corpus_assets.core.publication import accounting_check, ids_check, lineage_check
from corpus_assets.core.publication.evidence import Evidence
from corpus_assets.core.publication.leakage_check import (
    leaked_components,
    register_dropped,
    removed_without_member,
)
from corpus_assets.core.publication.packing_check import packing_findings
from corpus_assets.core.records.canary import Replay
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.storage.artifacts import get_json
from corpus_assets.core.storage.cas_queries import sql_list
from corpus_assets.core.storage.catalog import freezes
from corpus_assets.core.storage.digests import json_digest
from corpus_assets.core.storage.tasks import ChunkTask, open_dead_letters
from corpus_assets.core.training_view.splits import SPLITS

LateChanges = Callable[[FreezeSpec], list[str]]
SHOWN = 20  # findings a gate lists per rule (the metric counts them all)
# Repeated member ids with their count and splits. Grouped first by the ids' 64-bit hashes (an
# integer aggregate, ~half the CPU of one over the id strings): an id repeated has a repeated
# hash, so the ids behind repeated hashes (none but collisions in a valid table) hold every
# repeated id, and only they are grouped by the id itself; the splits are listed for those only.
REPEATED_IDS = """
WITH hashes AS (SELECT hash(record_id) AS h FROM members GROUP BY h HAVING count(*) > 1),
repeated AS (SELECT record_id FROM members WHERE hash(record_id) IN (SELECT h FROM hashes)
             GROUP BY record_id HAVING count(*) > 1)
SELECT record_id, count(*), list_sort(list(DISTINCT split)) FROM members
WHERE record_id IN (SELECT record_id FROM repeated) GROUP BY record_id ORDER BY record_id
"""


class RuleReport(BaseModel):
    """The rules' metrics, typed; a rule that could not read its evidence leaves its keys out.

    Field order is the order the check's metadata shows them in.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    source_watermark_coverage: dict[str, str] | None = None
    canonical_unexplained_rows: int | None = None
    dead_letters: int | None = None
    duplicate_ids: int | None = None
    unknown_sources: int | None = None
    orphan_ids: int | None = None
    lineage_completeness: str | None = None
    unexplained_rows: int | None = None
    accounting_mismatches: int | None = None
    dedup_invariant_violations: int | None = None
    leakage_group_split_violations: int | None = None
    heldout_near_pairs: int | None = None
    split_conflicts: int | None = None
    split_quarantined: int | None = None
    packing_violations: int | None = None
    tombstone_hits: int | None = None
    benchmark_hits: int | None = None
    canary_chunks: int | None = None
    canary_lines: int | None = None
    transform_replay_hash: str | None = None
    set_difference: int | None = None
    build_latency_seconds: float | None = None
    incomplete: int | None = None

    def serialized(self) -> dict[str, Any]:
        """The JSON form the check shows: exactly the metrics that were measured."""
        return self.model_dump(exclude_unset=True)


ValidationRule = Callable[[Evidence, RuleReport], list[str]]


def fences_match(ev: Evidence, _report: RuleReport) -> list[str]:
    """The manifest names the fences its freeze was built behind, not later ones."""
    frozen = {
        "tombstoneWatermark": str(ev.freeze.tombstone_watermark),
        "benchmarkFence": str(ev.freeze.benchmark_fence),
    }
    stated = {
        "tombstoneWatermark": ev.manifest.tombstone_watermark,
        "benchmarkFence": ev.manifest.benchmark_fence,
    }
    return [
        f"{key} {stated[key]} differs from the freeze's {value}"
        for key, value in frozen.items()
        if stated[key] != value
    ]


def pinned_versions_readable(ev: Evidence, report: RuleReport) -> list[str]:
    """A replay or an audit needs every pinned source version; coverage shows CDC gaps."""
    report.source_watermark_coverage = _coverage(ev.freeze)
    return [
        f"pinned source version {d} is not readable" for d in ev.pinned if not ev.cas.contains(d)
    ]


def canonical_rows_accounted(ev: Evidence, report: RuleReport) -> list[str]:
    """Every source row became a record or was excluded with a reason code."""
    unaccounted = ev.canonical.index.counts.get("unexplained", 0)
    report.canonical_unexplained_rows = unaccounted
    if unaccounted:
        return [f"canonical_records: {unaccounted} source rows are not accounted for"]
    return []


def no_open_dead_letters(ev: Evidence, report: RuleReport) -> list[str]:
    """A chunk that failed for good means records are missing: the index's or the task table's."""
    canonical = ev.canonical
    dead = [f"dead letter open: chunk {d.chunk}: {d.error}" for d in canonical.dead_letters]
    code = canonical.index.code
    tasks = [ChunkTask("canonical_records", c.chunk, c.input, code) for c in canonical.entries]
    dead += [
        f"dead letter open: chunk {t.chunk_key}: {e}"
        for t, e in open_dead_letters(ev.catalog, tasks)
    ]
    report.dead_letters = len(set(dead))
    return list(dict.fromkeys(dead))


def member_count_matches(ev: Evidence, _report: RuleReport) -> list[str]:
    """The count a training run checks against is the table's."""
    stated = ev.manifest.members.count
    if ev.member_count != stated:
        return [f"members table has {ev.member_count} rows, manifest says {stated}"]
    return []


def record_ids_unique(ev: Evidence, report: RuleReport) -> list[str]:
    """One record id is one member, so it cannot sit in two splits. A child whose parent's ids
    held looks at the parts it adds first (``ids_check``)."""
    if ids_check.unique_over_parent(ev):
        report.duplicate_ids = 0
        ids_check.held(ev)
        return []
    duplicates = ev.rows(REPEATED_IDS)
    findings = []
    for rid, count, splits in duplicates:
        where = f" in splits {', '.join(splits)}" if len(splits) > 1 else ""
        findings.append(f"record_id {rid!r} appears {count} times in members{where}")
    report.duplicate_ids = len(duplicates)
    if not findings:
        ids_check.held(ev)
    return findings


def splits_known(ev: Evidence, _report: RuleReport) -> list[str]:
    """Training reads only the splits the splits layer assigns."""
    unknown = {s for (s,) in ev.rows("SELECT DISTINCT split FROM members")} - set(SPLITS)
    return [f"members with unknown split: {sorted(unknown)}"] if unknown else []


def sources_known(ev: Evidence, report: RuleReport) -> list[str]:
    """Every member comes from a source the freeze pinned."""
    frozen = {s.id for s in ev.freeze.sources}
    unknown = {s for (s,) in ev.rows("SELECT DISTINCT source_id FROM members")} - frozen
    report.unknown_sources = len(unknown)
    return [f"members from unknown sources: {sorted(unknown)}"] if unknown else []


def lineage_complete(ev: Evidence, report: RuleReport) -> list[str]:
    """Every member traces to a pinned object and the canonical row it came from."""
    shown, count = lineage_check.orphans(ev)
    report.orphan_ids = count
    report.lineage_completeness = _percent(ev.member_count - count, ev.member_count)
    return [f"member {rid!r} has no lineage to a pinned object row" for rid in shown]


def rows_explained(ev: Evidence, report: RuleReport) -> list[str]:
    """Each canonical row is a member, a removed duplicate, tombstoned or quarantined by a split
    conflict: nothing is lost."""
    counts = ev.dedup.counts
    removed = counts["removed"] + counts.get("tombstoned", 0) + len(ev.quarantined)
    records = ids_check.distinct_records(ev)  # over the parent's recorded count when it can
    unexplained = records - ev.member_count - removed
    report.unexplained_rows = unexplained
    if unexplained:
        return [f"{unexplained} canonical rows are neither members nor duplicates"]
    return []


def counts_add_up(ev: Evidence, report: RuleReport) -> list[str]:
    """No row vanishes: per source, records = members + duplicates removed + duplicate ids +
    id conflicts + tombstoned + split-quarantined, every term counted in its own layer's table
    (``accounting_check``); each chunk's account matches its tables; the manifest's totals are
    the tables'."""
    counts = accounting_check.per_source(ev)
    findings = accounting_check.source_findings(counts)
    findings += accounting_check.chunk_findings(ev)
    findings += accounting_check.manifest_findings(ev.manifest, counts)
    report.accounting_mismatches = len(findings)
    return findings[:SHOWN]


def dedup_invariants_hold(ev: Evidence, report: RuleReport) -> list[str]:
    """Dedup removed nothing without a member standing behind it, and no exact or verified
    near edge (through removed records too) joins two splits once quarantined records are
    out."""
    edges = ev.files.path(ev.dedup.output("edges")["digest"], "dedup edges")
    # ord: a row's clusters position (what the edges name), counted across parts
    clusters = ev.clusters(numbered=True)
    ev.con.execute(
        f"CREATE OR REPLACE VIEW dd_clusters AS SELECT *, file_row_number AS ord FROM {clusters}"
    )
    ev.con.execute(f"CREATE OR REPLACE VIEW dd_edges AS FROM read_parquet({sql_list([edges])})")
    dedup = DedupReport.parse(get_json(ev.cas, ev.dedup.output("report"), "dedup report"))
    threshold = float(dedup.near.lsh.threshold) if dedup.near is not None else 0.0
    register_dropped(ev.con, [*ev.quarantined, *ev.unlinked])
    removed, count = removed_without_member(ev.con, threshold, SHOWN)
    leaks = leaked_components(ev.con)
    report.dedup_invariant_violations = count
    report.leakage_group_split_violations = len(leaks)
    findings = removed + leaks
    return findings[:SHOWN]


def split_conflicts_resolved(ev: Evidence, report: RuleReport) -> list[str]:
    """A split conflict quarantined its bridging records: none of them is a member."""
    report.split_conflicts = ev.split_conflicts.num_rows
    report.split_quarantined = len(ev.quarantined)
    if not ev.quarantined:  # nothing to look for: no join with every member's id
        return []
    ids = pa.array(ev.quarantined, pa.string())
    ev.register("quarantined", pa.table({"record_id": ids, "ord": pa.array(range(len(ids)))}))
    found = ev.rows(
        "SELECT record_id FROM quarantined WHERE record_id IN (SELECT record_id FROM members) "
        "ORDER BY ord"
    )
    return [f"quarantined record {rid!r} is a member" for (rid,) in found]


def packing_invariants_hold(ev: Evidence, report: RuleReport) -> list[str]:
    """The spans are sound provenance: inside their blocks and shards, disjoint, covering the
    counted content, and only over train members (``packing_check``)."""
    packed = load_index(ev.cas, ev.manifest.layers["packed_blocks"], "packed_blocks")
    findings = packing_findings(ev.cas, packed, ev.con)
    report.packing_violations = len(findings)
    return findings


def no_tombstone_hits(ev: Evidence, report: RuleReport) -> list[str]:
    """No record revoked at or below the snapshot's watermark is a member."""
    watermark = ev.manifest.tombstone_seq
    reasons = _tombstone_reasons(ev, revoked_targets(ev.catalog, watermark))
    report.tombstone_hits = len(reasons)
    return [f"{reason} hits this snapshot" for reason in reasons]


def no_benchmark_hits(ev: Evidence, report: RuleReport) -> list[str]:
    """No benchmark item active at the snapshot's fence is a member."""
    with ev.catalog.begin() as conn:
        fence = ev.manifest.benchmark_seq
        items = [(row.benchmark, row.dedup_key) for row in active_items(conn, fence)]
    if not items:  # no item can be a member: no join with every member's key
        report.benchmark_hits = 0
        return []
    names, keys = zip(*items, strict=True)
    ev.register(
        "items",
        pa.table(
            {
                "benchmark": pa.array(names, pa.string()),
                "dedup_key": pa.array(keys, pa.string()),
                "ord": pa.array(range(len(items)), pa.int64()),
            }
        ),
    )
    found = ev.rows(
        "SELECT benchmark, dedup_key FROM items "
        "WHERE dedup_key IN (SELECT dedup_key FROM members) ORDER BY ord"
    )
    hits = [f"benchmark {name!r} item {key} is a member" for name, key in found]
    report.benchmark_hits = len(hits)
    return hits


def transform_image_is(current: str) -> ValidationRule:
    """The gate that the manifest's transform image is ``current``: otherwise a replay (and the
    canary) would not run the transform that built the snapshot."""

    def same_transform_image(ev: Evidence, _report: RuleReport) -> list[str]:
        recorded = ev.manifest.transform_image
        if recorded == current:
            return []
        same = recorded.partition("@")[0] == current.partition("@")[0]
        note = " (same tag, another digest)" if same else ""
        return [
            f"transform image {recorded} is not this code's {current}{note}: "
            "a replay would not run the manifest's transform"
        ]

    return same_transform_image


def canary_replays(replay: Replay) -> ValidationRule:
    """The gate that re-canonicalising the canary rows from their pinned objects with ``replay``
    gives exactly the rows the snapshot recorded for them (``records.canary``)."""

    def canary_reproduces(ev: Evidence, report: RuleReport) -> list[str]:
        ev.close()  # the replay re-canonicalises source rows: DuckDB's cache goes first
        chunks = canary_chunks(ev.canonical)
        for entry in ev.canonical.entries:  # the recorded side is read by path: whole first
            if entry.chunk in chunks:
                for piece in ev.canonical.descriptor(entry).parts():
                    ev.files.path(piece.records["digest"], entry.chunk)
        outcomes = replay(ev.canonical, ev.freeze, chunks)
        differ = [o for o in outcomes if o.replayed != o.recorded]
        report.canary_chunks = len(outcomes)
        report.canary_lines = sum(o.lines for o in outcomes)
        report.transform_replay_hash = json_digest({o.chunk: o.replayed for o in outcomes})
        report.set_difference = len(differ)
        return [
            f"canary replay of {o.chunk} (source lines 1-{o.lines}) gave {o.replayed}, the "
            f"snapshot recorded {o.recorded}: {o.difference}"
            for o in differ
        ]

    return canary_reproduces


def build_latency(ev: Evidence, report: RuleReport) -> list[str]:
    """Not a rule, a metric: seconds from the freeze to this validation."""
    with ev.catalog.begin() as conn:
        frozen_at = conn.scalar(
            select(freezes.c.created_at).where(freezes.c.partition_key == ev.manifest.partition)
        )
    report.build_latency_seconds = round(time.time() - frozen_at, 1) if frozen_at else None
    return []


def freeze_consistent(ev: Evidence, _report: RuleReport) -> list[str]:
    """What the freeze itself found inconsistent (a CDC offset gap, say): INCOMPLETE."""
    return list(ev.freeze.incomplete)


def no_late_changes(late_changes: LateChanges) -> ValidationRule:
    """The gate that no source event at or below a frozen watermark arrived after the freeze
    (``late_changes`` re-reads the change logs): otherwise the freeze was no boundary."""

    def nothing_arrived_late(ev: Evidence, _report: RuleReport) -> list[str]:
        return late_changes(ev.freeze)

    return nothing_arrived_late


def _tombstone_reasons(ev: Evidence, by_kind: dict[str, dict[str, str]]) -> list[str]:
    """The distinct reasons (sorted) members are revoked for: per member the first kind (in
    tombstone order) whose target it matches, as ``tombstone_matches`` decides."""
    if not by_kind:
        return []
    rows = [
        (rank, COLUMN[kind], target, reason)
        for rank, (kind, targets) in enumerate(by_kind.items())
        for target, reason in targets.items()
    ]
    names = ["rank", "col", "target", "reason"]
    ev.register("revoked", pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)}))
    hits = " UNION ALL ".join(
        f"SELECT m.file_row_number AS row, t.rank, t.reason FROM members m "
        f"JOIN revoked t ON t.col = '{column}' AND m.{column} = t.target"
        for column in sorted(set(COLUMN.values()))
    )
    found = ev.rows(
        f"SELECT DISTINCT arg_min(reason, rank) AS reason FROM ({hits}) GROUP BY row ORDER BY 1"
    )
    return [reason for (reason,) in found]


def canary_chunks(canonical: CanonicalIndex) -> list[str]:
    """The fixed canary subset: the first chunk of each source, in index order."""
    seen: dict[str, str] = {}
    for entry in canonical.entries:
        seen.setdefault(entry.chunk.split("/", 1)[0], entry.chunk)
    return list(seen.values())


def _coverage(freeze: FreezeSpec) -> dict[str, str]:
    """Per source, the share of its CDC offsets up to the watermark that the freeze holds."""
    coverage = {}
    for source in freeze.sources:
        if isinstance(source, ChangelogSourceSpec):
            span = source.watermark - source.start_lsn + 1
            missing = sum(hi - lo + 1 for lo, hi in source.gaps)
            coverage[source.id] = _percent(span - missing, span)
        else:
            coverage[source.id] = "100%"
    return coverage


def _percent(part: int, whole: int) -> str:
    return "100%" if whole == 0 else f"{100 * part / whole:.2f}%".replace(".00%", "%")
