"""Jaccards a held-out search already knows: 1.0 for two rows of one text, else the one a
table of verified pairs holds for the two text digests.

The pairs a search estimates name few rows many times (410k pairs named 65k rows at 1.1 GB of
raw text), and the tables hold pairs of digests in byte order, ``a <= b``. Each named digest
is coded by its rank among the named ones in byte order, so a pair's (least, greatest) codes
are its digests' and two equal texts share a code; each table is then scanned a batch at a
time, its digests coded by a hash lookup, and the pairs meet on integers in numpy. Nothing
per pair goes through a DuckDB join (on the digest strings the join, its group-by and the
CTE it materialised were ~60 MB of the validation check's peak at 1.1 GB).
"""

from typing import Protocol

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.storage.cas_queries import batches
from corpus_assets.core.storage.memory import hand_back_duckdb


class Digests(Protocol):
    """Text digests by row (an Arrow array, or ``RowDigests`` reading the chunk tables)."""

    def take(self, rows: pa.Array) -> "pa.Array | pa.ChunkedArray": ...


def distinct_rows(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ascending distinct rows (non-negative) of ``x`` and ``y``, and each entry's index
    among them: ``np.unique`` with its inverse, by a mask over the rows instead of a sort
    (~0.1 CPU-s less for a 1.1 GB child's ~500k verified pairs)."""
    size = max(int(x.max(initial=-1)), int(y.max(initial=-1))) + 1
    seen = np.zeros(size, dtype=bool)
    seen[x] = True
    seen[y] = True
    rank = np.cumsum(seen, dtype=np.int64) - 1
    return np.flatnonzero(seen), rank[x], rank[y]


def known_jaccards(
    con: duckdb.DuckDBPyConnection,
    tables: tuple[str, ...],
    digests: Digests,
    a: np.ndarray,
    b: np.ndarray,
) -> np.ndarray:
    """The Jaccard of each pair of rows already known (nan where not); the smallest where
    several tables or rows name it. ``tables``: relations of (a, b, jaccard) on ``con``; a
    row without a digest is no text's (never known)."""
    rows, ra, rb = distinct_rows(a, b)
    named = digests.take(pa.array(rows, pa.int64()))  # each row's digest taken once
    values = pc.unique(named).drop_null()
    values = values.take(pc.array_sort_indices(values))
    codes = _codes(named, values)
    ka, kb = codes[ra], codes[rb]
    low, high = np.minimum(ka, kb), np.maximum(ka, kb)
    out = np.full(len(a), np.nan, dtype=np.float64)
    out[(low >= 0) & (low == high)] = 1.0
    width = max(len(values), 1)
    keys = np.where(low >= 0, low * width + high, -1)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    try:
        for table in tables:
            for batch in batches(con, f"SELECT a, b, jaccard::DOUBLE FROM {table}"):
                x, y = _codes(batch.column(0), values), _codes(batch.column(1), values)
                both = np.flatnonzero((x >= 0) & (y >= 0))
                found = x[both] * width + y[both]
                first = np.searchsorted(sorted_keys, found, "left")
                count = np.searchsorted(sorted_keys, found, "right") - first
                at = order[np.repeat(first, count) + _within(count)]
                jaccard = batch.column(2).to_numpy(zero_copy_only=False)[both]
                np.fmin.at(out, at, np.repeat(jaccard, count))
    finally:
        hand_back_duckdb(con)  # the connection's pages, before the fingerprinting after it
    return out


def _codes(digests: "pa.Array | pa.ChunkedArray", values: pa.Array) -> np.ndarray:
    """Each digest's index in the sorted ``values`` (int64), -1 where it is not one of them."""
    found = pc.index_in(digests, value_set=values)
    return np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), dtype=np.int64)


def _within(count: np.ndarray) -> np.ndarray:
    """0..c-1 for each c of ``count``, concatenated."""
    ends = np.cumsum(count)
    return np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - count, count)
