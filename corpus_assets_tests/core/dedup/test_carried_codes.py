"""A child's codes carried from its parent's tables order and equal like the coding sorts'."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.dedup import carried_codes as carried_module
from corpus_assets.core.dedup.carried_codes import carried_codes
from corpus_assets.core.dedup.clusters import decide
from corpus_assets.core.dedup.partition_db import PartitionDb


def _records(ids: list[str], keys: list[str], groups: list[str] | None = None) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "record_id": ids,
            "source_id": ["s"] * n,
            "object": [f"o{i // 4}" for i in range(n)],
            "line": pa.array([i % 4 for i in range(n)], pa.int64()),
            "group_id": groups if groups is not None else ids,
            "dedup_key": keys,
            "kind": ["document"] * n,
            "length": pa.array(range(n), pa.int64()),
        }
    )


def _parent_files(parent: pa.Table, folder: Path, rows: int) -> tuple[str, list[str]]:
    """The parent's decisions and clusters parts (chunks of four rows) as the layer stores
    them (the columns read)."""
    starts = np.arange(0, parent.num_rows, 4)
    with PartitionDb.from_table(parent) as db:
        decided = decide(db, {"s": 0}, chunk_starts=starts)
    looked = decided.state.look(np.arange(parent.num_rows))
    decisions = folder / "decisions.parquet"
    reasons = [decided.excluded.get(r, "") for r in range(parent.num_rows)]
    pq.write_table(
        pa.table(
            {
                "verdict": looked.verdict,
                "match": looked.match,
                "pos": decided.positions.span(0, parent.num_rows),
                "rank": decided.positions.rank.span(0, parent.num_rows),
                "reason": pa.array(reasons, pa.string()),
            }
        ),
        decisions,
    )
    by_position = np.argsort(decided.positions.span(0, parent.num_rows))
    table = parent.select(["record_id", "group_id", "dedup_key"]).take(pa.array(by_position))
    parts = []
    for start in starts.tolist():
        part = folder / f"clusters-{start}.parquet"
        pq.write_table(table.slice(start, 4), part, row_group_size=rows)
        parts.append(str(part))
    return str(decisions), parts


def _same_order(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(
        np.unique(a, return_inverse=True)[1], np.unique(b, return_inverse=True)[1]
    )


def _same_classes(a: np.ndarray, b: np.ndarray) -> bool:
    """The same rows share a code in ``a`` as in ``b``."""
    first_a = {code: row for row, code in reversed(list(enumerate(a.tolist())))}
    first_b = {code: row for row, code in reversed(list(enumerate(b.tolist())))}
    return [first_a[c] for c in a.tolist()] == [first_b[c] for c in b.tolist()]


# parent: 12 rows, dedup keys repeating (exact copies); child: parent rows 4..11 (rows 0..3 a
# gone chunk) then new rows: ids before, between, equal to and after the parent's, a group id
# of another row's id and one of its own, keys equal to a parent key, a gone row's key, a new
# row's key
_PARENT_IDS = [f"p{i:02d}" for i in range(0, 24, 2)]
_PARENT_KEYS = ["k1", "k2", "k1", "k3", "k4", "k2", "k5", "k4", "k6", "k7", "k6", "k8"]
_NEW_IDS = ["a", "p05", "p10", "zz", "p07", "é", "p05x"]
_NEW_KEYS = ["k4", "k1", "new", "new", "k7", "k9", "k2"]
_NEW_GROUPS = ["a", "p05", "p10", "p07", "p07", "g-own", "grp"]
# the parent's own group ids: a gone row's, an id of another old row, one a new row shares,
# ones only old rows have
_GROUPS = {1: "gx", 4: "p10", 5: "p10", 7: "grp", 8: "grp", 9: "gz", 10: "a0"}


@pytest.mark.parametrize("groups", [{}, _GROUPS])
@pytest.mark.parametrize("rows", [1, 3, 5, 64])
def test_carried_codes_order_and_equal_as_the_sorts(
    tmp_path: Path, rows: int, groups: dict[int, str]
) -> None:
    parent_groups = [groups.get(i, r) for i, r in enumerate(_PARENT_IDS)]
    parent = _records(_PARENT_IDS, _PARENT_KEYS, parent_groups)
    decisions, clusters = _parent_files(parent, tmp_path, rows)
    child = _records(
        _PARENT_IDS[4:] + _NEW_IDS,
        _PARENT_KEYS[4:] + _NEW_KEYS,
        parent_groups[4:] + _NEW_GROUPS,
    )
    child_to_parent = np.array([*range(4, 12), *[-1] * len(_NEW_IDS)], dtype=np.int64)
    with PartitionDb.from_table(child) as db:
        sorted_codes = db.codes()
        monkey = carried_module.NEW_SHARE
        carried_module.NEW_SHARE = 1  # half the child is new here
        try:
            got = carried_codes(db, child_to_parent, decisions, clusters)
        finally:
            carried_module.NEW_SHARE = monkey
    assert got is not None
    assert _same_order(got.record_id.codes, sorted_codes.record_id.codes)
    assert _same_order(got.group_id.codes, sorted_codes.group_id.codes)
    # record and group ids are ranked together: a group id equal to a record id shares its code
    both = np.concatenate([got.record_id.codes, got.group_id.codes])
    expected = np.concatenate([sorted_codes.record_id.codes, sorted_codes.group_id.codes])
    assert _same_order(both, expected)
    assert _same_classes(got.dedup_key.codes, sorted_codes.dedup_key.codes)


def test_many_new_rows_are_sorted(tmp_path: Path) -> None:
    parent = _records(_PARENT_IDS, _PARENT_KEYS)
    decisions, clusters = _parent_files(parent, tmp_path, 4)
    child = _records(_PARENT_IDS[4:] + _NEW_IDS, _PARENT_KEYS[4:] + _NEW_KEYS)
    child_to_parent = np.array([*range(4, 12), *[-1] * len(_NEW_IDS)], dtype=np.int64)
    with PartitionDb.from_table(child) as db:
        assert carried_codes(db, child_to_parent, decisions, clusters) is None


@pytest.mark.parametrize("case", ["excluded", "not ascending", "no ranks", "a part short"])
def test_a_parent_that_does_not_line_up_gives_no_codes(tmp_path: Path, case: str) -> None:
    """A parent that excluded a row (a repeated id), a part not in record id order, decisions
    without ranks (written before parts) or parts short of the decisions' rows: the sorts."""
    ids = list(_PARENT_IDS)
    if case == "excluded":
        ids[3] = ids[2]
    decisions, clusters = _parent_files(_records(ids, _PARENT_KEYS), tmp_path, 4)
    if case == "not ascending":
        table = pq.read_table(clusters[1])
        pq.write_table(table.take(pa.array(range(table.num_rows - 1, -1, -1))), clusters[1])
    if case == "no ranks":
        pq.write_table(pq.read_table(decisions).drop_columns(["rank"]), decisions)
    if case == "a part short":
        clusters = clusters[:-1]
    child = _records([*_PARENT_IDS, "zz"], [*_PARENT_KEYS, "k1"])
    child_to_parent = np.array([*range(12), -1], dtype=np.int64)
    with PartitionDb.from_table(child) as db:
        assert carried_codes(db, child_to_parent, decisions, clusters) is None
