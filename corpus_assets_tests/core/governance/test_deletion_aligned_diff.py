"""A child's spans are diffed over the rows that differ from the parent's row at the same
position only: an equal pair cancels out of a multiset difference, so the difference is the
whole tables' whatever the order, the lengths, the repeats and the nulls."""

import duckdb
import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corpus_assets.core.governance.deletion_sql import aligned_diff, diff

ROW = st.tuples(st.sampled_from(["a", "b", None]), st.sampled_from([0, 1, None]))
NAMES = ["record_id", "end"]  # a keyword among them, as in the spans


def _table(rows: list[tuple[str | None, int | None]]) -> pa.Table:
    columns = list(zip(*rows, strict=True)) or [[], []]
    return pa.table(
        {"record_id": pa.array(columns[0], pa.string()), "end": pa.array(columns[1], pa.int64())}
    )


def _difference(child: pa.Table, parent: pa.Table, aligned: bool) -> list[tuple]:
    con = duckdb.connect()
    con.execute("CREATE SCHEMA staging")
    con.register("mine", child)
    con.register("theirs", parent)
    if aligned:
        statements = aligned_diff("d", "mine", "theirs", NAMES)
    else:
        statements = diff("d", "SELECT * FROM mine", "SELECT * FROM theirs")
    for statement in statements:
        con.execute(statement)
    return con.execute('SELECT "record_id", "end" FROM staging.d ORDER BY ALL').fetchall()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parent=st.lists(ROW, max_size=8),
    kept=st.integers(0, 8),
    changed=st.lists(st.tuples(st.integers(0, 9), ROW), max_size=3),
    added=st.lists(ROW, max_size=4),
)
def test_the_aligned_difference_is_the_whole_tables_difference(
    parent: list[tuple], kept: int, changed: list[tuple[int, tuple]], added: list[tuple]
) -> None:
    child = [*parent[:kept], *added]
    for at, row in changed:
        if at < len(child):
            child[at] = row
    mine, theirs = _table(child), _table(parent)
    assert _difference(mine, theirs, True) == _difference(mine, theirs, False)


def test_a_row_of_nulls_past_the_other_tables_end_is_not_taken_for_its_pad() -> None:
    nulls = _table([("a", 1), (None, None)])
    assert _difference(nulls, _table([("a", 1)]), True) == [(None, None)]
    assert _difference(_table([("a", 1)]), nulls, True) == [(None, None)]


def test_only_the_rows_that_moved_are_staged() -> None:
    parent = _table([(f"r{n}", n) for n in range(1000)])
    child = _table([(f"r{n}", n) for n in range(999)] + [("r999", 0), ("new", 5)])
    con = duckdb.connect()
    con.execute("CREATE SCHEMA staging")
    con.register("mine", child)
    con.register("theirs", parent)
    for statement in aligned_diff("d", "mine", "theirs", NAMES):
        con.execute(statement)
    assert con.execute("SELECT count(*) FROM staging.d_pairs").fetchone() == (2,)
    assert con.execute("SELECT * FROM staging.d ORDER BY ALL").fetchall() == [
        ("new", 5),
        ("r999", 0),
        ("r999", 999),
    ]
