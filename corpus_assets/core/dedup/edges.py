"""The dedup edges table: why records are joined, by record id (exact copy -> its key's
representative, then verified near pairs with their Jaccard), the input of the leakage graph.

The layer takes the ids from the clusters table as it is written (:class:`EdgeIds`: the rows in
output position order, each edge's rows at their positions; a part kept from the parent is read
for them), not from a scan of the records.
"""

from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa

from corpus_assets.core.dedup.clusters import output_query
from corpus_assets.core.dedup.output_order import TablePositions
from corpus_assets.core.dedup.partition_db import PartitionDb
from corpus_assets.core.dedup.verdicts import EdgeRows

EDGE_COLUMNS = pa.schema(
    [
        ("record_a", pa.string()),  # the later record in the total order
        ("record_b", pa.string()),
        ("kind", pa.string()),  # "exact" (same dedup key) or "near" (verified Jaccard)
        ("jaccard", pa.float64()),
    ]
)


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
        """Each edge's ends as table positions, the edges already in the table's order: by
        the ends' ranks, "exact" before "near" (sorted on ranks, not strings: an edge's rows
        are never excluded and the ids of rows not excluded are distinct, so ranks order them
        as their ids do), then the edges' own order. The rows and ranks are not kept."""
        count = len(rows.a)
        near = np.arange(count) >= rows.exact  # "exact" < "near"
        rank = positions.rank
        order = np.lexsort((near, rank.of(rows.b), rank.of(rows.a)))
        ends = positions.of(np.concatenate([rows.a, rows.b]))  # each chunk sorted once
        self.a, self.b = ends[:count][order], ends[count:][order]
        self.near = near[order]
        self.near_jaccard = rows.jaccard[order][self.near]
        named = np.zeros(rank.n, dtype=bool)  # a mask, not a sort of the edges' ends
        named[ends] = True
        self.wanted = np.flatnonzero(named).astype(rank.dtype)  # positions, ascending
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
        """The edges by record id, sorted (as :func:`edge_table`), once the table passed."""
        ids = pa.chunked_array(self.parts, pa.string()).combine_chunks()
        if len(ids) != len(self.wanted):
            raise ValueError(f"edge ids: {len(ids)} of {len(self.wanted)} rows passed")
        if not len(self.a):
            return EDGE_COLUMNS.empty_table()
        jaccard = np.ones(len(self.a))
        jaccard[self.near] = self.near_jaccard
        edges = pa.table(
            {
                "record_a": ids.take(pa.array(np.searchsorted(self.wanted, self.a))),
                "record_b": ids.take(pa.array(np.searchsorted(self.wanted, self.b))),
                "kind": pa.array(["exact", "near"], pa.string()).take(
                    pa.array(self.near.view(np.int8))
                ),
                "jaccard": jaccard,
            }
        )
        return edges.cast(EDGE_COLUMNS).combine_chunks()
