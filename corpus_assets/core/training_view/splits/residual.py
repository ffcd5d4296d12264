"""The residual rule: after quarantine, no path may still join two splits.

Only the components a quarantine resolved are looked at: elsewhere the graph is the dedup
layer's own, whose components ``assign`` already placed whole.

Quarantining the bridging newcomers leaves old records linked directly (an edge between two
old records, or one through an old removed duplicate) where they were. On the leakage graph
without the quarantined and unlinked records, every component still holding members of two
splits has its smaller sides moved to the largest (``split.residual_bridge``), listed as moves
and as a conflict resolved ``move_smaller``.
"""

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.training_view.leakage_graph import (
    components,
    dropped_with_copies,
    straddling,
)
from corpus_assets.core.training_view.splits.assign import Assignment
from corpus_assets.core.training_view.splits.bridges import AnyGraph
from corpus_assets.core.training_view.splits.conflicts import largest_side
from corpus_assets.core.training_view.splits.schema import RESIDUAL, Conflict, Move, move_table


def resolve_residual(result: Assignment, graph: AnyGraph) -> Assignment:
    """Move the smaller sides of every component still spanning two splits once the
    quarantined records (and the duplicates behind them) are gone."""
    dropped_ids = result.excluded + result.unlinked
    if not dropped_ids:  # the graph is the dedup layer's: one split per component already
        return result
    quarantined = [c.component for c in result.conflicts if c.resolution == "quarantine_new"]
    graph = graph.within(pa.array(sorted(set(quarantined)), pa.string()))
    clusters = graph.clusters
    dropped = dropped_with_copies(clusters, dropped_ids)
    component_of = components(clusters, graph.edges, dropped)
    split_of = result.splits_of(component_of["record_id"])
    wide = straddling(component_of, split_of)
    if not len(wide):
        return result
    placed = component_of.join(split_of, "record_id", join_type="inner").sort_by("record_id")
    leakage = clusters.select(["record_id", "leakage_id"])
    moves: list[Move] = []
    conflicts: list[Conflict] = []
    for component in pc.unique(wide["component"]).to_pylist():
        rows = placed.filter(pc.equal(placed["component"], component))
        sides: dict[str, list[str]] = {}
        for rid, split in zip(
            rows["record_id"].to_pylist(), rows["split"].to_pylist(), strict=True
        ):
            sides.setdefault(split, []).append(rid)
        order = largest_side(sides)
        first = sides[order[0]][0]
        name = leakage.filter(pc.equal(leakage["record_id"], first))["leakage_id"][0].as_py()
        why = f"leakage {name}; still joined after quarantine"
        for other in order[1:]:
            conflicts.append(
                Conflict(name, first, order[0], sides[other][0], other, why, "move_smaller")
            )
            moves += [Move(rid, other, order[0], RESIDUAL, why) for rid in sides[other]]
    return with_moves(result, moves, conflicts)


def with_moves(result: Assignment, moves: list[Move], conflicts: list[Conflict]) -> Assignment:
    """The moves applied to ``result``'s members in its database (``result`` sees them too)."""
    moved = move_table(moves)
    result.con.register("residual_moves", moved)
    result.con.execute(
        'UPDATE assigned SET split = m.target FROM (SELECT record_id, first("to") AS target '
        "FROM residual_moves GROUP BY record_id) m WHERE assigned.record_id = m.record_id"
    )
    result.con.unregister("residual_moves")
    return Assignment(
        result.con,
        pa.concat_tables([result.moves, moved]).sort_by("record_id"),
        sorted([*result.conflicts, *conflicts], key=lambda c: c.component),
        result.eval_version,
    )
