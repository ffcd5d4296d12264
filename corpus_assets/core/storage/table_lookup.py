"""A few rows of a large CAS table without reading the table: lookups for lineage queries.

Pinned tables are written without Parquet statistics (``PINNED_PARQUET``: they would be bytes
that do not depend on the rows alone), so a reader's predicate pushdown cannot skip row groups.
Most per-record tables are sorted by their key (members, dedup clusters and splits by record id,
packed spans by block, mixed samples by position, canonical chunks by line), so
:func:`sorted_rows` binary-searches the row groups itself: each probe decodes one row group's key
column, and only the groups whose key range holds a wanted value are read, with only the columns
asked for. A column the table is not sorted by is scanned a batch at a time
(:func:`matching_rows`): memory holds one batch and the matches, never the table.
"""

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import VerifiedFiles, streamed
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.trust import StatTrust

SCAN_BATCH = 1 << 16  # rows decoded at a time by a scan


class TrustedFiles(VerifiedFiles):
    """``VerifiedFiles`` that skips re-hashing a file the catalog records as unchanged since it
    last hashed right (``StatTrust``), and records the ones it hashes: an inspection command run
    again does not re-read every table it touches."""

    def __init__(self, cas: ContentStore, catalog: Catalog | None) -> None:
        super().__init__(cas)
        self.trust = StatTrust(cas, catalog) if catalog is not None else None

    def path(self, digest: str, what: str = "table") -> str:
        if digest not in self.verified and self.trust is not None:
            self.trust.verify_all({digest: what})
            self.verified.add(digest)
        return super().path(digest, what)


class SortedTable:
    """One Parquet file sorted ascending by ``key`` (nulls never looked up); each row group's
    first and last key are decoded once, on the first probe that needs them."""

    def __init__(self, path: str, key: str) -> None:
        self.file = pq.ParquetFile(path)
        self.key = key
        self._bounds: dict[int, tuple[Any, Any]] = {}

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> "SortedTable":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def bounds(self, group: int) -> tuple[Any, Any]:
        if group not in self._bounds:
            keys = self.file.read_row_group(group, columns=[self.key]).column(0)
            valid = keys.drop_null()
            self._bounds[group] = (valid[0].as_py(), valid[-1].as_py()) if len(valid) else (None,)
        return self._bounds[group]

    def groups(self, low: Any, high: Any) -> list[int]:
        """Row groups that may hold a key in [low, high]: a contiguous run found by bisection on
        the groups' last keys (a group of null keys only is skipped)."""
        lo, hi = 0, self.file.num_row_groups
        while lo < hi:
            mid = (lo + hi) // 2
            last = self.bounds(mid)[-1]
            if last is not None and last < low:
                lo = mid + 1
            else:
                hi = mid
        found = []
        for group in range(lo, self.file.num_row_groups):
            first = self.bounds(group)[0]
            if first is not None and first > high:
                break
            found.append(group)
        return found

    def rows(self, values: Iterable[Any], columns: Sequence[str]) -> pa.Table:
        """Rows whose key is one of ``values``, only ``columns`` (plus the key), in file order."""
        wanted = sorted(set(values))
        groups = sorted({g for v in wanted for g in self.groups(v, v)})
        value_set = pa.array(wanted, self.file.schema_arrow.field(self.key).type)
        return self._read(groups, columns, lambda keys: pc.is_in(keys, value_set=value_set))

    def between(self, low: Any, high: Any, columns: Sequence[str]) -> pa.Table:
        """Rows with ``low <= key <= high``, only ``columns`` (plus the key), in file order."""
        return self._read(
            self.groups(low, high),
            columns,
            lambda keys: pc.and_(pc.greater_equal(keys, low), pc.less_equal(keys, high)),
        )

    def _read(self, groups: list[int], columns: Sequence[str], keep: Any) -> pa.Table:
        present = set(self.file.schema_arrow.names)  # an older table may lack a column
        names = [n for n in dict.fromkeys([self.key, *columns]) if n in present]
        parts = []
        for group in groups:
            table = self.file.read_row_group(group, columns=names)
            parts.append(table.filter(keep(table.column(self.key))))
        if not parts:
            return self.file.schema_arrow.empty_table().select(names)
        return pa.concat_tables(parts)


def sorted_rows(path: str, key: str, values: Iterable[Any], columns: Sequence[str]) -> pa.Table:
    """``SortedTable(path, key).rows(values, columns)`` for one lookup."""
    with SortedTable(path, key) as table:
        return table.rows(values, columns)


def matching_rows(
    path: str, column: str, values: Iterable[Any], columns: Sequence[str]
) -> pa.Table:
    """Rows whose ``column`` is one of ``values`` in a table not sorted by it (see ``scan``)."""
    wanted = sorted(set(values))

    def keep(batch: pa.RecordBatch) -> pa.Array:
        value_set = pa.array(wanted, batch.schema.field(column).type)
        return pc.is_in(batch.column(column), value_set=value_set)

    return scan(path, [column, *columns], keep)


def scan(path: str, columns: Sequence[str], keep: Callable[[pa.RecordBatch], pa.Array]) -> pa.Table:
    """The rows where ``keep(batch)`` holds, only ``columns``, in file order: ``SCAN_BATCH``
    rows decoded at a time, so memory holds one batch and the matches."""
    names = list(dict.fromkeys(columns))
    empty = pq.read_schema(path).empty_table().select(names)
    parts = [
        pa.Table.from_batches([batch]).filter(keep(batch))
        for batch in streamed(path, SCAN_BATCH, names)
    ]
    return pa.concat_tables([empty, *parts]).combine_chunks()


def rows_at(path: str, column: str, rows: np.ndarray) -> pa.ChunkedArray:
    """``column`` at positions ``rows`` of a Parquet file, in their order, reading only the row
    groups that hold one (each once when ``rows`` ascend), a group at a time: memory holds one
    group's column and the values taken (a chunk's whole column, read and then taken, was
    ~70 MB under the held-out search's peak at 1.1 GB)."""
    rows = np.asarray(rows, dtype=np.int64)
    with pq.ParquetFile(path, pre_buffer=False) as parquet:
        meta = parquet.metadata
        ends = np.cumsum([meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
        group_of = np.searchsorted(ends, rows, side="right")
        bounds = np.flatnonzero(np.r_[True, group_of[1:] != group_of[:-1], True]).tolist()
        parts = []
        for lo, hi in itertools.pairwise(bounds if len(rows) else []):
            group = int(group_of[lo])
            values = parquet.read_row_group(group, [column], use_threads=False).column(0)
            first = int(ends[group]) - meta.row_group(group).num_rows
            parts += values.take(pa.array(rows[lo:hi] - first)).chunks
        kind = parquet.schema_arrow.field(column).type
    return pa.chunked_array(parts, kind)
