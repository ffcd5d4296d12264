"""splits: each leakage component in one of train/validation/test, inherited from the parent.

The unit is the dedup layer's leakage component: records sharing a group id, an exact cluster or
a verified near-duplicate edge (even through a removed record) never straddle two splits. The
parent is the snapshot the freeze spec names (the alias's active snapshot when the partition
was frozen, the manifest's ``parents``); its ``splits`` table says where each old record is.
``split_assign.assign`` keeps those, hashes components without a parent member by their
smallest ``dedup_key``, and lists every move (``split_moves``) and conflict
(``split_conflicts``). Records a conflict quarantines are in no split. Quarantining a bridge
can leave another path between two splits (a direct edge between old records, or one through a
removed duplicate): ``leakage_graph`` finds those on the graph without the quarantined records
and their smaller sides move (``split.residual_bridge``), listed too.
"""

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.governance import states
from corpus_assets.core.ingest.freeze import freeze
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layers import (
    LayerResult,
    load_index,
    publish_index,
    read_layer_index,
)
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import Ref, get_json, get_table, put_table
from corpus_assets.core.tokens.cache import token_cache, token_counts
from corpus_assets.core.tokens.spec import resolve_tokenizer
from corpus_assets.core.training_view.split_assign import SPLIT_TABLE, Assignment, assign
from corpus_assets.core.training_view.split_bridges import LeakageGraph
from corpus_assets.core.training_view.split_report import split_counts, split_report
from corpus_assets.core.training_view.split_residual import resolve_residual
from corpus_assets.core.training_view.splits_schema import (
    EXCLUDED,
    SPLITS,
    TEST,
    TRAIN,
    UNLINKED,
    VALIDATION,
    conflict_table,
)

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


def parent_splits(ws: Workspace, parent: str | None) -> tuple[list[Ref], pa.Table, int]:
    """The parent snapshot's splits index (as an input ref), its record_id/split table and its
    evaluation version; nothing for a first build."""
    if parent is None:
        return [], SPLIT_TABLE.empty_table(), 0
    manifest = get_json(ws.cas, states.get(ws.catalog, parent).manifest_digest, "parent manifest")
    ref = manifest["layers"]["splits"]
    index = load_index(ws.cas, ref, "splits")
    table = get_table(ws.cas, index.output("splits"), "parent splits")
    return [ref], table.select(["record_id", "split"]), int(index.outputs.get("eval_version", 0))


def build_splits(ws: Workspace, partition_key: str) -> LayerResult:
    parents = freeze(ws, partition_key)[1].parents  # the manifest's parents, too
    parent = parents[0] if parents else None
    parent_refs, parent_table, parent_version = parent_splits(ws, parent)
    dedup_ref, dedup = read_layer_index(ws, partition_key, "dedup_clusters")
    clusters = get_table(ws.cas, dedup.output("clusters"), "dedup clusters")
    edges = get_table(ws.cas, dedup.output("edges"), "dedup edges")
    policy = ws.config.policies.splits
    members = _members(ws, partition_key, clusters, policy.time_cutoff is not None)
    evidence = _edge_evidence(clusters)
    graph = LeakageGraph(clusters, edges)
    result = assign(members, parent_table, policy, evidence, parent_version, graph)
    result = resolve_residual(result, graph)
    table = _split_table(clusters, result)
    _, canonical = CanonicalIndex.read(ws, partition_key)
    tokens = token_cache(ws, canonical.chunks(), resolve_tokenizer(ws))
    outputs = {
        "splits": put_table(ws.cas, table),
        "split_moves": put_table(ws.cas, result.moves),
        "split_conflicts": put_table(ws.cas, conflict_table(result.conflicts)),
        "parent": parent,
        "eval_version": result.eval_version,
        "tokenizer": tokens.spec.document(),
        "token_cache": tokens.refs(ws),
    }
    kept_tokens = (
        clusters.filter(clusters["is_representative"])
        .select(["record_id", "object", "line"])
        .join(token_counts(ws, canonical.chunks(), tokens), ["record_id", "object", "line"])
    )
    report = split_report(table, clusters, policy, kept_tokens)
    counts = split_counts(report, result)
    # a child's bytes depend on its parent's splits; the token counts on the tokenizer
    inputs = [dedup_ref, *parent_refs, tokens.tokenizer_ref(ws)]
    digest = ws.config.policy_digest("splits")
    ref = publish_index(ws, partition_key, "splits", CODE, digest, inputs, outputs, counts)
    return LayerResult(
        layer="splits",
        digest=ref["digest"],
        counts=counts,
        preview=table.slice(0, 10).to_pylist(),
        digests={k: v["digest"] for k, v in outputs.items() if isinstance(v, dict)},
        details={
            "parent": parent,
            "split_report": report,
            "split_moves": result.moves.slice(0, _PREVIEW).to_pylist(),
            "split_conflicts": conflict_table(result.conflicts[:_PREVIEW]).to_pylist(),
        },
        run_stats=tokens.run_stats(),
    )


def _members(ws: Workspace, partition_key: str, clusters: pa.Table, timed: bool) -> pa.Table:
    """Kept records: record_id, component, content_key and (with a time cutoff) event_time."""
    kept = clusters.filter(clusters["is_representative"])
    members = pa.table(
        {
            "record_id": kept["record_id"],
            "component": kept["leakage_id"],
            "content_key": kept["dedup_key"],
        }
    )
    if not timed:
        return members.append_column("event_time", pa.nulls(len(members), pa.string()))
    times = _event_times(ws, partition_key)
    return members.join(times, "record_id", join_type="left outer")


def _event_times(ws: Workspace, partition_key: str) -> pa.Table:
    _, canonical = CanonicalIndex.read(ws, partition_key)
    parts = [chunk.table(ws.cas, ["record_id", "event_time"]) for chunk in canonical.chunks()]
    schema = pa.schema([("record_id", pa.string()), ("event_time", pa.string())])
    return pa.concat_tables(parts).cast(schema) if parts else schema.empty_table()


def _split_table(clusters: pa.Table, result: Assignment) -> pa.Table:
    """record_id, group_id, leakage_id, split of every member, by record_id."""
    kept = clusters.filter(clusters["is_representative"]).select(
        ["record_id", "group_id", "leakage_id"]
    )
    table = kept.join(result.table, "record_id", join_type="inner").sort_by("record_id")
    return table.select(SPLIT_COLUMNS.names).cast(SPLIT_COLUMNS)


def _edge_evidence(clusters: pa.Table) -> dict[str, str]:
    """Per leakage component, its dedup matches as ``record->match@jaccard`` (first three)."""
    matched = clusters.filter(pc.not_equal(clusters.column("match_id"), ""))
    out: dict[str, list[str]] = {}
    for row in matched.select(["record_id", "match_id", "match_jaccard", "leakage_id"]).to_pylist():
        out.setdefault(row["leakage_id"], []).append(
            f"{row['record_id']}->{row['match_id']}@{row['match_jaccard']:.4f}"
        )
    return {k: ", ".join(v[:3]) for k, v in out.items()}
