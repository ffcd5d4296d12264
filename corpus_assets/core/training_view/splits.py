"""splits: each leakage component in one of train/validation/test, inherited from the parent.

The unit is the dedup layer's leakage component: records sharing a group id, an exact cluster or
a verified near-duplicate edge (even through a removed record) never straddle two splits. The
parent is the snapshot the freeze spec names (the alias's active snapshot when the partition
was frozen, the manifest's ``parents``); its ``splits`` table says where each old record is.
``split_assign.assign`` keeps those, hashes components without a parent member by their
smallest ``dedup_key``, and lists every move (``split_moves``) and conflict
(``split_conflicts``). Records a conflict quarantines are in no split and so no member.
"""

from dataclasses import asdict

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.governance import states
from corpus_assets.core.ingest.freeze import freeze
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layers import (
    LayerResult,
    load_index,
    publish_index,
    read_layer_index,
)
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import Ref, get_json, get_table, put_table
from corpus_assets.core.training_view.split_assign import (
    BRIDGE,
    EXCLUDED,
    SPLITS,
    TEST,
    TRAIN,
    VALIDATION,
    Assignment,
    Member,
    assign,
    split_of,
)

__all__ = [
    "EXCLUDED",
    "SPLITS",
    "TEST",
    "TRAIN",
    "VALIDATION",
    "build_splits",
    "parent_splits",
    "split_of",
]

CODE = stage_code("splits.inherited-components.v3", __name__)  # its closure, hashed at import
SPLIT_COLUMNS = pa.schema(
    [
        ("record_id", pa.string()),
        ("group_id", pa.string()),
        ("leakage_id", pa.string()),
        ("split", pa.string()),
    ]
)
MOVE_COLUMNS = pa.schema(
    [(c, pa.string()) for c in ("record_id", "from", "to", "reason", "evidence")]
)
CONFLICT_COLUMNS = pa.schema(
    [
        (c, pa.string())
        for c in (
            "component",
            "record_a",
            "split_a",
            "record_b",
            "split_b",
            "evidence",
            "resolution",
        )
    ]
)


def parent_splits(ws: Workspace, parent: str | None) -> tuple[list[Ref], dict[str, str]]:
    """The parent snapshot's splits index (as an input ref) and its record id -> split; nothing
    for a first build."""
    if parent is None:
        return [], {}
    manifest = get_json(ws.cas, states.get(ws.catalog, parent).manifest_digest, "parent manifest")
    ref = manifest["layers"]["splits"]
    table = get_table(ws.cas, load_index(ws.cas, ref, "splits").output("splits"), "parent splits")
    ids, splits = table.column("record_id").to_pylist(), table.column("split").to_pylist()
    return [ref], dict(zip(ids, splits, strict=True))


def build_splits(ws: Workspace, partition_key: str) -> LayerResult:
    parents = freeze(ws, partition_key)[1].parents  # the manifest's parents, too
    parent = parents[0] if parents else None
    parent_refs, parent_split = parent_splits(ws, parent)
    dedup_ref, dedup = read_layer_index(ws, partition_key, "dedup_clusters")
    clusters = get_table(ws.cas, dedup.output("clusters"), "dedup clusters")
    members = clusters.filter(clusters.column("is_representative")).sort_by("record_id")
    rows = members.select(["record_id", "leakage_id", "dedup_key"]).to_pylist()
    result = assign(
        [Member(r["record_id"], r["leakage_id"], r["dedup_key"]) for r in rows],
        parent_split,
        ws.config.policies.splits,
        _edge_evidence(clusters),
    )
    kept = members.filter(pc.is_in(members.column("record_id"), pa.array(list(result.split))))
    table = pa.Table.from_pydict(
        {
            "record_id": kept.column("record_id"),
            "group_id": kept.column("group_id"),
            "leakage_id": kept.column("leakage_id"),
            "split": [result.split[r] for r in kept.column("record_id").to_pylist()],
        },
        schema=SPLIT_COLUMNS,
    )
    outputs = {
        "splits": put_table(ws.cas, table),
        "split_moves": put_table(ws.cas, _moves_table(result)),
        "split_conflicts": put_table(ws.cas, _conflicts_table(result)),
        "parent": parent,
    }
    counts = split_counts(table, result, ws.config.policies.splits.model_dump())
    policy = ws.config.policy_digest("splits")
    inputs = [dedup_ref, *parent_refs]  # a child's bytes depend on its parent's splits
    ref = publish_index(ws, partition_key, "splits", CODE, policy, inputs, outputs, counts)
    return LayerResult(
        layer="splits",
        digest=ref["digest"],
        counts=counts,
        preview=table.slice(0, 10).to_pylist(),
        digests={k: v["digest"] for k, v in outputs.items() if isinstance(v, dict)},
        details={"parent": parent},
    )


def split_counts(table: pa.Table, result: Assignment, policy: dict) -> dict[str, int]:
    """Records and components per split, each split's deviation from its target in basis
    points of records, and the moves, conflicts and quarantined records."""
    assigned = table.column("split").to_pylist()
    components = dict(
        zip(table.column("leakage_id").to_pylist(), assigned, strict=True)
    )  # one split per component once resolved (a quarantined conflict: its last member's)
    counts = {name: assigned.count(name) for name in SPLITS}
    for name in SPLITS:
        counts[f"{name}_components"] = sum(1 for s in components.values() if s == name)
        share = counts[name] * 10000 // table.num_rows if table.num_rows else 0
        counts[f"{name}_deviation_bp"] = share - policy[f"{name}_percent"] * 100
    counts["records"] = table.num_rows
    counts["groups"] = len(set(table.column("group_id").to_pylist()))
    counts["leakage_groups"] = len(components)
    counts["moves"] = sum(1 for m in result.moves if m.reason != BRIDGE)
    counts["conflicts"] = len(result.conflicts)
    counts["excluded"] = len(result.excluded)
    return counts


def _edge_evidence(clusters: pa.Table) -> dict[str, str]:
    """Per leakage component, its dedup matches as ``record->match@jaccard`` (first three)."""
    matched = clusters.filter(pc.not_equal(clusters.column("match_id"), ""))
    out: dict[str, list[str]] = {}
    for row in matched.select(["record_id", "match_id", "match_jaccard", "leakage_id"]).to_pylist():
        out.setdefault(row["leakage_id"], []).append(
            f"{row['record_id']}->{row['match_id']}@{row['match_jaccard']:.4f}"
        )
    return {k: ", ".join(v[:3]) for k, v in out.items()}


def _moves_table(result: Assignment) -> pa.Table:
    rows = [(m.record_id, m.from_split, m.to_split, m.reason, m.evidence) for m in result.moves]
    return pa.Table.from_pylist(
        [dict(zip(MOVE_COLUMNS.names, r, strict=True)) for r in rows], schema=MOVE_COLUMNS
    )


def _conflicts_table(result: Assignment) -> pa.Table:
    return pa.Table.from_pylist([asdict(c) for c in result.conflicts], schema=CONFLICT_COLUMNS)
