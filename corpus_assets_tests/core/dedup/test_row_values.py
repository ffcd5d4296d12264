"""Integers by row read a slice at a time from partitions of rows (the merge tasks' files)
are those of one array, for any range or rows; a row no partition holds is refused; an
``.npy`` written a slice at a time is one array."""

from pathlib import Path

import numpy as np
import pytest

from corpus_assets.core.dedup.row_values import HeldRows, PartedRows, write_npy


def _parted(values: np.ndarray, partitions: int, seed: int) -> PartedRows:
    """``values`` split over ``partitions`` disjoint sets of rows, each held ascending with
    its values in another order (as a merge task's files), read through a function."""
    rng = np.random.default_rng(seed)
    of_row = rng.integers(0, partitions, len(values))
    parts = []
    for p in range(partitions):
        rows = np.flatnonzero(of_row == p)
        shuffled = rng.permutation(len(rows))  # the values stored in another order
        stored = np.empty(len(rows), dtype=values.dtype)
        stored[shuffled] = values[rows]
        parts.append((rows, lambda at, s=stored, k=shuffled: s[k[at]]))
    return PartedRows(len(values), values.dtype, parts)


@pytest.mark.parametrize("partitions", [1, 3, 7])
def test_parted_rows_read_as_the_array(partitions: int) -> None:
    rng = np.random.default_rng(partitions)
    values = rng.integers(0, 50, 300).astype(np.int32)
    parted, held = _parted(values, partitions, partitions), HeldRows(values)
    for lo, hi in [(0, 300), (0, 0), (17, 18), (250, 300), *rng.integers(0, 300, (20, 2))]:
        lo, hi = sorted((int(lo), int(hi)))
        assert parted.span(lo, hi).tolist() == held.span(lo, hi).tolist() == values[lo:hi].tolist()
        rows = rng.integers(0, 300, int(rng.integers(0, 40)))
        assert parted.of(rows).tolist() == values[rows].tolist()
    assert parted.span(0, 300).dtype == np.int32


def test_a_row_in_no_partition_is_refused() -> None:
    values = np.arange(10, dtype=np.int32)
    parted = PartedRows(10, values.dtype, [(np.array([0, 1, 2, 4]), lambda at: values[at])])
    assert parted.span(0, 3).tolist() == [0, 1, 2]
    with pytest.raises(RuntimeError, match=r"rows 0\.\.4: 4 of them"):
        parted.span(0, 5)
    with pytest.raises(RuntimeError, match="row 3 is in no partition"):
        parted.of(np.array([4, 3]))


def test_an_npy_written_by_slices_loads_as_one_array(tmp_path: Path) -> None:
    values = np.arange(1000, dtype=np.int32) * 7
    path = tmp_path / "x.npy"
    write_npy(path, np.dtype(np.int32), 1000, (values[lo : lo + 37] for lo in range(0, 1000, 37)))
    loaded = np.load(path, mmap_mode="r")
    assert loaded.dtype == np.int32 and loaded.tolist() == values.tolist()
    with pytest.raises(RuntimeError, match="999 values written, 1000 stated"):
        write_npy(path, np.dtype(np.int32), 1000, [values[:999]])
