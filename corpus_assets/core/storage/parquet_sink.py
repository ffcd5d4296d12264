"""Parquet tables streamed into the store a row group at a time, with ``put_table``'s bytes.

The options are ``artifacts.PINNED_PARQUET`` (the one copy), its ``row_group_size`` apart as
``ROW_GROUP_ROWS``. The rule for equal bytes: ``pq.write_table`` cuts a table into row groups
of ``ROW_GROUP_ROWS`` rows and writes each in one ``write_table`` call, so a streamed writer must
write each row group in one call too; inside a row group the writer encodes a column in
mini-batches of 1024 values, so the group's chunk boundaries move page boundaries (bytes)
unless they fall at multiples of 1024 rows (or match the chunks of the table compared with).
Three entry points follow the rule each its own way, for their callers:

- :class:`TableWriter` (packed spans): equals ``put_table`` of ``Table.from_batches`` of the
  batches written - the same chunks, cut only at row-group ends.
- :func:`put_table_batches` (dedup clusters): equals ``put_table`` of the concatenation however
  it is chunked, as each group is rechunked to ``STEP`` (a multiple of 1024) rows.
- :func:`put_tables` (training view): equals ``put_table`` of the concatenation, each group
  combined into one contiguous table; it also returns the first ten rows.

Kept apart from ``artifacts`` on purpose: ``artifacts`` is in the import closure of most stages'
code identities (the token cache's among them, which the packed spans name), so a new writer
there would re-run them all without changing a byte they make.
"""

import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.storage.artifacts import (
    PARQUET,
    PINNED_PARQUET,
    Ref,
    make_ref,
    put_bytes,
    table_bytes,
)
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.fsio import FULL, DiskFullError, disk_full
from corpus_assets.core.storage.memory import release_memory

ROW_GROUP_ROWS: int = PINNED_PARQUET["row_group_size"]
STEP = 1 << 16  # rows per chunk of a row group: a multiple of the writer's 1024-value batches
HEAD_ROWS = 10


def _writer(sink: str | Path | BinaryIO, schema: pa.Schema) -> pq.ParquetWriter:
    """A writer with the pinned options; the row group size is given per ``write_table``."""
    options: dict[str, Any] = {k: v for k, v in PINNED_PARQUET.items() if k != "row_group_size"}
    return pq.ParquetWriter(sink, schema, **options)


def _write_groups(
    writer: pq.ParquetWriter, schema: pa.Schema, groups: Iterable[pa.Table], rows: int
) -> None:
    """Each group as one row group (one call); an empty table still gets one empty group."""
    wrote = False
    for group in groups:
        writer.write_table(group, row_group_size=rows)
        del group  # before the next group is built: one row group held at a time
        wrote = True
    if not wrote:
        writer.write_table(schema.empty_table(), row_group_size=rows)


def _temp(cas: ContentStore) -> Path:
    """A fresh file under the store's ``tmp`` (the same filesystem, so adopted by hard link)."""
    folder = cas.root / "tmp"
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    os.close(fd)
    return Path(name)


class TableWriter:
    """``put_table(Table.from_batches(batches))`` of the batches written, streamed to a file in
    the store: row groups of ``ROW_GROUP_ROWS`` rows are written as they fill, each a table of
    the same batch slices ``pq.write_table`` cuts from the whole, so at most one row group of
    batches is held. ``close`` adopts the file."""

    def __init__(self, cas: ContentStore, schema: pa.Schema) -> None:
        self._group_rows = ROW_GROUP_ROWS
        self._cas, self._schema = cas, schema
        self._path = _temp(cas)
        self._handle = self._path.open("wb")
        self._writer = _writer(self._handle, schema)
        self._pending: list[pa.RecordBatch] = []
        self._held = 0
        self._wrote = False
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self._pending.append(batch)
        self._held += batch.num_rows
        while self._held >= self._group_rows:
            self._write_group(self._group_rows)

    def write_table(self, table: pa.Table) -> None:
        """A whole table at once: ``pq.write_table``'s own row groups, nothing held."""
        if self._pending:
            raise ValueError("write_table after write: the row groups would differ")
        self._writer.write_table(table, row_group_size=self._group_rows)
        self._wrote = True
        self.rows += table.num_rows

    def _write_group(self, rows: int) -> None:
        taken, count = [], 0
        while self._pending and count < rows:
            batch = self._pending.pop(0)
            if count + batch.num_rows > rows:
                cut = rows - count
                self._pending.insert(0, batch.slice(cut))
                batch = batch.slice(0, cut)
            taken.append(batch)
            count += batch.num_rows
        table = pa.Table.from_batches(taken, self._schema)
        self._writer.write_table(table, row_group_size=self._group_rows)
        self._wrote = True
        self._held -= count
        self.rows += count

    def close(self) -> Ref:
        """Write the last (or only, maybe empty) row group and put the file in the store."""
        try:
            if self._held or not self._wrote:
                self._write_group(self._held)
            self._writer.close()
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()
        except BaseException:
            self.abort()
            raise
        digest, size = self._cas.adopt_file(self._path)
        return make_ref(digest, PARQUET, size)

    def abort(self) -> None:
        """Drop the partial file (a build that failed part-way leaves nothing behind)."""
        try:
            self._writer.close()
        finally:
            self._handle.close()
        self._path.unlink(missing_ok=True)


def put_table_batches(
    cas: ContentStore,
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    tmp: Path,
    row_group_rows: int = ROW_GROUP_ROWS,
) -> Ref:
    """``put_table`` of the batches' concatenation (any chunking), holding one row group."""
    tmp.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="table-", suffix=".parquet", dir=tmp)
    os.close(fd)
    path = Path(name)
    try:
        write_table_batches(path, schema, batches, row_group_rows)
        size = path.stat().st_size
        digest, _ = cas.adopt_file(path)
    finally:
        path.unlink(missing_ok=True)
    return make_ref(digest, PARQUET, size)


def write_table_batches(
    path: Path,
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    row_group_rows: int = ROW_GROUP_ROWS,
    step: int = STEP,
) -> None:
    """The Parquet file of the batches' concatenation at ``path``, fsynced."""
    with _writer(path, schema) as writer:
        groups = _row_groups(batches, schema, row_group_rows, step)
        _write_groups(writer, schema, groups, row_group_rows)
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _row_groups(
    batches: Iterable[pa.RecordBatch], schema: pa.Schema, rows: int, step: int
) -> Iterator[pa.Table]:
    """Tables of exactly ``rows`` rows (the last may be shorter), as chunks of ``step`` rows
    (kept, never combined into one more copy of the row group)."""
    step = step if rows % step == 0 else rows
    group: list[pa.RecordBatch] = []
    for chunk in _rechunked(batches, schema, step):
        group.append(chunk)
        if len(group) * step == rows:
            yield pa.Table.from_batches(group, schema)
            group = []
    if group:
        yield pa.Table.from_batches(group, schema)


def _rechunked(
    batches: Iterable[pa.RecordBatch], schema: pa.Schema, step: int
) -> Iterator[pa.RecordBatch]:
    """The batches as batches of exactly ``step`` rows (the last may be shorter)."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        pending.append(batch)
        count += batch.num_rows
        while count >= step:
            table = pa.Table.from_batches(pending, schema)
            if len(pending) == 1 and batch.num_rows == step:
                yield batch
            else:
                yield table.slice(0, step).combine_chunks().to_batches()[0]
            rest = table.slice(step)
            pending, count = rest.to_batches(), rest.num_rows
    if count:
        yield pa.Table.from_batches(pending, schema).combine_chunks().to_batches()[0]


def put_tables(
    cas: ContentStore, parts: Iterable[pa.RecordBatch | pa.Table], schema: pa.Schema
) -> tuple[Ref, pa.Table]:
    """``parts`` in order (cast to ``schema``), stored as ``put_table`` would store their
    concatenation, each row group combined into one contiguous table, and the first ten rows.
    Only one row group of rows is in memory at a time; the file is written under the store's
    ``tmp`` and adopted (an in-memory sink held the whole encoded table, twice when read out)."""
    heads: list[pa.Table] = []
    path = _temp(cas)  # a file, not a buffer: the encoded table is never held in memory
    try:
        with path.open("wb") as handle:
            with _writer(handle, schema) as writer:
                _write_groups(writer, schema, _contiguous(parts, schema, heads), ROW_GROUP_ROWS)
            handle.flush()
            os.fsync(handle.fileno())
        release_memory()
        if not heads:
            return put_bytes(cas, table_bytes(schema.empty_table()), PARQUET), schema.empty_table()
        digest, size = cas.adopt_file(path)
    except OSError as error:
        if error.errno in FULL and not isinstance(error, DiskFullError):
            raise disk_full(error, str(path)) from None
        raise
    finally:
        path.unlink(missing_ok=True)
    return make_ref(digest, PARQUET, size), heads[0]


def _contiguous(
    parts: Iterable[pa.RecordBatch | pa.Table], schema: pa.Schema, heads: list[pa.Table]
) -> Iterator[pa.Table]:
    """Row groups of ``ROW_GROUP_ROWS`` rows (the last may be shorter), each contiguous; the
    first group's head goes to ``heads``."""
    group = _Group(schema)
    for part in parts:
        group.add(_table(part).cast(schema))
        while group.rows >= ROW_GROUP_ROWS:
            table, rest = group.take(ROW_GROUP_ROWS)
            heads[:] = heads or [_head(table)]
            yield table
            del table
            group = _Group(schema)
            group.add(rest)
    if group.rows:
        table, _ = group.take(group.rows)
        heads[:] = heads or [_head(table)]
        yield table


class _Group:
    """The rows of one row group so far, as per-column chunk lists."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema, self.rows = schema, 0
        self.columns: list[list[pa.Array]] = [[] for _ in schema]

    def add(self, table: pa.Table) -> None:
        for chunks, column in zip(self.columns, table.columns, strict=True):
            chunks.extend(column.chunks)
        self.rows += table.num_rows

    def take(self, rows: int) -> tuple[pa.Table, pa.Table]:
        """The first ``rows`` rows as one contiguous table (each column combined, its chunks
        then dropped, so one column is held twice at most) and the rest."""
        arrays, rests = [], []
        for i, field in enumerate(self.schema):
            column = pa.chunked_array(self.columns[i], field.type)
            self.columns[i] = []
            arrays.append(column.slice(0, rows).combine_chunks())
            rests.append(column.slice(rows))
            del column
        return pa.table(arrays, schema=self.schema), pa.table(rests, schema=self.schema)


def _head(group: pa.Table) -> pa.Table:
    """The first ten rows, copied (a slice would keep the whole group's buffers alive)."""
    return group.take(pa.array(range(min(HEAD_ROWS, group.num_rows)), pa.int64()))


def _table(part: pa.RecordBatch | pa.Table) -> pa.Table:
    return pa.Table.from_batches([part]) if isinstance(part, pa.RecordBatch) else part
