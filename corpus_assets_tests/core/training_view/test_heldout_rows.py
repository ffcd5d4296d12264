"""The searched members' ids and splits are looked up for the rows pairs name: a row a forged
members table lists twice gives its first (record id, split), one listed once its own; each
row is looked up once however many pairs name it, and a row no member has is an error."""

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.dedup.heldout_search import HeldoutPairs
from corpus_assets.core.storage.cas_queries import sql_path
from corpus_assets.core.training_view.splits.heldout_rows import Members, Represented
from corpus_assets.core.training_view.splits.heldout_tasks import RowDigests


def _pairs(
    rows: list[tuple[int, str, str]],
    single: bool,
    found: HeldoutPairs | None = None,
) -> list[dict]:
    con = duckdb.connect()
    con.execute("CREATE TABLE ho_members (row BIGINT, record_id VARCHAR, split VARCHAR)")
    con.executemany("INSERT INTO ho_members VALUES (?, ?, ?)", rows)
    listed = np.array(sorted(r for r, _, _ in rows), dtype=np.int64)
    members = Members(listed, np.ones(len(listed), bool), con, RowDigests(None, []), single)  # type: ignore[arg-type]
    found = found or HeldoutPairs(np.array([1, 2]), np.array([2, 3]), np.array([0.9, 0.8]))
    return members.pairs(found).to_pylist()


def test_a_row_listed_twice_gives_its_first_member_and_one_listed_once_its_own() -> None:
    twice = [(3, "z", "test"), (1, "b", "test"), (1, "a", "train"), (2, "c", "validation")]
    got = _pairs(twice, single=False)
    assert [(p["record_a"], p["split_a"], p["record_b"]) for p in got] == [
        ("a", "train", "c"),
        ("c", "validation", "z"),
    ]
    once = [(3, "z", "test"), (1, "a", "train"), (2, "c", "validation")]
    assert _pairs(once, single=True) == got


def test_rows_named_by_many_pairs_give_each_pair_its_sides_and_a_missing_row_is_counted() -> None:
    rows = [(3, "z", "test"), (1, "a", "train"), (2, "c", "validation")]
    many = HeldoutPairs(
        np.array([1, 1, 2, 3]), np.array([3, 2, 3, 3]), np.array([0.9, 0.8, 0.7, 1])
    )
    got = _pairs(rows, single=True, found=many)
    assert [(p["record_a"], p["split_a"], p["record_b"], p["split_b"]) for p in got] == [
        ("a", "train", "z", "test"),
        ("a", "train", "c", "validation"),
        ("c", "validation", "z", "test"),
        ("z", "test", "z", "test"),
    ]
    assert [p["jaccard"] for p in got] == [0.9, 0.8, 0.7, 1]
    gone = HeldoutPairs(np.array([1, 4]), np.array([4, 4]), np.array([0.9, 0.8]))
    with pytest.raises(ValueError, match="name 3 row"):
        _pairs(rows, single=True, found=gone)


def _decided(tmp_path: Path, reps: list[int | None], pos: list[int]) -> str:
    path = tmp_path / "decisions.parquet"
    pq.write_table(pa.table({"rep": pa.array(reps, pa.int64()), "pos": pos}), path)
    return str(path)


def test_the_represented_rows_by_numpy_are_the_joins_rows(tmp_path: Path) -> None:
    """Each row takes its representative's split by clusters position: an excluded row (no
    representative) and one whose representative has no split (quarantined) are in no row;
    the rows are the SQL joins', in row order. A position listed twice is left to the join."""
    con = duckdb.connect()
    reps = [0, 0, None, 3, 3, 5, 0, 3]
    decisions = _decided(tmp_path, reps, [4, 0, 1, 2, 6, 3, 5, 7])
    splits = [(4, "train"), (2, "test"), (6, "validation"), (7, "train")]  # no 3: row 5 gone
    con.execute("CREATE TABLE assigned (pos BIGINT, split VARCHAR)")
    con.executemany("INSERT INTO assigned VALUES (?, ?)", splits)
    members = Represented("clusters", "assigned")
    got = members.positions(con, decisions)
    assert got is not None
    sql = con.sql(f"{members.query(con, sql_path(decisions))} ORDER BY row").to_arrow_table()
    assert got.to_pylist() == sql.to_pylist()
    assert got["row"].to_pylist() == [0, 1, 3, 4, 6, 7]
    assert got["split"].to_pylist() == ["train", "train", "test", "test", "train", "test"]
    con.execute("INSERT INTO assigned VALUES (2, 'train')")  # position 2 twice
    assert members.positions(con, decisions) is None
