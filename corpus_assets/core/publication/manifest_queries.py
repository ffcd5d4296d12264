"""DuckDB for the joins and group-bys of the manifest and the validation rules: their caps.

Publication reads tables of every record (canonical rows, dedup clusters, splits, members);
``storage.cas_queries`` runs those queries out of core. Each input is re-hashed (streamed) before
DuckDB reads its file (``cas_queries.VerifiedFiles``), unless the caller already verified it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from corpus_assets.core.storage import cas_queries
from corpus_assets.core.storage.cas import ContentStore

if TYPE_CHECKING:  # imported where a query runs: a command that runs none never loads DuckDB
    from duckdb import DuckDBPyConnection

MEMORY_MB = 256  # DuckDB's own buffer cap; a query beyond it spills to the temp directory
# The gates' queries (counts and a few examples over every record) on one thread under 160 MB:
# at 1.1 GB of raw text they filled 256 MB on two threads (the check's peak, 638 MB), and one
# thread needs fewer buffers (549 MB) for +0.7 s; below 160 MB one-thread runs got no smaller.
EVIDENCE_MB, EVIDENCE_THREADS = 160, 1
EVICT_MB = 16  # the evidence connection's limit for a moment between rules (``Evidence.evict``)
# The members table's join and sort of every member's wide row (~350 B) on one thread under
# 128 MB: at 1.1 GB of raw text two threads under 256 MB raised the manifest layer's peak by
# ~450 MB (to 600 MB), one thread under 128 MB by ~270 MB, for the same ~2.5 CPU-s; two threads
# under 128 MB ran out of memory (each thread reserves its own sort buffers).
MEMBERS_MB, MEMBERS_THREADS = 128, 1
FLUSH_MB = 16  # freed memory DuckDB may keep cached before returning it to the system
BATCH_BYTES = 4 << 20  # decoded bytes of the widest column per streamed batch
MAX_BATCH_ROWS = 65536


@contextmanager
def connect(
    cas: ContentStore, threads: int = 2, memory_mb: int = MEMORY_MB
) -> Iterator[DuckDBPyConnection]:
    """An in-memory DuckDB capped at ``memory_mb`` that spills under ``<home>/tmp``."""
    flush = (f"{FLUSH_MB}MB", f"{FLUSH_MB}MB")  # hand freed memory back soon
    with cas_queries.Spilling(
        cas.root.parent / "tmp", f"{memory_mb}MB", threads, flush=flush
    ) as con:
        yield con


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
