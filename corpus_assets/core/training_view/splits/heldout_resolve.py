"""Resolving what the held-out search found: a union of (leakage component, split) sides that
a pair joins across splits has its smaller sides moved to its largest (``split.heldout_near``,
ties by split order: the ``move_smaller`` resolution), each move listed with the pair."""

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.training_view.leakage_graph import component_labels
from corpus_assets.core.training_view.splits.assign import Assignment
from corpus_assets.core.training_view.splits.conflicts import largest_side
from corpus_assets.core.training_view.splits.heldout_rows import searched_records
from corpus_assets.core.training_view.splits.residual import with_moves
from corpus_assets.core.training_view.splits.schema import HELDOUT, Move


def resolve_heldout(result: Assignment, pairs: pa.Table, clusters: str) -> Assignment:
    """Move the smaller sides of every union of (leakage component, split) that a found pair
    joins across splits; ``clusters`` is the dedup clusters relation over ``result.con``.

    The unions are components over integer node numbers (DuckDB numbers the (leakage, split)
    sides in sorted order, scipy joins them): memory is a few integers per pair, and only the
    pairs that span two splits and the unions they touch become Python objects."""
    cross = pc.not_equal(pairs["split_a"], pairs["split_b"])
    if not pc.any(cross).as_py():
        return result  # no pair spans two splits (the rows are not made Python objects)
    con = result.con
    nodes, a, b = _numbered(con, pairs, clusters)
    labels = component_labels(len(nodes), a, b)
    splits = pc.dictionary_encode(nodes["split"].combine_chunks()).indices.to_numpy(
        zero_copy_only=False
    )
    sides = np.unique(np.stack([labels, splits]), axis=1)[0]  # one entry per (union, split)
    spanning = np.unique(sides[np.r_[False, sides[1:] == sides[:-1]]])
    why: dict[int, list[str]] = {}
    for i in np.flatnonzero(cross.to_numpy(zero_copy_only=False)):
        p = pairs.slice(int(i), 1).to_pylist()[0]
        text = f"{p['record_a']}~{p['record_b']}@{p['jaccard']:.4f}"
        why.setdefault(int(labels[a[i]]), []).append(text)
    moves: list[Move] = []
    smallest = np.unique(labels, return_index=True)[1]  # labels are 0..k-1: its first node
    for label in sorted(spanning, key=lambda x: smallest[x]):  # unions in their nodes' order
        members = pa.array(np.flatnonzero(labels == label))
        union = list(
            zip(
                nodes["leakage_id"].take(members).to_pylist(),
                nodes["split"].take(members).to_pylist(),
                strict=True,
            )
        )
        moves += _move_union(con, clusters, union, "; ".join(why.get(int(label), [])))
    return with_moves(result, moves, [])


def _numbered(
    con: duckdb.DuckDBPyConnection, pairs: pa.Table, clusters: str
) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """The (leakage_id, split) sides the pairs' records stand on, numbered in sorted order, and
    each pair's two side numbers (in the pairs' order)."""
    numbered = pairs.select(["record_a", "record_b"]).append_column(
        "i", pa.array(np.arange(len(pairs), dtype=np.int64))
    )
    con.register("ho_pairs", numbered)
    try:
        con.execute(
            "CREATE OR REPLACE TEMP TABLE ho_nodes AS SELECT r.record_id, r.leakage_id, r.split, "
            "dense_rank() OVER (ORDER BY r.leakage_id, r.split) - 1 AS node FROM "
            f"({searched_records(clusters, 'assigned')}) r WHERE r.record_id IN "
            "(SELECT record_a FROM ho_pairs UNION SELECT record_b FROM ho_pairs)"
        )
        coded = con.execute(
            "SELECT na.node AS a, nb.node AS b FROM ho_pairs p "
            "JOIN ho_nodes na ON na.record_id = p.record_a "
            "JOIN ho_nodes nb ON nb.record_id = p.record_b ORDER BY p.i"
        ).fetchnumpy()
        nodes = con.sql(
            "SELECT DISTINCT node, leakage_id, split FROM ho_nodes ORDER BY node"
        ).to_arrow_table()
    finally:
        con.unregister("ho_pairs")
        con.execute("DROP TABLE IF EXISTS ho_nodes")
    a, b = (np.asarray(coded[k], dtype=np.int64) for k in ("a", "b"))
    if len(a) != len(pairs):
        raise ValueError(
            f"held-out pairs name {len(pairs) - len(a)} record(s) the searched records lack"
        )
    return nodes, a, b


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
