"""Every canonical row's token count as a DuckDB table, one chunk at a time.

The token cache keeps per-chunk offsets in the chunk's row order; the chunk's records table
(read by DuckDB from the CAS, ``file_row_number`` giving the row) names each row. Object and
line tell a repeated record id's rows apart, so consumers join on (record_id, object, line).
Given the dedup layer's decisions table (per global row, its position ``pos`` in the clusters
table), ``load_position_tokens`` keys the counts by that position instead: no records table is
read, and a consumer joins the clusters table on one integer.
"""

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.cas_queries import cas_parquet
from corpus_assets.core.tokens.cache import TokenCache, open_tokens

ROW_KEY = ("record_id", "object", "line")


def load_row_tokens(
    ws: Workspace,
    con: duckdb.DuckDBPyConnection,
    canonical: CanonicalIndex,
    tokens: TokenCache,
    columns: tuple[str, ...] = ROW_KEY,
    name: str = "row_tokens",
) -> None:
    """Table ``name``: ``columns`` of every canonical row and its ``tokens``."""
    picked = ", ".join(f"c.{column}" for column in columns)
    first = True
    for chunk, cached in zip(canonical.chunks(), tokens.chunks, strict=True):
        counts = np.asarray(open_tokens(ws, cached, tokens.spec, ids=False).counts())
        rows = np.arange(len(counts), dtype=np.int64)
        con.register("chunk_counts", pa.table({"row": rows, "tokens": counts}))
        source = cas_parquet(ws.cas, chunk.records, chunk.what, numbered=True)
        select = (
            f"SELECT {picked}, t.tokens FROM {source} c "
            "JOIN chunk_counts t ON c.file_row_number = t.row"
        )
        con.execute(f"CREATE TABLE {name} AS {select}" if first else f"INSERT INTO {name} {select}")
        con.unregister("chunk_counts")
        first = False
    if first:  # no chunk: an empty table of the same columns
        con.execute(
            f"CREATE TABLE {name} AS SELECT {', '.join(columns)}, 0::BIGINT AS tokens "
            "FROM (SELECT NULL::VARCHAR AS record_id, NULL::VARCHAR AS object, "
            "NULL::BIGINT AS line, NULL::VARCHAR AS source_id, "
            "NULL::VARCHAR AS record_digest) WHERE false"
        )


def load_position_tokens(
    ws: Workspace,
    con: duckdb.DuckDBPyConnection,
    tokens: TokenCache,
    order: str,
    name: str = "row_tokens",
) -> None:
    """Table ``name``: (pos, tokens) of every canonical row, ``pos`` its clusters-table
    position read from the decisions table at ``order`` (one row per global row)."""
    parts = [open_tokens(ws, cached, tokens.spec, ids=False).counts() for cached in tokens.chunks]
    counts = np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)
    pos = pq.read_table(order, columns=["pos"])["pos"]
    if len(pos) != len(counts):
        raise ValueError(f"{len(pos)} decisions for {len(counts)} token counts")
    con.register("position_counts", pa.table({"pos": pos, "tokens": counts}))
    con.execute(f"CREATE TABLE {name} AS SELECT pos, tokens FROM position_counts")
    con.unregister("position_counts")
