"""DuckDB for the training view's per-record joins, group-bys and sorts: out of core.

A layer's per-record state (its members, their splits, token counts) lives in an in-memory
DuckDB database capped at ``MEMORY_LIMIT`` that spills to a directory under the data home's
``tmp``, so the Python process holds only batches and the small tables of conflicts and moves.
Parquet inputs are read straight from the CAS once verified. ``put_query`` writes a query's rows
as the same Parquet bytes ``storage.artifacts.put_table`` writes for the whole table, one row
group at a time.
"""

import io
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.storage.artifacts import PARQUET, Ref, put_bytes, table_bytes
from corpus_assets.core.storage.cas import ContentStore

MEMORY_LIMIT = "128MB"  # DuckDB's own buffers; beyond it joins and sorts spill to disk
ROW_GROUP = 1 << 20  # artifacts.table_bytes's row_group_size: one group is built at a time
_BATCH = 1 << 16
_WRITER = {  # artifacts.table_bytes's byte-affecting options
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": True,
    "write_statistics": False,
    "data_page_version": "2.0",
    "version": "2.6",
    "store_schema": True,
}


def connect(spill: Path | None = None, threads: int = 2) -> duckdb.DuckDBPyConnection:
    """An in-memory database capped at ``MEMORY_LIMIT``; it spills to ``spill`` when given."""
    config: dict[str, str | int | bool] = {
        "memory_limit": MEMORY_LIMIT,
        "threads": max(1, threads),
        # True: with False a streamed ORDER BY result comes back in parallel-sorted runs
        "preserve_insertion_order": True,
    }
    if spill is not None:
        config["temp_directory"] = str(spill)
    return duckdb.connect(config=config)


@contextmanager
def spilling(home: Path, threads: int) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection spilling to a fresh directory under ``home/tmp``, removed afterwards."""
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    spill = Path(tempfile.mkdtemp(prefix="duckdb-", dir=home / "tmp"))
    con = connect(spill, threads)
    try:
        yield con
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)


def cas_parquet(cas: ContentStore, ref: Ref, what: str, numbered: bool = False) -> str:
    """``read_parquet`` of a verified CAS table (with ``file_row_number`` when ``numbered``)."""
    cas.verify(ref["digest"], what)
    path = str(cas.path(ref["digest"])).replace("'", "''")
    return f"read_parquet('{path}'{', file_row_number = true' if numbered else ''})"


def cas_parquets(cas: ContentStore, refs: list[Ref], what: str, numbered: bool = False) -> str:
    """``read_parquet`` of several verified CAS tables, in order (``file_row_number`` and
    ``filename`` columns when ``numbered``)."""
    paths = []
    for ref in refs:
        cas.verify(ref["digest"], what)
        paths.append("'" + str(cas.path(ref["digest"])).replace("'", "''") + "'")
    extra = ", file_row_number = true, filename = true" if numbered else ""
    return f"read_parquet([{', '.join(paths)}]{extra})"


def batches(con: duckdb.DuckDBPyConnection, sql: str, rows: int = _BATCH) -> pa.RecordBatchReader:
    return con.sql(sql).to_arrow_reader(rows)


def put_query(
    cas: ContentStore, con: duckdb.DuckDBPyConnection, sql: str, schema: pa.Schema
) -> tuple[Ref, pa.Table]:
    """The rows of ``sql`` (in its ORDER BY) as ``put_table`` would store them, and the first
    ten rows. Only one row group of rows is in memory at a time."""
    return put_tables(cas, batches(con, sql), schema)


def put_tables(
    cas: ContentStore, parts: Iterable[pa.RecordBatch | pa.Table], schema: pa.Schema
) -> tuple[Ref, pa.Table]:
    """``parts`` in order, stored as ``put_table`` would store their concatenation (row groups
    of ``ROW_GROUP`` rows, each written as one contiguous table: chunk boundaries inside a
    group can move page boundaries, so bytes), and the first ten rows."""
    sink, writer, head = io.BytesIO(), None, None
    group = _Group(schema)
    for part in parts:
        group.add(_table(part).cast(schema))
        while group.rows >= ROW_GROUP:
            table, rest = group.take(ROW_GROUP)
            writer = _write(writer, sink, schema, table)
            head = head if head is not None else _head(table)
            del table
            group = _Group(schema)
            group.add(rest)
    if writer is None and not group.rows:
        return put_bytes(cas, table_bytes(schema.empty_table()), PARQUET), schema.empty_table()
    if group.rows:
        table, _ = group.take(group.rows)
        writer = _write(writer, sink, schema, table)
        head = head if head is not None else _head(table)
        del table
    assert writer is not None and head is not None
    writer.close()
    pa.default_memory_pool().release_unused()
    return put_bytes(cas, sink.getvalue(), PARQUET), head


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
    return group.take(pa.array(range(min(10, group.num_rows)), pa.int64()))


def _table(part: pa.RecordBatch | pa.Table) -> pa.Table:
    return pa.Table.from_batches([part]) if isinstance(part, pa.RecordBatch) else part


def _write(
    writer: pq.ParquetWriter | None, sink: io.BytesIO, schema: pa.Schema, group: pa.Table
) -> pq.ParquetWriter:
    writer = writer or pq.ParquetWriter(sink, schema, **_WRITER)
    writer.write_table(group, row_group_size=ROW_GROUP)
    return writer
