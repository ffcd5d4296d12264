"""splits: each leakage component in one of train/validation/test, inherited from the parent.

The unit is the dedup layer's leakage component: records sharing a group id, an exact cluster or
a verified near-duplicate edge (even through a removed record) never straddle two splits. The
parent is the snapshot the freeze spec names (the alias's active snapshot when the partition
was frozen, the manifest's ``parents``); its ``splits`` table says where each old record is.
``splits.assign.assign`` keeps those, hashes components without a parent member by their
smallest ``dedup_key``, and lists every move (``split_moves``) and conflict
(``split_conflicts``). Records a conflict quarantines are in no split. Quarantining a bridge
can leave another path between two splits (a direct edge between old records, or one through a
removed duplicate): ``leakage_graph`` finds those on the graph without the quarantined records
and their smaller sides move (``split.residual_bridge``), listed too.
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from corpus_assets.core.governance import states
from corpus_assets.core.ingest.freeze import freeze
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layer_index import (
    LayerIndex,
    LayerResult,
    load_index,
    publish_index,
    read_layer_index,
)
from corpus_assets.core.runtime.snapshot_manifest import read_manifest
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import Ref, put_table
from corpus_assets.core.storage.cas_queries import (
    VerifiedFiles,
    cas_parquet,
    cas_parquets,
    put_query,
)
from corpus_assets.core.storage.memory import hand_back_duckdb
from corpus_assets.core.storage.table_lookup import TrustedFiles
from corpus_assets.core.tokens.cache import TokenCache, token_cache
from corpus_assets.core.tokens.spec import resolve_tokenizer
from corpus_assets.core.training_view import view_queries
from corpus_assets.core.training_view.row_tokens import load_position_tokens, load_row_tokens
from corpus_assets.core.training_view.splits.assign import SPLIT_TABLE, Assignment, Source, assign
from corpus_assets.core.training_view.splits.bridges import StoredGraph
from corpus_assets.core.training_view.splits.heldout import (
    FULL,
    INCREMENTAL,
    HeldoutScan,
    put_verified,
    reuse,
    spec_digest,
)
from corpus_assets.core.training_view.splits.heldout_resolve import resolve_heldout
from corpus_assets.core.training_view.splits.heldout_rows import (
    PAIR_COLUMNS,
    Represented,
    row_order,
)
from corpus_assets.core.training_view.splits.heldout_state import prior_search, rule_digest
from corpus_assets.core.training_view.splits.report import split_counts, split_report
from corpus_assets.core.training_view.splits.residual import resolve_residual
from corpus_assets.core.training_view.splits.schema import (
    EXCLUDED,
    SPLITS,
    TEST,
    TRAIN,
    UNLINKED,
    VALIDATION,
    conflict_table,
)
from corpus_assets.core.training_view.view_queries import RECORD_ORDER, SORT_LIMIT

__all__ = [
    "EXCLUDED",
    "SPLITS",
    "TEST",
    "TRAIN",
    "UNLINKED",
    "VALIDATION",
    "build_splits",
    "parent_splits",
]

CODE = stage_code("splits.inherited-components.v5", __name__)  # its closure, hashed at import
SPLIT_COLUMNS = pa.schema(
    [
        ("record_id", pa.string()),
        ("group_id", pa.string()),
        ("leakage_id", pa.string()),
        ("split", pa.string()),
    ]
)
_PREVIEW = 50  # rows of moves and conflicts shown as metadata tables
_STORED = ", ".join(SPLIT_COLUMNS.names)  # split_rows' columns the splits table holds


def parent_splits(ws: Workspace, parent: str | None) -> tuple[list[Ref], Source, int]:
    """The parent snapshot's splits index (as a parent ref), its record_id/split rows (a
    query over its Parquet table) and its evaluation version; nothing for a first build."""
    if parent is None:
        return [], SPLIT_TABLE.empty_table(), 0
    manifest = read_manifest(
        ws.cas, states.get(ws.catalog, parent).manifest_digest, "parent manifest"
    )
    ref = manifest.layers["splits"]
    index = load_index(ws.cas, ref, "splits")
    table = cas_parquet(ws.cas, index.output("splits"), "parent splits")
    rows = f"SELECT record_id, split FROM {table}"
    return [ref], rows, int(index.outputs.get("eval_version", 0))


def build_splits(ws: Workspace, partition_key: str) -> LayerResult:
    parents = freeze(ws, partition_key)[1].parents  # the manifest's parents, too
    parent = parents[0] if parents else None
    _, canonical = CanonicalIndex.read(ws, partition_key)
    tokens = token_cache(ws, canonical.chunks(), resolve_tokenizer(ws))
    # one DuckDB thread: every query here is a join, group-by or sort of every member, and each
    # thread fills its own buffers up to the cap (two raised a 1.1 GB build's peak by ~50 MB)
    with view_queries.spilling(ws.home, 1, view_queries.SPLITS_LIMIT) as con:
        built = _assign_and_report(ws, con, partition_key, parent, tokens)
    result, report = built.result, built.report
    counts = split_counts(report, result)
    counts["heldout_near_pairs"] = built.heldout_pairs[1]
    outputs = {
        "splits": built.splits,
        "split_moves": put_table(ws.cas, result.moves),
        "split_conflicts": put_table(ws.cas, conflict_table(result.conflicts)),
        "heldout_pairs": built.heldout_pairs[0],
        **built.verified,
        "parent": parent,
        "eval_version": result.eval_version,
        "tokenizer": tokens.spec.document(),
        "token_cache": tokens.refs(ws),
    }
    # a child's bytes depend on its parent's splits (named, not walked: ``LayerIndex.parents``);
    # the token counts on the tokenizer
    inputs = [built.dedup_ref, tokens.tokenizer_ref(ws)]
    digest = ws.config.policy_digest("splits")
    ref = publish_index(
        ws,
        partition_key,
        "splits",
        CODE,
        digest,
        inputs,
        outputs,
        counts,
        parents=built.parent_refs,
    )
    return LayerResult(
        layer="splits",
        digest=ref["digest"],
        counts=counts,
        preview=built.head.to_pylist(),
        digests={k: v["digest"] for k, v in outputs.items() if isinstance(v, dict)},
        details={
            "parent": parent,
            "split_report": report,
            "split_moves": result.moves.slice(0, _PREVIEW).to_pylist(),
            "split_conflicts": conflict_table(result.conflicts[:_PREVIEW]).to_pylist(),
            "heldout_search": built.heldout_stats,
        },
        run_stats=tokens.run_stats() | _heldout_work(built.heldout_stats),
    )


def _heldout_work(stats: dict[str, Any]) -> dict[str, int]:
    """What the held-out search did in this run (not part of the index: a child reusing its
    parent's Jaccards publishes the same bytes)."""
    return {
        "heldout_incremental": int(stats.get("mode") == INCREMENTAL),
        "heldout_state_reused": int(stats.get("state") == INCREMENTAL),
        "heldout_pairs_reused": int(stats.get("reused", 0)),
        "heldout_pairs_known": int(stats.get("known", 0)),
        "heldout_pairs_computed": int(stats.get("computed", 0)),
        "heldout_texts_fingerprinted": int(stats.get("fingerprinted", 0)),
    }


def _assign_and_report(
    ws: Workspace,
    con: duckdb.DuckDBPyConnection,
    partition_key: str,
    parent: str | None,
    tokens: TokenCache,
) -> "_Built":
    """Everything per record, in ``con``: the assignment, the splits table (stored) and the
    report. Only the conflicts, the moves and one row group of output are Python objects."""
    parent_refs, parent_rows, parent_version = parent_splits(ws, parent)
    _, canonical = CanonicalIndex.read(ws, partition_key)
    dedup_ref, dedup = read_layer_index(ws, partition_key, "dedup_clusters")
    clusters = view_queries.dedup_clusters(VerifiedFiles(ws.cas), dedup, numbered=True)
    edges = cas_parquet(ws.cas, dedup.output("edges"), "dedup edges", True)
    policy = ws.config.policies.splits
    members = _members(ws, partition_key, clusters, policy.time_cutoff is not None)
    graph = StoredGraph(con, clusters, edges)
    evidence = StoredEvidence(con, clusters)
    result = assign(members, parent_rows, policy, evidence, parent_version, graph, con)
    result = resolve_residual(result, graph)
    con.execute("DROP TABLE joined; DROP TABLE per")  # only ``assigned`` is read from here on
    hand_back_duckdb(con)  # ... so the held-out search does not sit on their pages
    pairs, stats, verified = _heldout(ws, partition_key, dedup, con, clusters, parent)
    result = resolve_heldout(result, pairs, clusters)
    # stored now, not held through the sort and the report (O(pairs): ~35 MB at 1.1 GB)
    heldout_pairs = (put_table(ws.cas, pairs), pairs.num_rows)
    del pairs
    files = TrustedFiles(ws.cas, ws.catalog)  # as the held-out scan reads them
    order = row_order(files, dedup, sum(c.count for c in canonical.chunks()))
    keys = "k.file_row_number AS pos" if order is not None else "k.object, k.line"
    con.execute(  # ``assigned`` keeps each member's (a representative's) clusters position
        "CREATE TABLE split_rows AS SELECT k.record_id, k.group_id, k.leakage_id, a.split, "
        f"k.source_id, {keys} "  # the report's (``split_report``)
        f"FROM {clusters} k JOIN assigned a ON k.file_row_number = a.pos"
    )
    stored, head = put_query(
        ws.cas,
        con,
        f"SELECT {_STORED} FROM split_rows ORDER BY record_id",
        SPLIT_COLUMNS,
        SORT_LIMIT,
    )
    if order is not None:  # token counts by clusters position: no records table read
        load_position_tokens(ws, con, tokens, order)
    else:
        load_row_tokens(ws, con, canonical, tokens)
    report = split_report(con, clusters, policy, by_position=order is not None)
    return _Built(
        dedup_ref, parent_refs, result, stored, head, report, heldout_pairs, stats, verified
    )


def _heldout(
    ws: Workspace,
    partition_key: str,
    dedup: LayerIndex,
    con: duckdb.DuckDBPyConnection,
    clusters: str,
    parent: str | None,
) -> tuple[pa.Table, dict[str, Any], dict[str, Any]]:
    """Near pairs of held-out members dedup missed (none without near-dedup), the counts with
    the reuse mode, and the outputs holding every pair verified and the search's state (a
    child searches only the pairs its new or changed records take part in, and takes the
    others from its parent's state; Jaccards the parent's search or dedup computed are taken
    from their tables)."""
    _, canonical = CanonicalIndex.read(ws, partition_key)
    scan = HeldoutScan.open(ws, canonical.chunks(), dedup)
    if scan is None:
        return PAIR_COLUMNS.empty_table(), {}, {}
    index, chunks = None, []
    if parent is not None:
        manifest = read_manifest(ws.cas, states.get(ws.catalog, parent).manifest_digest)
        index = load_index(ws.cas, manifest.layers["splits"], "splits")
        chunks = CanonicalIndex.load(ws.cas, manifest.layers["canonical_records"]).chunks()
    who = f"parent {parent}" if parent is not None else "parent snapshot"
    known = reuse(ws, dedup, scan.spec, (index, CODE, who))
    policy = ws.config.policy_digest("splits")
    prior, why = prior_search(ws, scan, (index, chunks, who), CODE, policy)
    records = Represented(clusters, "assigned")
    pairs, stats, state = scan.searched(con, records, known, prior=prior)
    verified = {
        "heldout_verified": put_verified(ws, con),
        "heldout_spec": spec_digest(scan.spec),
        "heldout_state": put_table(ws.cas, state),
        "heldout_rule": rule_digest(scan),
    }
    state_mode = {"state": INCREMENTAL if prior is not None else FULL, "state_reason": why}
    return pairs, {**known.details(), **state_mode, **stats}, verified


@dataclass(frozen=True)
class _Built:
    dedup_ref: Ref
    parent_refs: list[Ref]
    result: Assignment
    splits: Ref  # the stored splits table
    head: pa.Table  # its first rows
    report: list[dict[str, Any]]
    # the stored table of the near pairs of held-out members found before their resolution,
    # and its row count
    heldout_pairs: tuple[Ref, int]
    heldout_stats: dict[str, Any]
    verified: dict[str, Any]  # heldout_verified, _spec, _state and _rule (none without)


def _members(ws: Workspace, partition_key: str, clusters: str, timed: bool) -> str:
    """Kept records: record_id, component, content_key, (with a time cutoff) event_time and
    their position in ``clusters`` (read with file_row_number), which ``assigned`` keeps."""
    kept = (
        "SELECT k.record_id, k.leakage_id AS component, k.dedup_key AS content_key, "
        "{time} AS event_time, k.file_row_number AS pos FROM {clusters} k {join} "
        "WHERE k.is_representative"
    )
    if not timed:
        return kept.format(time="NULL::VARCHAR", clusters=clusters, join="")
    _, canonical = CanonicalIndex.read(ws, partition_key)
    refs = [chunk.records for chunk in canonical.chunks()]
    if not refs:
        return kept.format(time="NULL::VARCHAR", clusters=clusters, join="")
    times = cas_parquets(ws.cas, refs, "canonical records")
    join = f"LEFT JOIN (SELECT record_id, event_time FROM {times}) t ON k.record_id = t.record_id"
    return kept.format(time="t.event_time::VARCHAR", clusters=clusters, join=join)


class StoredEvidence(Mapping[str, str]):
    """Per leakage component, its dedup matches as ``record->match@jaccard`` (first three, in
    record order: ``RECORD_ORDER``), looked up only for the components a conflict names."""

    def __init__(self, con: duckdb.DuckDBPyConnection, clusters: str) -> None:
        self._con, self._clusters, self._ready = con, clusters, False

    def _table(self) -> str:
        if not self._ready:
            self._con.execute(
                "CREATE TABLE evidence AS SELECT * FROM (SELECT leakage_id, record_id, match_id, "
                "match_jaccard, row_number() OVER (PARTITION BY leakage_id "
                f"ORDER BY {RECORD_ORDER}) AS n FROM {self._clusters} WHERE match_id <> '') "
                "WHERE n <= 3"
            )
            self._ready = True
        return "evidence"

    def __getitem__(self, name: str) -> str:
        rows = self._con.execute(
            f"SELECT record_id, match_id, match_jaccard FROM {self._table()} "
            "WHERE leakage_id = ? ORDER BY n",
            [name],
        ).fetchall()
        if not rows:
            raise KeyError(name)
        return ", ".join(f"{r}->{m}@{j:.4f}" for r, m, j in rows)

    def __iter__(self) -> Iterator[str]:
        sql = f"SELECT DISTINCT leakage_id FROM {self._table()} ORDER BY leakage_id"
        return iter([row[0] for row in self._con.execute(sql).fetchall()])

    def __len__(self) -> int:
        sql = f"SELECT count(DISTINCT leakage_id) FROM {self._table()}"
        return int(self._con.execute(sql).fetchone()[0])
