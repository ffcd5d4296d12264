"""A Parquet table written one row group at a time, with the bytes ``put_table`` would give.

``artifacts.table_bytes`` pins every byte-affecting option and cuts a table into row groups of
``ROW_GROUP_ROWS`` rows. Writing exactly those slices one after another through one
``ParquetWriter`` with the same options writes the same file, so a layer can stream a large
table out of a query while holding one row group (not the table) and keep its digest. The
options are repeated here rather than imported so that ``artifacts`` - in the code identity of
many cached chunk tasks - stays untouched; ``test_table_stream`` pins both to the same bytes.
"""

import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.storage.artifacts import PARQUET, Ref, make_ref
from corpus_assets.core.storage.cas import ContentStore

PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": True,
    "write_statistics": False,
    "data_page_version": "2.0",
    "version": "2.6",
    "store_schema": True,
}
ROW_GROUP_ROWS = 1 << 20
STEP = 1 << 16  # rows per chunk of a row group: a multiple of the writer's 1024-value batches


def put_table_batches(
    cas: ContentStore,
    schema: pa.Schema,
    batches: Iterable[pa.RecordBatch],
    tmp: Path,
    row_group_rows: int = ROW_GROUP_ROWS,
) -> Ref:
    """``put_table`` of the batches' concatenation, holding one row group at a time."""
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
    with pq.ParquetWriter(path, schema, **PARQUET_OPTIONS) as writer:
        wrote = False
        for group in _row_groups(batches, schema, row_group_rows, step):
            writer.write_table(group, row_group_size=row_group_rows)
            wrote = True
        if not wrote:  # an empty table still has one (empty) row group
            writer.write_table(schema.empty_table(), row_group_size=row_group_rows)
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _row_groups(
    batches: Iterable[pa.RecordBatch], schema: pa.Schema, rows: int, step: int
) -> Iterator[pa.Table]:
    """Tables of exactly ``rows`` rows (the last may be shorter), as chunks of ``STEP`` rows.

    The writer encodes a column in mini-batches of 1024 values (pyarrow's ``write_batch_size``),
    so a table chunked at multiples of 1024 writes the same pages as the combined table; the
    chunks are kept, never combined into one more copy of the row group."""
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
