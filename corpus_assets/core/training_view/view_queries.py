"""DuckDB for the training view's per-record joins, group-bys and sorts: out of core.

A layer's per-record state (its members, their splits, token counts) lives in an in-memory
DuckDB database (``storage.cas_queries``) capped at ``MEMORY_LIMIT`` that spills to a directory
under the data home's ``tmp``, so the Python process holds only batches and the small tables of
conflicts and moves. Inputs and outputs go through ``storage.cas_queries`` (``cas_parquet``,
``put_query``) and ``storage.parquet_sink.put_tables``; the dedup clusters table, stored whole
or as chunk parts, through ``runtime.parted_table`` (``dedup_clusters``).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from corpus_assets.core.dedup.order import RECORD_ORDER as CLUSTERS_ORDER
from corpus_assets.core.runtime.layer_index import LayerIndex
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.storage import cas_queries

MEMORY_LIMIT = "128MB"  # DuckDB's own buffers; beyond it joins and sorts spill to disk
# A sort of every member streamed out (the splits table, the verified pairs) on one thread
# under this cap (``cas_queries.tightened``): the layer's peak was that sort.
SORT_LIMIT = "64MB"
# The splits layer's connection: its peak is a plateau of four phases that each fill the cap
# (the held-out search, its resolution, the split rows' join and their stored sort). At 96 MB
# its driver peak on Ray at 1.1 GB went 480 -> 460 MB (medians of four) for +0.45 CPU-s of
# spilling, unchanged at 122 MB (354); 64 MB spilled more and peaked higher (466). Mixing and
# packing peak elsewhere: the same figures under either cap, so they keep ``MEMORY_LIMIT``.
SPLITS_LIMIT = "96MB"
# The dedup clusters table's record order (``dedup.clusters.RECORD_ORDER``, which chunk parts
# keep only each on its own) in SQL; the clusters position, ``file_row_number``, breaks the ties
# a forged table could hold.
RECORD_ORDER = ", ".join([*CLUSTERS_ORDER, "file_row_number"])


def connect(spill: Path | None = None, threads: int = 2) -> duckdb.DuckDBPyConnection:
    """An in-memory database capped at ``MEMORY_LIMIT``; it spills to ``spill`` when given."""
    return cas_queries.connect(MEMORY_LIMIT, threads, spill)


def spilling(home: Path, threads: int, limit: str = MEMORY_LIMIT) -> cas_queries.Spilling:
    """A connection spilling to a fresh directory under ``home/tmp``, removed afterwards."""
    return cas_queries.Spilling(home / "tmp", limit, threads)


@contextmanager
def right_built(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Within the block a hash join builds its table on the side written on its right. DuckDB
    builds on the side it estimates smaller: for a filtered Parquet scan (a guessed fifth of
    its rows) it then copies every wide row of that scan into the table (a LEFT JOIN of 470k
    members on their parent's 463k (record_id, split) rows took 0.42 CPU-s so, 0.26 not)."""
    old = con.execute("SELECT current_setting('disabled_optimizers')").fetchone()[0]
    con.execute(f"SET disabled_optimizers = '{','.join(filter(None, [old, _FLIP]))}'")
    try:
        yield
    finally:
        con.execute(f"SET disabled_optimizers = '{old}'")


_FLIP = "build_side_probe_side"  # the optimizer that picks a join's build side


def dedup_clusters(
    files: cas_queries.VerifiedFiles, dedup: LayerIndex, numbered: bool = False
) -> str:
    """The dedup layer's clusters table as a DuckDB relation, stored whole or as chunk parts,
    each part verified by ``files``; ``numbered``: its ``file_row_number`` is each row's
    clusters position (what the dedup decisions' ``pos`` names), dense over the parts."""
    table = PartedTable.read(files.cas, dedup.output("clusters"), "dedup clusters")
    return table.relation(files, "dedup clusters", numbered)
