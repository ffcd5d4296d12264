"""The held-out search's verified pairs turned from chunk rows into text digests, in DuckDB.

A +1% child lists a small chunk first; DuckDB estimated all chunk rows from it and joined the
digest rows with themselves (59 CPU-s of a 61 CPU-s splits layer at 122 MB). The work must stay
proportional to the rows and pairs, whatever the chunk sizes.
"""

import hashlib
import json
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.training_view.splits.heldout import _store_verified

SIZES = (14, *[7000] * 10)  # a small first chunk, as a child's appended one
PAIRS = 3500


class _Chunks:
    """Chunk tables of text digests and what ``_store_verified`` takes of them: the digests of
    global rows (read from the files, as ``RowDigests`` reads them)."""

    def __init__(self, tmp: Path) -> None:
        self.files: list[str] = []
        self.first: list[int] = []
        self.digests: list[str] = []
        for n, size in enumerate(SIZES):
            digests = [hashlib.sha256(f"{n}/{i}".encode()).hexdigest() for i in range(size)]
            path = tmp / f"chunk-{n}.parquet"
            pq.write_table(
                pa.table({"record_id": [f"r{n}-{i}" for i in range(size)], "text_digest": digests}),
                path,
            )
            self.files.append(str(path))
            self.first.append(len(self.digests))
            self.digests.extend(digests)

    def take(self, rows: pa.Array) -> pa.Array:
        column = pa.concat_arrays(
            [pq.read_table(f, columns=["text_digest"])["text_digest"].combine_chunks()
             for f in self.files]
        )  # fmt: skip
        return column.take(rows)


class _Profiled:
    """A connection that records the largest row count any operator of any statement saw."""

    def __init__(self, con: duckdb.DuckDBPyConnection, out: Path) -> None:
        self._con, self._out, self.most_rows = con, out, 0
        con.execute(f"PRAGMA enable_profiling = 'json'; PRAGMA profiling_output = '{out}'")

    def execute(self, sql: str, *args: Any) -> Any:
        for statement in filter(str.strip, sql.split(";")):
            self._con.execute(statement, *args)
            self.most_rows = max(self.most_rows, _most_rows(json.loads(self._out.read_text())))
        return self._con

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)


def _most_rows(node: dict[str, Any]) -> int:
    below = [_most_rows(child) for child in node.get("children", node.get("operator", []))]
    return max([int(node.get("intermediate_rows", 0)), *below])


def test_verified_rows_become_digest_pairs_in_work_proportional_to_rows_and_pairs(
    tmp_path: Path,
) -> None:
    chunks = _Chunks(tmp_path)
    rng = np.random.default_rng(7)
    x, y = rng.integers(0, len(chunks.digests), (2, PAIRS))
    jaccard = rng.uniform(0.5, 1.0, PAIRS)
    con = duckdb.connect()
    con.execute("SET threads = 1")
    profiled = _Profiled(con, tmp_path / "profile.json")

    _store_verified(profiled, chunks, x, y, jaccard)  # type: ignore[arg-type]

    assert profiled.most_rows <= len(chunks.digests) + 4 * PAIRS
    expected: dict[tuple[str, str], float] = {}
    for i, j, value in zip(x, y, jaccard, strict=True):
        a, b = sorted((chunks.digests[i], chunks.digests[j]))
        if a != b:
            expected[(a, b)] = min(value, expected.get((a, b), 1.0))
    got = con.execute("SELECT a, b, jaccard FROM ho_verified").fetchall()
    assert {(a, b): j for a, b, j in got} == expected
