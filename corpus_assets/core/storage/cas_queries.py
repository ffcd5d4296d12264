"""DuckDB over the CAS's Parquet files, out of core: the one way a stage opens a connection.

Dedup, the training view and publication join, group and sort tables of every record; in Arrow
or Python that holds whole columns. DuckDB runs those queries with its buffers capped at a
memory limit (each caller states its own) and spills beyond it to a private directory under the
data home's ``tmp``, removed on close. Inputs are read straight from their CAS files once
re-hashed (:class:`VerifiedFiles`), so no unverified byte reaches a result.

``import duckdb`` happens where a connection is made: a command that runs no query (the release
CLI's read-only commands) never loads it.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.storage.artifacts import Ref
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.parquet_sink import put_tables

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

BATCH_ROWS = 1 << 16  # rows per streamed result batch
# Rows per row group of a sorted result's file: DuckDB's Parquet writer buffers one row group
# inside the memory cap (at the default 122,880 rows the members' join ran out of 128 MB).
SORTED_GROUP_ROWS = 8192


def connect(
    memory_limit: str,
    threads: int = 2,
    spill: Path | None = None,
    *,
    preserve_insertion_order: bool = True,
    flush: tuple[str, str] | None = None,
) -> DuckDBPyConnection:
    """An in-memory database capped at ``memory_limit``, spilling to ``spill`` when given.

    ``preserve_insertion_order`` True: with False a streamed ORDER BY result comes back in
    parallel-sorted runs. ``flush``, the allocator's (flush, bulk-deallocation flush) thresholds,
    hands freed memory back to the system sooner than DuckDB's defaults (128 MB / 512 MB)."""
    import duckdb

    config: dict[str, str | int | bool] = {
        "memory_limit": memory_limit,
        "threads": max(1, threads),
        "preserve_insertion_order": preserve_insertion_order,
    }
    if spill is not None:
        config["temp_directory"] = str(spill)
    if flush is not None:
        config["allocator_flush_threshold"] = flush[0]
        config["allocator_bulk_deallocation_flush_threshold"] = flush[1]
    return duckdb.connect(config=config)


@contextmanager
def registered(con: DuckDBPyConnection, name: str, table: pa.Table) -> Iterator[str]:
    """``table`` as the relation ``name`` on ``con`` within the block, unregistered after."""
    con.register(name, table)
    try:
        yield name
    finally:
        con.unregister(name)


class Spilling:
    """A :func:`connect` connection (``.con``) spilling to a fresh directory under ``tmp`` (the
    data home's), which ``close`` removes; as a context manager it gives the connection."""

    def __init__(
        self,
        tmp: Path,
        memory_limit: str,
        threads: int = 2,
        *,
        preserve_insertion_order: bool = True,
        flush: tuple[str, str] | None = None,
    ) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix="duckdb-", dir=tmp))
        try:
            self.con = connect(
                memory_limit,
                threads,
                self.dir / "spill",
                preserve_insertion_order=preserve_insertion_order,
                flush=flush,
            )
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def close(self) -> None:
        self.con.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> DuckDBPyConnection:
        return self.con

    def __exit__(self, *exc: object) -> None:
        self.close()


class VerifiedFiles:
    """Local paths of CAS objects, each re-hashed once before it is handed out."""

    def __init__(self, cas: ContentStore, verified: Iterable[str] = ()) -> None:
        self.cas = cas
        self.verified = set(verified)

    def path(self, digest: str, what: str = "table") -> str:
        """The object's file, after a streamed re-hash (CasError if missing or corrupt)."""
        if digest not in self.verified:
            self.cas.verify(digest, what)
            self.verified.add(digest)
        return str(self.cas.path(digest))

    def paths(self, digests: Iterable[str], what: str = "table") -> list[str]:
        return [self.path(d, what) for d in digests]


def sql_list(paths: list[str]) -> str:
    """A SQL list literal of file paths (for ``read_parquet``); paths are CAS paths, but quote."""
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"


PART_ROWS_BITS = 40  # a part's rows below 2**40: ``ordered_parts`` numbers rows part-major


def ordered_parts(paths: list[str], numbered: bool = False) -> str:
    """A relation over the Parquet ``paths`` read as one table, in order (one scan); with
    ``numbered``, its ``file_row_number`` column is each row's place in that concatenation
    (part-major, increasing, as for one file: the scan's ``file_index`` above its own row
    number), not its place within its own file. The members' parts are listed in order: a
    typical part first (``typical_first``) made the +1% child's check slower (3.06 -> 3.33
    CPU-s at 1.1 GB of raw text, three interleaved runs), unlike the clusters'."""
    if not numbered:
        return f"SELECT * FROM read_parquet({sql_list(paths)})"
    return (
        f"SELECT * REPLACE (file_row_number + (file_index::BIGINT << {PART_ROWS_BITS}) "
        f"AS file_row_number) FROM read_parquet({sql_list(paths)}, file_row_number = true)"
    )


def typical_first(counts: Sequence[int]) -> list[int]:
    """The parts' numbers with a typical one first, the others in order. DuckDB estimates a
    scan of several files as the first file's rows times the files: a first chunk of 189 rows
    made 685k look like 4k, and hash joins built on the larger side. The typical part's rows
    times the parts are nearest the table's by ratio (chunk sizes are skewed: the part nearest
    the mean can be far off)."""
    total, parts = sum(counts), len(counts)

    def off(n: int) -> float:
        return abs(math.log(counts[n] * parts / total)) if counts[n] else math.inf

    first = min(range(parts), key=lambda n: (off(n), n)) if total else 0
    return [first, *(n for n in range(parts) if n != first)]


def sql_literal(text: str) -> str:
    """A SQL string literal of ``text`` (quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


def sql_path(path: str) -> str:
    """A SQL string literal of one file path."""
    return sql_literal(path)


def cas_parquet(cas: ContentStore, ref: Ref, what: str, numbered: bool = False) -> str:
    """``read_parquet`` of a verified CAS table (with ``file_row_number`` when ``numbered``)."""
    path = VerifiedFiles(cas).path(ref["digest"], what)
    return f"read_parquet({sql_path(path)}{', file_row_number = true' if numbered else ''})"


def cas_parquets(cas: ContentStore, refs: list[Ref], what: str, numbered: bool = False) -> str:
    """``read_parquet`` of several verified CAS tables, in order (``file_row_number`` and
    ``filename`` columns when ``numbered``)."""
    paths = VerifiedFiles(cas).paths([ref["digest"] for ref in refs], what)
    extra = ", file_row_number = true, filename = true" if numbered else ""
    return f"read_parquet({sql_list(paths)}{extra})"


def batches(con: DuckDBPyConnection, sql: str, rows: int = BATCH_ROWS) -> pa.RecordBatchReader:
    return con.sql(sql).to_arrow_reader(rows)


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is DuckDB running out of its memory cap: raised by a statement, or by
    the reader of a streamed result (:func:`batches`), where Arrow hands DuckDB's message on as
    an ``OSError``."""
    import duckdb

    if isinstance(error, duckdb.OutOfMemoryException):
        return True
    return isinstance(error, OSError) and str(error).startswith("Out of Memory Error")


def sorted_batches(
    con: DuckDBPyConnection, sql: str, folder: Path, rows: int = BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """The rows of ``sql`` in its ORDER BY, through an uncompressed Parquet file in ``folder``
    (removed after): a wide sort of every record streamed straight from DuckDB held ~150 MB
    beyond its cap while the rows were fetched (the members of 1.1 GB of raw text: the
    manifest layer's peak, 548 MB); the file is read back a row group at a time."""
    yield from sorted_rows(sorted_file(con, sql, folder), rows)


def sorted_file(con: DuckDBPyConnection, sql: str, folder: Path) -> Path:
    """The rows of ``sql`` in its ORDER BY written by DuckDB to a new uncompressed Parquet
    file in ``folder``, for :func:`sorted_rows` (so the tables the sort read can be dropped
    before the rows are read back)."""
    fd, name = tempfile.mkstemp(prefix="sorted-", suffix=".parquet", dir=folder)
    os.close(fd)
    path = Path(name)
    try:
        options = f"FORMAT parquet, COMPRESSION uncompressed, ROW_GROUP_SIZE {SORTED_GROUP_ROWS}"
        con.execute(f"COPY ({sql}) TO {sql_path(str(path))} ({options})")
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def sorted_rows(path: Path, rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """A :func:`sorted_file`'s rows a row group at a time, its columns nullable as a streamed
    result's are; the file is removed after."""
    try:
        for batch in streamed(path, rows):
            yield pa.RecordBatch.from_arrays(batch.columns, schema=_nullable(batch.schema))
    finally:
        path.unlink(missing_ok=True)


def _nullable(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every field nullable (a NOT NULL column is a required Parquet field)."""
    return pa.schema([field.with_nullable(True) for field in schema])


def streamed(
    path: str | Path,
    rows: int = BATCH_ROWS,
    columns: Sequence[str] | None = None,
    batch_bytes: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """A Parquet file's rows (``columns`` only, when given) a batch at a time, holding about
    one row group: Arrow's default pre-buffering keeps every row group it read until the file
    is closed (a 112 MB file read in 8,192-row batches held 110 MB of Arrow memory at the end).
    With ``batch_bytes`` a batch is also about that many decoded bytes, by each row group's
    stated size (a file written by another tool may hold long documents: 4,096 rows of them
    would be one batch of gigabytes). Decoded on the calling thread: a task runs on one core."""
    names = None if columns is None else list(columns)
    with pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20) as parquet:
        if batch_bytes is None:
            yield from parquet.iter_batches(rows, columns=names, use_threads=False)
            return
        meta = parquet.metadata
        for group in range(meta.num_row_groups):
            info = meta.row_group(group)
            fit = batch_bytes * info.num_rows // max(info.total_byte_size, 1)
            size = max(1, min(rows, fit))
            yield from parquet.iter_batches(
                size, row_groups=[group], columns=names, use_threads=False
            )


def put_query(
    cas: ContentStore,
    con: DuckDBPyConnection,
    sql: str,
    schema: pa.Schema,
    sort_limit: str | None = None,
) -> tuple[Ref, pa.Table]:
    """The rows of ``sql`` (in its ORDER BY) as ``put_table`` would store them, and the first
    ten rows (:func:`~corpus_assets.core.storage.parquet_sink.put_tables`). With
    ``sort_limit`` the query runs on one thread under that cap (``tightened``)."""
    if sort_limit is None:
        return put_tables(cas, batches(con, sql), schema)
    with tightened(con, sort_limit):
        return put_tables(cas, batches(con, sql), schema)


@contextmanager
def tightened(con: DuckDBPyConnection, memory_limit: str, threads: int = 1) -> Iterator[None]:
    """Within the block ``con`` runs under ``memory_limit`` on ``threads``, its own settings
    after. A sort of every record fills its cap on each thread (two threads under 128 MB
    raised the process by ~130 MB for 750k rows, one under 64 MB by ~45 MB): the rest of the
    cap's pages are evicted to its spill directory while it runs."""
    old = con.execute(
        "SELECT current_setting('memory_limit'), current_setting('threads')"
    ).fetchall()[0]
    con.execute(f"SET threads = {int(threads)}")
    con.execute(f"SET memory_limit = '{memory_limit}'")
    try:
        yield
    finally:
        con.execute(f"SET memory_limit = '{old[0]}'")
        con.execute(f"SET threads = {int(old[1])}")
