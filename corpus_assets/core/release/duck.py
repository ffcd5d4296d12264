"""DuckDB over the CAS's Parquet files, for the joins and group-bys of the manifest and the gates.

The release stage reads tables of every record (canonical rows, dedup clusters, splits, members);
joining or grouping them in Arrow or Python holds whole columns in memory. DuckDB runs the same
queries out of core: its memory is capped and it spills to a private directory under the data
home's ``tmp``, removed on close. Each input is re-hashed (streamed) before DuckDB reads its
file, unless the caller already verified it, so no unverified byte reaches a result.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from corpus_assets.core.storage.cas import ContentStore

if TYPE_CHECKING:  # imported where a query runs: a command that runs none never loads DuckDB
    from duckdb import DuckDBPyConnection

MEMORY_MB = 256  # DuckDB's own buffer cap; a query beyond it spills to the temp directory
FLUSH_MB = 16  # freed memory DuckDB may keep cached before returning it to the system
BATCH_BYTES = 4 << 20  # decoded bytes of the widest column per streamed batch
MAX_BATCH_ROWS = 65536


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


@contextmanager
def connect(cas: ContentStore, threads: int = 2) -> Iterator[DuckDBPyConnection]:
    """An in-memory DuckDB capped at ``MEMORY_MB`` that spills under ``<home>/tmp``."""
    base = cas.root.parent / "tmp"
    base.mkdir(parents=True, exist_ok=True)
    spill = Path(tempfile.mkdtemp(prefix="duck-", dir=base))
    import duckdb

    con = duckdb.connect(
        config={
            "memory_limit": f"{MEMORY_MB}MB",
            "temp_directory": str(spill),
            "threads": max(1, threads),
            "preserve_insertion_order": True,
            "allocator_flush_threshold": f"{FLUSH_MB}MB",  # hand freed memory back soon
            "allocator_bulk_deallocation_flush_threshold": f"{FLUSH_MB}MB",
        }
    )
    try:
        yield con
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)


def batch_rows(parquet: pq.ParquetFile, column: str) -> int:
    """Rows per batch so that ``column`` (the widest, say the text) decodes to about
    ``BATCH_BYTES``: a row count alone would let a batch of long documents grow unbounded."""
    meta = parquet.metadata
    if not meta.num_rows:
        return 1024
    where = parquet.schema_arrow.get_field_index(column)
    size = sum(
        meta.row_group(g).column(where).total_uncompressed_size for g in range(meta.num_row_groups)
    )
    return int(min(MAX_BATCH_ROWS, max(16, BATCH_BYTES * meta.num_rows // max(size, 1))))


def sql_list(paths: list[str]) -> str:
    """A SQL list literal of file paths (for ``read_parquet``); paths are CAS paths, but quote."""
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"
