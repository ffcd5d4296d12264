"""The dedup edges table: why records are joined, by record id (exact copy -> its key's
representative, then verified near pairs with their Jaccard), the input of the leakage graph.

The layer takes the ids from the clusters table as it is written (:class:`EdgeIds`: the rows in
output position order, each edge's rows at their positions; a part kept from the parent is read
for them), not from a scan of the records.
"""

from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from corpus_assets.core.dedup.clusters import Decided, output_query
from corpus_assets.core.dedup.output_order import TablePositions
from corpus_assets.core.dedup.partition_db import PartitionDb

EDGE_COLUMNS = pa.schema(
    [
        ("record_a", pa.string()),  # the later record in the total order
        ("record_b", pa.string()),
        ("kind", pa.string()),  # "exact" (same dedup key) or "near" (verified Jaccard)
        ("jaccard", pa.float64()),
    ]
)


class EdgeRows(NamedTuple):
    """The edges table by row: exact (copy -> its key's representative), then verified near."""

    a: np.ndarray
    b: np.ndarray
    exact: int  # the first ``exact`` edges are exact
    jaccard: np.ndarray


# The ids of the rows the edges name, gathered in one scan of the records (joining ``recs``
# twice scanned it twice: 0.47-0.63 against 0.33-0.36 CPU-s for 150k edges at 685k records).
_EDGES_SQL = """
WITH ids AS MATERIALIZED (
  SELECT row, record_id FROM recs WHERE row IN (SELECT a FROM edges UNION SELECT b FROM edges)
)
SELECT a.record_id AS record_a, b.record_id AS record_b, e.kind, e.jaccard, e.seq
FROM edges e JOIN ids a ON a.row = e.a JOIN ids b ON b.row = e.b
"""
# Sorted by Arrow (byte order, as DuckDB's default collation): DuckDB only joins.
_EDGE_ORDER = [(name, "ascending") for name in ("record_a", "record_b", "kind", "seq")]


def edge_rows(decided: Decided) -> EdgeRows:
    """Exact (copy -> its key's representative) and verified near edges, by row."""
    copies = decided.copies
    return EdgeRows(
        np.concatenate([copies, decided.near_x]),
        np.concatenate([decided.state.match(copies), decided.near_y]),
        len(copies),
        np.concatenate([np.ones(len(copies)), decided.near_j]),
    )


def _kinds(rows: EdgeRows) -> pa.Array:
    kinds = np.repeat(["exact", "near"], [rows.exact, len(rows.a) - rows.exact])
    return pa.array(kinds, pa.string())


def edge_table(db: PartitionDb, rows: EdgeRows) -> pa.Table:
    """The edges by record id, sorted."""
    edges = pa.table(
        {
            "a": rows.a,
            "b": rows.b,
            "kind": _kinds(rows),
            "jaccard": rows.jaccard,
            "seq": np.arange(len(rows.a), dtype=np.int64),
        }
    )
    db.register("edges", edges)
    try:
        batches = output_query(db, lambda: list(db.batches(_EDGES_SQL)))
    finally:
        db.unregister("edges")
    db.flush()
    if not batches:
        return EDGE_COLUMNS.empty_table()
    return _sorted(pa.Table.from_batches(batches))


def _sorted(table: pa.Table) -> pa.Table:
    table = table.sort_by(_EDGE_ORDER).drop_columns(["seq"])
    return table.cast(EDGE_COLUMNS).combine_chunks()


class EdgeIds:
    """The record ids of the rows edges name, gathered from the clusters table's batches as
    they are written (``tap``): its rows are in output position order, so a row's id is at its
    position. Holds the ids of the named rows only, as the edges table does."""

    def __init__(self, rows: EdgeRows, positions: TablePositions) -> None:
        self.rows = rows
        ends = positions.of(np.concatenate([rows.a, rows.b]))  # each chunk sorted once
        self.a, self.b = ends[: len(rows.a)], ends[len(rows.a) :]
        self.rank_a, self.rank_b = positions.rank[rows.a], positions.rank[rows.b]
        named = np.zeros(len(positions.rank), dtype=bool)  # a mask, not a sort of the ends
        named[ends] = True
        self.wanted = np.flatnonzero(named)  # positions, ascending
        self.parts: list[pa.Array] = []
        self.seen = 0  # rows of the table passed

    def tap(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches`` unchanged, the wanted ids taken from each as it passes."""
        for batch in batches:
            lo, hi = np.searchsorted(self.wanted, [self.seen, self.seen + len(batch)])
            if hi > lo:
                at = pa.array(self.wanted[lo:hi] - self.seen)
                self.parts.append(batch.column("record_id").take(at))
            self.seen += len(batch)
            yield batch

    def pass_part(self, rows: int, ids: Callable[[], Iterator[pa.RecordBatch]]) -> None:
        """The next ``rows`` table rows are a part not written in this run: the wanted ids
        among them read from ``ids()`` (its record ids in order), if any is wanted."""
        lo, hi = np.searchsorted(self.wanted, [self.seen, self.seen + rows])
        if hi == lo:
            self.seen += rows
            return
        start = self.seen
        for _ in self.tap(ids()):
            pass
        if self.seen != start + rows:
            raise ValueError(f"dedup clusters part: {self.seen - start} rows, it says {rows}")

    def wanted_in(self, start: int, rows: int) -> np.ndarray:
        """The wanted positions among table rows ``[start, start + rows)``, ascending."""
        lo, hi = np.searchsorted(self.wanted, [start, start + rows])
        return self.wanted[lo:hi]

    def given(self, rows: int, ids: pa.Array) -> None:
        """The next ``rows`` table rows were written elsewhere (a task on the runner), which
        read ``ids``: the record ids at their wanted positions (``wanted_in``), in order."""
        expected = len(self.wanted_in(self.seen, rows))
        if len(ids) != expected:
            raise ValueError(f"edge ids: {len(ids)} of {expected} wanted rows given")
        if len(ids):
            self.parts.append(ids)
        self.seen += rows

    def table(self) -> pa.Table:
        """The edges by record id, sorted (as :func:`edge_table`), once the table passed.
        Sorted on ranks, not strings: an edge's rows are never excluded and the ids of rows
        not excluded are distinct, so ranks order them as their ids do."""
        ids = pa.chunked_array(self.parts, pa.string()).combine_chunks()
        if len(ids) != len(self.wanted):
            raise ValueError(f"edge ids: {len(ids)} of {len(self.wanted)} rows passed")
        if not len(self.rows.a):
            return EDGE_COLUMNS.empty_table()
        near = np.arange(len(self.rows.a)) >= self.rows.exact  # "exact" < "near"
        order = np.lexsort((near, self.rank_b, self.rank_a))  # stable: edges' order last
        at = pa.array(np.searchsorted(self.wanted, self.a[order]))
        bt = pa.array(np.searchsorted(self.wanted, self.b[order]))
        kinds = pa.array(["exact", "near"], pa.string()).take(pa.array(near[order].view(np.int8)))
        edges = pa.table(
            {
                "record_a": ids.take(at),
                "record_b": ids.take(bt),
                "kind": kinds,
                "jaccard": self.rows.jaccard[order],
            }
        )
        return edges.cast(EDGE_COLUMNS).combine_chunks()
