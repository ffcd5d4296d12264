"""A child's deletion index diffs only the members parts it does not share with its parent:
a shared part's rows cancel out of the multiset difference, so reading them is wasted work."""

from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.governance.deletion_sql import diff, unshared_members


def _part(tmp: Path, name: str, ids: list[str]) -> str:
    path = tmp / f"{name}.parquet"
    pq.write_table(pa.table({"record_id": ids, "object": ["o"] * len(ids)}), path)
    return str(path)


def test_only_unshared_parts_are_diffed_and_the_difference_is_the_whole_tables(
    tmp_path: Path,
) -> None:
    shared = _part(tmp_path, "shared", [f"s{n}" for n in range(1000)])
    old, new = _part(tmp_path, "old", ["a", "b"]), _part(tmp_path, "new", ["b", "c"])
    con = duckdb.connect()
    con.execute("CREATE SCHEMA staging")
    for view, paths in (("members", [shared, new]), ("p_members", [shared, old])):
        con.execute(f"CREATE VIEW {view} AS SELECT * FROM read_parquet({paths!r})")
    views, names = unshared_members([shared, new], [shared, old])
    for view in views:
        con.execute(view)
    assert names is not None
    child, parent = names
    assert con.execute(f"SELECT count(*) FROM {child}").fetchone() == (2,)  # not 1,002
    assert con.execute(f"SELECT count(*) FROM {parent}").fetchone() == (2,)
    con.execute(diff("mdiff", f"SELECT * FROM {child}", f"SELECT * FROM {parent}")[0])
    con.execute(diff("whole", "SELECT * FROM members", "SELECT * FROM p_members")[0])
    rows = "SELECT * FROM staging.{} ORDER BY ALL"
    assert con.execute(rows.format("mdiff")).fetchall() == [("a", "o"), ("c", "o")]
    assert con.execute(rows.format("whole")).fetchall() == [("a", "o"), ("c", "o")]


def test_a_parent_table_not_in_parts_is_diffed_whole() -> None:
    assert unshared_members(["c.parquet"], "p.parquet") == ([], None)
