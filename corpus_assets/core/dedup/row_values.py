"""Integers by row that the output phases read a slice at a time: the rank by record id and the
leakage group's naming row.

The driver's own coding holds them in arrays (:class:`HeldRows`). Where the runner's merge
tasks coded the rows, each partition's files hold its rows (ascending) and what gives their
values, memory-mapped (:class:`PartedRows`): the driver then holds no array of every row
through the output phases, only a slice's values. The files are the merges' own, or written
a slice at a time by the driver (:func:`write_npy`: the leakage step's answers by group).
"""

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np

from corpus_assets.core.dedup.order import sorted_hits

# Where a partition's values come from: positions into its rows (a slice or an index array)
# -> each one's value.
Values = Callable[[slice | np.ndarray], np.ndarray]


class RowValues(Protocol):
    """One integer per row of ``n`` rows, read by range or by rows."""

    n: int
    dtype: np.dtype

    def span(self, lo: int, hi: int) -> np.ndarray:
        """The values of rows ``lo`` to ``hi - 1``."""
        ...

    def of(self, rows: np.ndarray) -> np.ndarray:
        """The values of ``rows`` (any order, repeats)."""
        ...


class HeldRows:
    """The values in an array."""

    def __init__(self, values: np.ndarray) -> None:
        self.values, self.n, self.dtype = values, len(values), values.dtype

    def span(self, lo: int, hi: int) -> np.ndarray:
        return self.values[lo:hi]

    def of(self, rows: np.ndarray) -> np.ndarray:
        return self.values[rows]


class PartedRows:
    """The values from partitions whose rows are disjoint, together every row, each
    partition's ascending (``parts``: its rows, mapped, and where their values come from)."""

    def __init__(self, n: int, dtype: np.dtype, parts: list[tuple[np.ndarray, Values]]) -> None:
        self.n, self.dtype, self.parts = n, np.dtype(dtype), parts

    def span(self, lo: int, hi: int) -> np.ndarray:
        out = np.empty(hi - lo, dtype=self.dtype)
        found = 0
        for rows, values in self.parts:
            a, b = (int(i) for i in np.searchsorted(rows, [lo, hi]))
            out[np.asarray(rows[a:b]) - lo] = values(slice(a, b))
            found += b - a
        if found != hi - lo:
            raise RuntimeError(f"rows {lo}..{hi - 1}: {found} of them in the partitions")
        return out

    def of(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows)
        out = np.empty(len(rows), dtype=self.dtype)
        found = np.zeros(len(rows), dtype=bool)
        for part_rows, values in self.parts:
            at, hit = sorted_hits(part_rows, rows)
            if hit.any():
                out[hit] = values(at[hit])
                found |= hit
        if not found.all():
            raise RuntimeError(f"row {int(rows[~found][0])} is in no partition")
        return out


class Leakage(NamedTuple):
    """Each row's leakage group's naming row, and how many groups there are."""

    rows: RowValues
    groups: int


def write_npy(path: Path, dtype: np.dtype, n: int, slices: Iterable[np.ndarray]) -> None:
    """An ``.npy`` file of ``n`` values written a slice at a time (never held whole)."""
    dtype = np.dtype(dtype)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n,)}
    written = 0
    with open(path, "wb") as out:
        np.lib.format.write_array_header_2_0(out, header)
        for part in slices:
            out.write(np.ascontiguousarray(part, dtype=dtype).tobytes())
            written += len(part)
    if written != n:
        raise RuntimeError(f"{path.name}: {written} values written, {n} stated")


def rows_within(path: str, span: tuple[int, int]) -> np.ndarray:
    """The rows of an ascending ``.npy`` of rows within ``span`` (memory-mapped, a range
    read)."""
    rows = np.load(path, mmap_mode="r")
    lo, hi = np.searchsorted(rows, span)
    return np.asarray(rows[lo:hi])


def load_merged(base: str, *names: str) -> tuple[np.ndarray, ...]:
    """A merge task's arrays (deleted once read)."""
    loaded = tuple(np.load(f"{base}-{name}.npy") for name in names)
    for name in names:
        Path(f"{base}-{name}.npy").unlink()
    return loaded


def mapped_merged(base: str, *names: str) -> tuple[np.ndarray, ...]:
    """A merge task's arrays, memory-mapped (read again and again; the scratch folder they
    are in goes with the layer's run)."""
    return tuple(np.load(f"{base}-{name}.npy", mmap_mode="r") for name in names)
