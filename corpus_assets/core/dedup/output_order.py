"""The dedup table's row order without sorting its strings.

The clusters table is one part per canonical chunk, each sorted by record id, object, line and
row. Dedup already holds codes of the record ids that follow their byte order, so every row's
rank (the total order's last keys) and its position in the table are computed on integers
(object and line are fetched only for rows whose record id repeats, which are few). DuckDB then
only joins, writing the rows in any order with their position; the rows are bucketed into files
of half an output row group each and every bucket is sorted when it is read back. Memory holds one
bucket (twice while its sorted copy is made) beside the writer's row group and one input batch,
however large the partition: DuckDB's sort of the wide rows needed more than 128 MB at 677k
records and grew with them. The bucket's size moves no byte of the table.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from corpus_assets.core.dedup.order import code_dtype, place_ranks
from corpus_assets.core.dedup.partition_db import PartitionDb
from corpus_assets.core.dedup.row_values import RowValues
from corpus_assets.core.storage.cas_queries import streamed

BUCKET_ROWS = 1 << 15  # rows per bucket: half a row group of the pinned table


def _last(value: Any) -> tuple[int, Any]:
    """A sort key that puts None last, as DuckDB's ascending ORDER BY does."""
    return (1, 0) if value is None else (0, value)


class TablePositions:
    """Each row's position in the clusters table: chunk by chunk (each chunk's rows are one
    part), by rank within a chunk. Rows are in chunk order, so a chunk's positions are its
    rows' numbers; each chunk is sorted alone when asked for (the last one kept), so no array
    of every row's position is held (it was 4 bytes a record through the output phases), nor
    of every rank where ``rank`` reads them a slice at a time. ``chunk_starts`` None: one chunk
    (the rank is the position)."""

    def __init__(self, rank: RowValues, chunk_starts: np.ndarray | None) -> None:
        self.rank, self.dtype = rank, rank.dtype
        starts = [] if chunk_starts is None else np.asarray(chunk_starts).tolist()
        self.bounds = np.asarray([*starts, rank.n], dtype=np.int64)  # starts[0] is 0
        self.whole = len(self.bounds) <= 2  # one chunk: its ranks are its positions
        self._last: tuple[int, np.ndarray] = (-1, np.empty(0, dtype=self.dtype))

    def span(self, lo: int, hi: int) -> np.ndarray:
        """The positions of rows ``lo`` to ``hi - 1``."""
        if self.whole:
            return self.rank.span(lo, hi)
        out = np.empty(hi - lo, dtype=self.dtype)
        start, row = lo, lo
        chunk = int(np.searchsorted(self.bounds, lo, side="right")) - 1
        while row < hi:
            first, end = int(self.bounds[chunk]), min(hi, int(self.bounds[chunk + 1]))
            out[row - start : end - start] = self._chunk(chunk)[row - first : end - first]
            row, chunk = end, chunk + 1
        return out

    def of(self, rows: np.ndarray) -> np.ndarray:
        """The positions of ``rows`` (any order, repeats), each chunk sorted once."""
        rows = np.asarray(rows)
        if self.whole:
            return self.rank.of(rows)
        chunk = np.searchsorted(self.bounds, rows, side="right") - 1
        by = np.argsort(chunk, kind="stable")
        out = np.empty(len(rows), dtype=self.dtype)
        cuts = np.flatnonzero(np.diff(chunk[by])) + 1
        for part in np.split(by, cuts) if len(by) else []:
            c = int(chunk[part[0]])
            out[part] = self._chunk(c)[rows[part] - self.bounds[c]]
        return out

    def _chunk(self, chunk: int) -> np.ndarray:
        """Chunk ``chunk``'s positions by row."""
        if self._last[0] != chunk:
            self._last = (-1, self._last[1][:0])  # the last chunk's freed first
            lo, hi = int(self.bounds[chunk]), int(self.bounds[chunk + 1])
            by = np.argsort(self.rank.span(lo, hi), kind="stable")
            positions = place_ranks(np.empty(hi - lo, dtype=self.dtype), by)
            positions += positions.dtype.type(lo)
            self._last = (chunk, positions)
        return self._last[1]


def id_ranks(db: PartitionDb, id_codes: np.ndarray) -> np.ndarray:
    """Per row, its rank by record id, object, line, row: the stated total order's last keys.

    ``id_codes`` follow the record ids' byte order (nulls last); Python compares strings by code
    point, which is UTF-8's byte order, so the repeated ids' objects order as in DuckDB."""
    n = len(id_codes)
    if not n:
        return np.empty(0, dtype=code_dtype(0))
    tied = np.flatnonzero(np.bincount(id_codes)[id_codes] > 1)
    if len(tied):
        tie = np.zeros(n, dtype=code_dtype(n))
        where = db.object_lines(tied)
        ranked = sorted(
            tied.tolist(),
            key=lambda row: (_last(where[row][0]), _last(where[row][1]), row),
        )
        tie[np.asarray(ranked, dtype=np.int64)] = np.arange(len(ranked))
        by = np.lexsort((tie, id_codes))
        del tie
    else:  # the rows' own order breaks ties: a stable sort by id is the lexsort
        by = np.argsort(id_codes, kind="stable")
    return place_ranks(np.empty(n, dtype=code_dtype(n)), by)


def bucket(unsorted: Path, directory: Path, rows: int = BUCKET_ROWS) -> list[Path]:
    """Split a table with a ``pos`` column (a permutation of 0..n-1) into Arrow IPC files by
    ``pos // rows``, a batch at a time; the files in position order."""
    writers: dict[int, ipc.RecordBatchStreamWriter] = {}
    paths: dict[int, Path] = {}
    try:
        for batch in streamed(unsorted, rows):
            group = batch.column("pos").to_numpy() // rows
            by = np.argsort(group, kind="stable")
            cuts = np.flatnonzero(np.diff(group[by])) + 1
            for part in np.split(by, cuts) if len(by) else []:
                g = int(group[part[0]])
                if g not in writers:
                    paths[g] = directory / f"bucket-{g:08d}.arrow"
                    writers[g] = ipc.new_stream(str(paths[g]), batch.schema)
                writers[g].write_batch(batch.take(pa.array(part)))
    finally:
        for writer in writers.values():
            writer.close()
    return [paths[g] for g in sorted(paths)]


def sorted_batches(buckets: list[Path], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Each bucket read back, sorted by ``pos`` and cast to ``schema`` (without ``pos``), then
    deleted."""
    for path in buckets:
        with ipc.open_stream(str(path)) as reader:
            table = reader.read_all()
        path.unlink()
        table = table.take(pc.sort_indices(table.column("pos"))).drop_columns(["pos"])
        for batch in table.to_batches():
            yield pa.RecordBatch.from_arrays(
                [c.cast(f.type) for c, f in zip(batch.columns, schema, strict=True)],
                schema=schema,
            )
        del table
