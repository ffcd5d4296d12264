"""A near-dedup class's rows in total order: its rank ``r`` is its ``r``-th row in that order.

Two hold the same answers. :class:`HeldClass` is an array (the driver's total order, and any
class run in process). :class:`FiledClass` is slices of the order merges' files
(:mod:`.code_tasks`: each partition's rows in order, and the same rows ascending with their
places), so neither the driver nor a band task holds a class's rows to map ranks and rows:
the rows of a rank, the ranks of a row range and the rows a slice at a time are read from the
mapped files. A filed class is a small frozen value, handed to the band tasks as it is.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Protocol

import numpy as np

from corpus_assets.core.dedup.order import sorted_hits

PIECE = 1 << 16  # rows read at a time where a whole class is walked


class RankLookup(Protocol):
    """What indexing by ranks gives (a class's rows, thresholds): an array per array."""

    def __getitem__(self, ranks: np.ndarray) -> np.ndarray: ...


class ClassOrder(Protocol):
    """A class's rows in total order."""

    @property
    def n(self) -> int: ...

    def rows(self) -> np.ndarray:
        """Every row, in rank order (an array of the class: for runs in process)."""
        ...

    def __getitem__(self, ranks: np.ndarray) -> np.ndarray:
        """The row of each rank."""
        ...

    def pieces(self) -> Iterator[np.ndarray]:
        """The rows in rank order, ``PIECE`` at a time."""
        ...


@dataclass(frozen=True)
class HeldClass:
    """A class's rows held in an array."""

    order: np.ndarray

    @property
    def n(self) -> int:
        return len(self.order)

    def rows(self) -> np.ndarray:
        return self.order

    def __getitem__(self, ranks: np.ndarray) -> np.ndarray:
        return self.order[ranks]

    def pieces(self) -> Iterator[np.ndarray]:
        for lo in range(0, len(self.order), PIECE):
            yield self.order[lo : lo + PIECE]


@dataclass(frozen=True)
class OrderSlice:
    """Places ``lo`` to ``hi`` of an order partition's rows (files ``base``-``order_rows``,
    its rows in order, and ``-order_by_row`` / ``-order_at``, the same rows ascending with
    their places)."""

    base: str
    lo: int
    hi: int

    def mapped(self, name: str) -> np.ndarray:
        return np.load(f"{self.base}-{name}.npy", mmap_mode="r")


@dataclass(frozen=True)
class FiledClass:
    """A class's rows as slices of order partitions, in order (``dtype``: of the rows). Each
    file is mapped once per object and the maps are not pickled: a task maps its own."""

    slices: tuple[OrderSlice, ...]
    dtype: str
    _maps: dict[tuple[str, str], np.ndarray] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __getstate__(self) -> dict[str, object]:
        return {"slices": self.slices, "dtype": self.dtype}

    def __setstate__(self, state: dict[str, object]) -> None:
        for name, value in (*state.items(), ("_maps", {})):
            object.__setattr__(self, name, value)

    def _mapped(self, s: OrderSlice, name: str) -> np.ndarray:
        key = (s.base, name)
        if key not in self._maps:
            self._maps[key] = s.mapped(name)
        return self._maps[key]

    @classmethod
    def write(cls, base: Path, order: np.ndarray) -> "FiledClass":
        """A held order written as one partition's files (for the band tasks)."""
        by_row = np.argsort(order, kind="stable")
        np.save(f"{base}-order_rows.npy", order)
        np.save(f"{base}-order_by_row.npy", order[by_row])
        np.save(f"{base}-order_at.npy", by_row.astype(order.dtype))
        return cls((OrderSlice(str(base), 0, len(order)),), str(order.dtype))

    @cached_property
    def starts(self) -> np.ndarray:
        """Each slice's first rank, and the class's size last."""
        return np.cumsum([0, *(s.hi - s.lo for s in self.slices)], dtype=np.int64)

    @property
    def n(self) -> int:
        return int(self.starts[-1])

    def rows(self) -> np.ndarray:
        parts = [np.asarray(self._mapped(s, "order_rows")[s.lo : s.hi]) for s in self.slices]
        return np.concatenate(parts).astype(self.dtype) if parts else np.empty(0, self.dtype)

    def pieces(self) -> Iterator[np.ndarray]:
        for s in self.slices:
            mapped = self._mapped(s, "order_rows")
            for lo in range(s.lo, s.hi, PIECE):
                yield np.asarray(mapped[lo : min(lo + PIECE, s.hi)], dtype=self.dtype)

    def __getitem__(self, ranks: np.ndarray) -> np.ndarray:
        ranks = np.asarray(ranks, dtype=np.int64)
        if len(ranks) and (ranks.min() < 0 or ranks.max() >= self.n):
            raise IndexError(f"ranks outside the class's {self.n} rows")
        starts = self.starts
        which = np.searchsorted(starts, ranks, side="right") - 1
        out = np.empty(len(ranks), dtype=self.dtype)
        for i in np.unique(which).tolist():
            at = which == i
            s = self.slices[i]
            out[at] = self._mapped(s, "order_rows")[s.lo + ranks[at] - starts[i]]
        return out

    def ranks_within(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """The class's rows in ``[lo, hi)``, ascending, and each one's rank."""
        rows, ranks = [], []
        for s, first in zip(self.slices, self.starts[:-1].tolist(), strict=True):
            by_row = self._mapped(s, "order_by_row")
            a, b = np.searchsorted(by_row, [lo, hi])
            at = np.asarray(self._mapped(s, "order_at")[a:b], dtype=np.int64)
            keep = (at >= s.lo) & (at < s.hi)
            rows.append(np.asarray(by_row[a:b])[keep])
            ranks.append(at[keep] - s.lo + first)
        if not rows:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        row, rank = np.concatenate(rows).astype(np.int64), np.concatenate(ranks)
        by = np.argsort(row, kind="stable")
        return row[by], rank[by]


class KnownRanks:
    """The rows of a few ranks, read once and looked up by rank: a verify task asks a row at a
    time in its scan, where each read of the files would open them again."""

    def __init__(self, order: ClassOrder, ranks: np.ndarray) -> None:
        self.ranks = np.unique(np.asarray(ranks, dtype=np.int64))
        self.rows = order[self.ranks]

    def __getitem__(self, ranks: np.ndarray) -> np.ndarray:
        at, hit = sorted_hits(self.ranks, np.asarray(ranks))
        if not hit.all():
            raise KeyError(f"ranks {np.asarray(ranks)[~hit][:5].tolist()} not read for this task")
        return self.rows[at]
