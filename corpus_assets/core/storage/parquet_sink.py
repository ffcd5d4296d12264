"""Parquet tables put in the store through a file, never as bytes in memory, with
``artifacts.put_table``'s exact bytes (``test_parquet_sink`` compares the two).

Kept apart from ``artifacts`` on purpose: ``artifacts`` is in the import closure of most stages'
code identities (the token cache's among them, which the packed spans name), so a new writer
there would re-run them all without changing a byte they make.
"""

import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.storage.artifacts import PARQUET, Ref, make_ref
from corpus_assets.core.storage.cas import ContentStore

# ``artifacts.table_bytes``' options, every byte-affecting one.
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": True,
    "write_statistics": False,
    "row_group_size": 1 << 20,
    "data_page_version": "2.0",
    "version": "2.6",
    "store_schema": True,
}


def _temp(cas: ContentStore) -> Path:
    folder = cas.root / "tmp"
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    os.close(fd)
    return Path(name)


def put_table_file(cas: ContentStore, table: pa.Table) -> Ref:
    """``put_table(cas, table)`` written through a temporary file in the store and adopted by
    hard link, so a large table's Parquet is never held in memory (once, let alone twice)."""
    writer = TableWriter(cas, table.schema)
    writer.write_table(table)
    return writer.close()


class TableWriter:
    """:func:`put_table` of the concatenation of the batches written, streamed to a temporary
    file in the store: row groups of ``row_group_size`` rows are written as they fill, each a
    table of the same batch slices ``pq.write_table`` cuts from the whole, so the bytes are the
    same while at most one row group of batches is held. ``close`` adopts the file."""

    def __init__(self, cas: ContentStore, schema: pa.Schema) -> None:
        options = dict(PARQUET_OPTIONS)
        self._group_rows: int = options.pop("row_group_size")
        self._cas, self._schema = cas, schema
        self._path = _temp(cas)
        self._handle = self._path.open("wb")
        self._writer = pq.ParquetWriter(self._handle, schema, **options)
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
