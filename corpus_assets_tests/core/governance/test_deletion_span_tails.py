"""A child's spans keep its parent's leading rows: the positional difference of the deletion
index's delta skips the leading row groups whose span columns have the same bytes in both files
(``deletion_sql.span_tails``), and finds the rows the difference of the whole tables finds."""

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.governance.deletion_sql import SPANS, aligned_diff, equal_head, span_tails

GROUP = 100  # rows a row group


def _spans(path: Path, rows: int, changed: set[int], sample: int) -> str:
    """Spans of ``rows`` records, one row group a ``GROUP`` rows; row n's block is another
    where n is in ``changed``; every ``sample`` is offset by ``sample`` (not a span column)."""
    table = pa.table(
        {
            "block": [n + (1000 if n in changed else 0) for n in range(rows)],
            "start": [0] * rows,
            "end": [5] * rows,
            "record_id": [f"r{n:05d}" for n in range(rows)],
            "record_offset": [0] * rows,
            "sample": [n + sample for n in range(rows)],
            "shard": [n // 50 for n in range(rows)],
        }
    )
    pq.write_table(table, path, row_group_size=GROUP)
    return str(path)


def _sdiff(con: duckdb.DuckDBPyConnection, mine: str, theirs: str) -> list[tuple]:
    columns = [f.name for f in pq.read_schema(mine) if f.name in SPANS]
    con.execute("DROP SCHEMA IF EXISTS staging CASCADE")
    con.execute("CREATE SCHEMA staging")
    for prefix, path in (("", mine), ("p_", theirs)):
        con.execute(f"CREATE OR REPLACE TEMP VIEW {prefix}spanrows AS FROM read_parquet('{path}')")
        con.execute(f"DROP VIEW IF EXISTS {prefix}spantail")
    for statement in span_tails(columns, mine, theirs):
        con.execute(statement)
    for statement in aligned_diff("sdiff", "spantail", "p_spantail", SPANS):
        con.execute(statement)
    return con.execute("SELECT * FROM staging.sdiff ORDER BY ALL").fetchall()


def test_the_leading_equal_row_groups_are_skipped_and_the_difference_is_the_whole_ones(
    tmp_path: Path,
) -> None:
    parent = _spans(tmp_path / "parent.parquet", 450, set(), 0)
    child = _spans(tmp_path / "child.parquet", 480, {310, 460}, 7)  # samples renumbered
    assert equal_head(child, parent) == 300  # three row groups, whatever the samples
    assert equal_head(parent, parent) == 450
    with duckdb.connect() as con:
        narrowed = _sdiff(con, child, parent)
        assert any("file_row_number >= 300" in s for s in span_tails(SPANS, child, parent))
        con.execute("CREATE OR REPLACE TEMP VIEW spantail AS FROM spanrows")
        con.execute("CREATE OR REPLACE TEMP VIEW p_spantail AS FROM p_spanrows")
        con.execute("DROP TABLE IF EXISTS staging.sdiff_pairs")
        con.execute("DROP TABLE IF EXISTS staging.sdiff")
        for statement in aligned_diff("sdiff", "spantail", "p_spantail", SPANS):
            con.execute(statement)
        whole = con.execute("SELECT * FROM staging.sdiff ORDER BY ALL").fetchall()
    assert narrowed == whole and len(whole) == 2 + 30  # row 310 of each side, the tail


def test_a_first_row_group_unlike_the_parents_skips_nothing(tmp_path: Path) -> None:
    parent = _spans(tmp_path / "parent.parquet", 250, set(), 0)
    child = _spans(tmp_path / "child.parquet", 250, {3}, 0)
    assert equal_head(child, parent) == 0
    assert all("FROM " in s and "spanrows" in s for s in span_tails(SPANS, child, parent))
