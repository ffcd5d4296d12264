"""Resolving what the held-out search found: a union of (leakage component, split) sides that
a pair joins across splits has its smaller sides moved to its largest (``split.heldout_near``,
ties by split order: the ``move_smaller`` resolution), each move listed with the pair."""

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.training_view.split_assign import Assignment
from corpus_assets.core.training_view.split_conflicts import largest_side
from corpus_assets.core.training_view.split_heldout import searched_records
from corpus_assets.core.training_view.split_residual import with_moves
from corpus_assets.core.training_view.splits_schema import HELDOUT, Move


def resolve_heldout(result: Assignment, pairs: pa.Table, clusters: str) -> Assignment:
    """Move the smaller sides of every union of (leakage component, split) that a found pair
    joins across splits; ``clusters`` is the dedup clusters relation over ``result.con``."""
    if not pc.any(pc.not_equal(pairs["split_a"], pairs["split_b"])).as_py():
        return result  # no pair spans two splits (the rows are not made Python objects)
    rows = pairs.to_pylist()
    con = result.con
    con.register("ho_pairs", pairs)
    nodes = con.execute(
        "SELECT r.record_id, r.leakage_id, r.split FROM "
        f"({searched_records(clusters, 'assigned')}) r WHERE r.record_id IN "
        "(SELECT record_a FROM ho_pairs UNION SELECT record_b FROM ho_pairs) ORDER BY record_id"
    ).fetchall()
    con.unregister("ho_pairs")
    node_of = {rid: (lid, split) for rid, lid, split in nodes}
    parent = {node: node for node in node_of.values()}

    def find(x: tuple[str, str]) -> tuple[str, str]:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for pair in rows:
        ra, rb = find(node_of[pair["record_a"]]), find(node_of[pair["record_b"]])
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    unions: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for node in sorted(parent):
        unions.setdefault(find(node), []).append(node)
    why: dict[tuple[str, str], list[str]] = {}
    for p in rows:
        if p["split_a"] != p["split_b"]:
            text = f"{p['record_a']}~{p['record_b']}@{p['jaccard']:.4f}"
            why.setdefault(find(node_of[p["record_a"]]), []).append(text)
    moves: list[Move] = []
    for root, union in unions.items():
        if len({split for _, split in union}) > 1:
            moves += _move_union(con, clusters, union, "; ".join(why.get(root, [])))
    return with_moves(result, moves, [])


def _move_union(
    con: duckdb.DuckDBPyConnection, clusters: str, union: list[tuple[str, str]], pairs: str
) -> list[Move]:
    """The moves of the union's smaller sides to its largest (its members by split)."""
    sides: dict[str, list[str]] = {}
    for lid, split in union:
        ids = con.execute(
            f"SELECT k.record_id FROM {clusters} k JOIN assigned a USING (record_id) "
            "WHERE k.is_representative AND k.leakage_id = ? AND a.split = ? ORDER BY record_id",
            [lid, split],
        ).fetchall()
        sides.setdefault(split, []).extend(rid for (rid,) in ids)
    order = largest_side({s: sorted(ids) for s, ids in sides.items()})
    name = min(lid for lid, _ in union)
    text = f"leakage {name}; held-out near pair {pairs}"
    return [
        Move(rid, other, order[0], HELDOUT, text) for other in order[1:] for rid in sides[other]
    ]
