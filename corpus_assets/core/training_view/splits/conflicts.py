"""Resolving split conflicts: components whose parent members sit in more than one split.

Few by nature (a conflict needs a new edge between two splits), so each is resolved in Python,
in component order, under ``policies.splits.on_conflict``. The side a component resolves to is
the split holding most parent members, ties by split order. ``quarantine_new`` excludes exactly
the newcomers whose region bridges two splits (``splits.bridges``); the others join the one
split they touch and parent members stay put. Without a bridging newcomer (an edge between two
old records) and under ``move_smaller`` the smaller sides move to the largest.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.runtime.config import SplitPolicy
from corpus_assets.core.training_view.splits.bridges import AnyGraph, bridge_regions
from corpus_assets.core.training_view.splits.schema import (
    BRIDGE,
    BRIDGE_COPY,
    EXCLUDED,
    MOVED,
    SPLIT_TABLE,
    SPLITS,
    UNLINKED,
    Conflict,
    Move,
)


@dataclass(frozen=True)
class Resolution:
    policy: SplitPolicy
    evidence: Mapping[str, str]
    graph: AnyGraph | None  # needed by quarantine_new


@dataclass
class _Out:
    split: dict[str, str] = field(default_factory=dict)
    moves: list[Move] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)


def resolve_conflicts(
    conflicted: pa.Table, parent: pa.Table, how: Resolution
) -> tuple[pa.Table, list[Move], list[Conflict]]:
    """Members (record_id, split) of the conflicted components, their moves and conflicts."""
    out = _Out()
    rows = conflicted.select(["component", "record_id", "parent_split"]).to_pylist()
    by_component: dict[str, list[tuple[str, str | None]]] = {}
    for row in rows:
        by_component.setdefault(row["component"], []).append(
            (row["record_id"], row["parent_split"])
        )
    for name in sorted(by_component):
        _resolve_component(out, name, sorted(by_component[name]), parent, how)
    table = pa.table({"record_id": list(out.split), "split": list(out.split.values())})
    return table.cast(SPLIT_TABLE), out.moves, out.conflicts


def largest_side(sides: Mapping[str, list[str]]) -> list[str]:
    """Splits by parent members, most first; ties by split order."""
    return sorted(sides, key=lambda s: (-len(sides[s]), SPLITS.index(s) if s in SPLITS else 9, s))


def _resolve_component(
    out: _Out, name: str, group: list[tuple[str, str | None]], parent: pa.Table, how: Resolution
) -> None:
    sides: dict[str, list[str]] = {}
    for rid, before in group:
        if before is not None:
            sides.setdefault(before, []).append(rid)
    order = largest_side(sides)
    regions = _regions(name, parent, how)
    bridges = regions.filter(pc.is_null(regions["split"])) if regions is not None else None
    quarantine = bridges is not None and len(bridges) > 0
    evidence = how.evidence.get(name, "")
    resolution = "quarantine_new" if quarantine else "move_smaller"
    for other in order[1:]:
        out.conflicts.append(
            Conflict(
                name, sides[order[0]][0], order[0], sides[other][0], other, evidence, resolution
            )
        )
    why = f"leakage {name}; {evidence}"
    if quarantine:
        _quarantine(out, group, regions, why)
        return
    for rid, before in group:
        if before is not None and before != order[0]:
            out.moves.append(Move(rid, before, order[0], MOVED, why))
        out.split[rid] = order[0]


def _regions(name: str, parent: pa.Table, how: Resolution) -> pa.Table | None:
    if how.policy.on_conflict != "quarantine_new":
        return None
    if how.graph is None:
        raise ValueError("on_conflict quarantine_new needs the leakage graph to find bridges")
    return bridge_regions(how.graph.component(name), parent)


def _quarantine(
    out: _Out, group: list[tuple[str, str | None]], regions: pa.Table, why: str
) -> None:
    """Parent members stay; newcomers join their region's split or, bridging, are excluded."""
    region_split = dict(
        zip(regions["record_id"].to_pylist(), regions["split"].to_pylist(), strict=True)
    )
    kept = dict(
        zip(regions["record_id"].to_pylist(), regions["is_representative"].to_pylist(), strict=True)
    )
    for rid, before in group:
        target = before if before is not None else region_split.get(rid)
        if target is None:
            out.moves.append(Move(rid, "", EXCLUDED, BRIDGE, why))
        else:
            out.split[rid] = target
    for rid, split in sorted(region_split.items()):
        if split is None and not kept[rid]:
            out.moves.append(Move(rid, "", UNLINKED, BRIDGE_COPY, why))
