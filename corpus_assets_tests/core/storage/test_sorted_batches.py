"""Sorted query results through a file, and Parquet files read a row group at a time."""

import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.storage.cas_queries import (
    Spilling,
    batches,
    out_of_memory,
    sorted_batches,
    streamed,
)
from corpus_assets.core.storage.table_lookup import SCAN_BATCH, rows_at, scan

GROUPS, GROUP_ROWS, TEXT = 24, 2048, 512  # ~1 MB of text per row group, ~24 MB in all


def _wide(path: Path) -> Path:
    """A Parquet file of ``GROUPS`` row groups of distinct texts, written without compression
    (what Arrow reads is the size of what it buffers)."""
    texts = [f"{n:08d}" + "x" * TEXT for n in range(GROUPS * GROUP_ROWS)]
    table = pa.table({"n": range(len(texts)), "text": texts})
    pq.write_table(table, path, row_group_size=GROUP_ROWS, compression="none")
    return path


def test_a_streamed_file_holds_about_one_row_group(tmp_path: Path) -> None:
    """Arrow's default pre-buffering keeps every row group read until the file closes: the
    reader would end holding the whole file (~24 MB here)."""
    path = _wide(tmp_path / "wide.parquet")
    one_group = path.stat().st_size // GROUPS
    before, held, rows = pa.total_allocated_bytes(), 0, 0
    for batch in streamed(path, GROUP_ROWS // 2):
        rows += batch.num_rows
        held = max(held, pa.total_allocated_bytes() - before)
    assert rows == GROUPS * GROUP_ROWS
    assert held < 4 * one_group, f"{held} bytes held; a row group is {one_group}"


def test_sorted_batches_give_the_streamed_query_rows_in_order_and_leave_no_file(
    tmp_path: Path,
) -> None:
    path = _wide(tmp_path / "wide.parquet")
    sql = f"SELECT text, n % 7 AS k, n FROM read_parquet('{path}') ORDER BY k DESC, text"
    folder = tmp_path / "sorted"
    folder.mkdir()
    with Spilling(tmp_path / "tmp", "64MB", threads=1) as con:
        expected = pa.Table.from_batches(list(batches(con, sql)))
        got = pa.Table.from_batches(list(sorted_batches(con, sql, folder, 1000)))
        assert got.schema == expected.schema  # every column nullable, as a streamed result's
        assert got.equals(expected)
        assert not list(folder.iterdir())

        early = sorted_batches(con, f"SELECT n FROM read_parquet('{path}') ORDER BY n", folder)
        assert next(early).column(0)[0].as_py() == 0
        early.close()  # a consumer that stops part-way
        assert not list(folder.iterdir())


def test_a_sort_out_of_memory_while_its_rows_stream_is_told_from_other_errors(
    tmp_path: Path,
) -> None:
    """A sorted query streamed through ``batches`` can run out of DuckDB's cap after its first
    batch, while it reads its spilled runs back: the error then comes out of Arrow's reader as
    an ``OSError`` carrying DuckDB's message, not as ``duckdb.OutOfMemoryException``. A builder
    that runs again under more memory must take both, and no other ``OSError`` (a full disk)."""
    sql = "SELECT r, repeat('x', 50) || hash(r)::VARCHAR AS s FROM range(3000000) t(r) ORDER BY s"
    rows = 0
    with Spilling(tmp_path / "tmp", "32MB", threads=1) as con, pytest.raises(OSError) as raised:
        for batch in batches(con, sql, 1 << 16):
            rows += batch.num_rows
    assert rows, "the first batch came out before the sort ran out"
    assert not isinstance(raised.value, duckdb.Error)
    assert out_of_memory(raised.value)
    with (
        Spilling(tmp_path / "tmp", "1MB", threads=1) as con,
        pytest.raises(duckdb.OutOfMemoryException) as statement,
    ):
        con.execute(sql)
    assert out_of_memory(statement.value)
    assert not out_of_memory(OSError(28, "No space left on device"))
    assert not out_of_memory(duckdb.IOException("Out of Memory Error: not this kind"))


def test_a_table_scan_holds_one_batch_and_the_matches(tmp_path: Path) -> None:
    """``matching_rows`` and ``explain`` scan whole clusters tables: the scan's reader must not
    keep the row groups it already read (it held the whole file with pre-buffering on)."""
    rows = 16 * SCAN_BATCH
    texts = pa.array([f"{n:032d}" for n in range(rows)])
    path = tmp_path / "long.parquet"
    table = pa.table({"n": range(rows), "text": texts})
    pq.write_table(table, path, row_group_size=SCAN_BATCH // 4, compression="none")
    batch_bytes = table.nbytes // 16
    before, held = pa.total_allocated_bytes(), [0]

    def keep(batch: pa.RecordBatch) -> pa.Array:
        held[0] = max(held[0], pa.total_allocated_bytes() - before)
        return pc.equal(pc.bit_wise_and(batch.column("n"), 65535), 0)

    found = scan(str(path), ["n", "text"], keep)
    assert found.column("n").to_pylist() == list(range(0, rows, 65536))
    assert held[0] < 4 * batch_bytes, f"{held[0]} bytes held; a batch is {batch_bytes}"


def test_rows_at_takes_positions_in_their_order(tmp_path: Path) -> None:
    """``rows_at`` gives what a whole-column ``take`` gives, for rows ascending, shuffled,
    repeated or none."""
    path = _wide(tmp_path / "wide.parquet")
    column = pq.read_table(path, columns=["text"]).column(0)
    rng = np.random.default_rng(7)
    ascending = np.arange(5, GROUPS * GROUP_ROWS, GROUP_ROWS // 3)
    for rows in (ascending, rng.permutation(ascending), [9, 9, 3, GROUPS * GROUP_ROWS - 1], []):
        wanted = np.asarray(rows, dtype=np.int64)
        got = rows_at(str(path), "text", wanted)
        assert got.type == pa.string()
        assert got.to_pylist() == column.take(pa.array(wanted, pa.int64())).to_pylist()


_PEAK = """
import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq
from corpus_assets.core.storage.table_lookup import rows_at
rows = np.arange(5, {total}, {step})
if sys.argv[1] == "rows_at":
    rows_at(sys.argv[2], "text", rows)
else:
    pq.read_table(sys.argv[2], columns=["text"]).column(0).take(pa.array(rows))
print(pa.default_memory_pool().max_memory())
"""


def test_rows_at_holds_about_one_row_group(tmp_path: Path) -> None:
    """Arrow's peak in a fresh process while taking a row of every third of each row group:
    a few groups for ``rows_at`` (a group read, its column decoded, the values taken); the
    whole column (~24 MB) for a read-then-take, which shows the measure sees the difference."""
    path = _wide(tmp_path / "wide.parquet")
    one_group = path.stat().st_size // GROUPS
    code = _PEAK.format(total=GROUPS * GROUP_ROWS, step=GROUP_ROWS // 3)

    def peak(way: str) -> int:
        run = [sys.executable, "-c", code, way, str(path)]
        return int(subprocess.run(run, check=True, capture_output=True, text=True).stdout)

    assert peak("rows_at") < 6 * one_group, f"a row group is {one_group} bytes"
    assert peak("whole") > GROUPS // 2 * one_group
