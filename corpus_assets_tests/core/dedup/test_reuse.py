"""What a child's dedup records of its clusters table for readers comparing it with its
parent's: the chunks holding every row it joined rather than copied."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.dedup.reuse import (
    Reuse,
    _ParentWindow,
    changed_chunks,
    fresh_positions,
    gathered,
    merged,
    remember_changed,
)
from corpus_assets.core.storage.catalog import Catalog


def test_the_chunks_holding_joined_rows_are_remembered_by_both_tables(tmp_path: Path) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.sqlite'}")
    chunk_rows = [("sha256:a", 3), ("sha256:b", 0), ("sha256:c", 4), ("sha256:d", 2)]
    fresh = np.array([3, 6, 8], dtype=np.int64)  # rows 3 and 6 in chunk c, 8 in chunk d
    reuse = Reuse(fresh, np.zeros(9, dtype=bool), np.zeros(9, dtype=bool), "parent.parquet")
    remember_changed(catalog, "code@1", ("sha256:parent", "sha256:child"), chunk_rows, reuse)
    found = changed_chunks(catalog, "code@1", "sha256:parent", "sha256:child")
    assert found == {"sha256:c", "sha256:d"}
    assert changed_chunks(catalog, "code@2", "sha256:parent", "sha256:child") is None
    assert changed_chunks(catalog, "code@1", "sha256:other", "sha256:child") is None


def _merge_case(
    tmp_path: Path, keep: np.ndarray, fresh_at: np.ndarray, group_rows: int
) -> tuple[Reuse, pa.Table, pa.Table]:
    """A parent table of ``len(keep)`` rows in row groups of ``group_rows``, the joined rows
    for ``fresh_at``, and the reuse plan between them."""
    parent = pa.table(
        {"id": [f"p{i}" for i in range(len(keep))], "n": np.arange(len(keep), dtype=np.int64)}
    )
    path = tmp_path / "parent.parquet"
    pq.write_table(parent, path, row_group_size=group_rows)
    k = int(fresh_at.sum())
    fresh = pa.table({"id": [f"f{i}" for i in range(k)], "n": -np.arange(k, dtype=np.int64)})
    reuse = Reuse(np.arange(k, dtype=np.int64), fresh_at, keep, str(path))
    return reuse, parent, fresh


def _expected(reuse: Reuse, parent: pa.Table, fresh: pa.Table) -> list[dict[str, object]]:
    old = iter(parent.filter(pa.array(reuse.keep)).to_pylist())
    new = iter(fresh.to_pylist())
    return [next(new) if flag else next(old) for flag in reuse.fresh_at.tolist()]


@pytest.mark.parametrize("rows", [1, 3, 7, 64])
def test_merged_interleaves_copied_and_joined_rows_in_output_order(
    tmp_path: Path, rows: int
) -> None:
    """Copied parent rows (whole row groups of the parent dropped, runs kept, a window over
    several row groups) and joined rows land at their positions, batches of ``rows``."""
    rng = np.random.default_rng(7)
    keep = rng.random(40) < 0.7
    keep[10:20] = False  # two whole parent row groups (of 5) copied from nowhere
    copied = int(keep.sum())
    fresh_at = np.zeros(copied + 9, dtype=bool)
    fresh_at[rng.choice(len(fresh_at), 9, replace=False)] = True
    fresh_at[:3] = True  # a batch of joined rows only, at rows 1 and 3
    fresh_at[3:6] = False
    fresh_at[-1] = False
    reuse, parent, fresh = _merge_case(tmp_path, keep, fresh_at, group_rows=5)
    batches = list(merged(reuse, iter(fresh.to_batches(max_chunksize=2)), parent.schema, rows))
    assert all(len(b) <= rows for b in batches)
    assert pa.Table.from_batches(batches).to_pylist() == _expected(reuse, parent, fresh)


def test_merged_with_nothing_joined_or_nothing_copied(tmp_path: Path) -> None:
    for keep, fresh_at in (
        (np.ones(12, dtype=bool), np.zeros(12, dtype=bool)),
        (np.zeros(12, dtype=bool), np.ones(5, dtype=bool)),
    ):
        reuse, parent, fresh = _merge_case(tmp_path, keep, fresh_at, group_rows=4)
        out = merged(reuse, iter(fresh.to_batches()), parent.schema, 5)
        assert pa.Table.from_batches(list(out), parent.schema).to_pylist() == _expected(
            reuse, parent, fresh
        )


def test_fresh_positions_place_copied_rows_and_refuse_another_order() -> None:
    child_pos = np.array([4, 0, 2], dtype=np.int64)
    fresh_at = fresh_positions(6, child_pos, np.array([9, 1, 5], dtype=np.int64))
    assert fresh_at is not None
    assert fresh_at.tolist() == [False, True, False, True, False, True]
    assert fresh_positions(6, child_pos, np.array([5, 1, 9], dtype=np.int64)) is None
    assert fresh_positions(3, np.empty(0, np.int64), np.empty(0, np.int64)) is not None


def test_merged_holds_sparse_copied_rows_filtered(tmp_path: Path) -> None:
    """One copied parent row in ten: the output is the same, and the parent's batches that
    cover an output batch are held filtered, not whole."""
    keep = np.zeros(200, dtype=bool)
    keep[::10] = True
    fresh_at = np.zeros(int(keep.sum()) + 4, dtype=bool)
    fresh_at[[0, 7, 8, 23]] = True
    reuse, parent, fresh = _merge_case(tmp_path, keep, fresh_at, group_rows=8)
    out = merged(reuse, iter(fresh.to_batches()), parent.schema, 8)
    assert pa.Table.from_batches(list(out)).to_pylist() == _expected(reuse, parent, fresh)
    window = _ParentWindow(reuse.parent_table, keep, parent.schema, 8)
    table, index = window.gather(np.flatnonzero(keep)[:8])  # parent rows 0..70
    assert table.num_rows == 8  # not 72 rows of 9 batches
    assert table.take(pa.array(index)).column("n").to_pylist() == list(range(0, 80, 10))


@pytest.mark.parametrize("runs", [1, 3, 40, 900])
def test_gathered_equals_a_take_in_runs_or_row_by_row(runs: int) -> None:
    """Long runs of consecutive rows are sliced, many short ones taken: one contiguous table
    equal to ``take`` either way."""
    rng = np.random.default_rng(runs)
    n = 1000
    table = pa.concat_tables(
        [
            pa.table({"s": [f"v{i}" for i in range(lo, lo + 250)], "x": range(lo, lo + 250)})
            for lo in range(0, n, 250)
        ]
    )
    starts = np.sort(rng.choice(n - 1, runs, replace=False))
    index = np.concatenate([np.arange(a, min(a + rng.integers(1, 60), n)) for a in starts])
    got = gathered(table, index)
    assert got.equals(table.take(pa.array(index)))
    assert all(c.num_chunks == 1 for c in got.columns)
    assert gathered(table, index[:0]).num_rows == 0
