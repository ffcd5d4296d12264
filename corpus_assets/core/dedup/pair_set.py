"""A set of distinct packed pairs (int64), filled band by band by the held-out search.

Its own module: an open-addressing hash table in numpy (the bands repeat most pairs, so a band's
pairs are looked up and only the new ones kept, instead of every band's pairs sorted and merged;
pandas' hash table would cost its ~0.25 s import and was 2x slower on these arrays).
"""

import numpy as np

# the found pairs' table starts at 2^16 slots (512 KB) and doubles as they come
TABLE_BITS = 16
FIB = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: the hash's multiplier


class DistinctPairs:
    """The distinct packed pairs found so far, in an open-addressing hash table (linear
    probing, at most half full, -1 empty). The bands repeat most pairs (a near-duplicate
    cluster's pairs collide in nearly every band: at 1.1 GB of raw text a child's 42 bands
    found ~88k pairs each, ~92k distinct in all), so a band's pairs are looked up (a hash and a
    gather or two each) and only the new ones sorted, not every band's pairs sorted and merged.
    Memory: the table, 2 to 4 slots of 8 bytes per distinct pair (the output's own size)."""

    def __init__(self) -> None:
        self.table = np.full(1 << TABLE_BITS, -1, dtype=np.int64)
        self.count = 0

    def _slots(self, values: np.ndarray) -> np.ndarray:
        """Each value's home slot: the high bits of a Fibonacci (multiply-shift) hash."""
        shift = np.uint64(64 - (len(self.table).bit_length() - 1))
        return ((values.view(np.uint64) * FIB) >> shift).astype(np.intp)

    def _has(self, values: np.ndarray) -> np.ndarray:
        """Whether each value is in the table: its probe walks on from its slot while the slot
        holds another value (vectorised: every round moves only the values still walking)."""
        mask = len(self.table) - 1
        slot = self._slots(values)
        at = self.table[slot]
        hit = at == values
        todo = np.flatnonzero(~hit & (at >= 0))
        slot = slot[todo]
        while len(todo):
            slot = (slot + 1) & mask
            at = self.table[slot]
            same = at == values[todo]
            hit[todo[same]] = True
            walking = ~same & (at >= 0)
            todo, slot = todo[walking], slot[walking]
        return hit

    def _put(self, values: np.ndarray) -> None:
        """Place distinct values not in the table, each at the first free slot of its probe
        (values racing for one free slot: the one written wins, the others walk on)."""
        mask = len(self.table) - 1
        slot = self._slots(values)
        while len(values):
            free = self.table[slot] < 0
            self.table[slot[free]] = values[free]
            placed = np.zeros(len(values), dtype=bool)
            placed[free] = self.table[slot[free]] == values[free]
            slot = np.where(free, slot, (slot + 1) & mask)
            values, slot = values[~placed], slot[~placed]

    def add(self, packed: np.ndarray) -> None:
        """Keep the values of ``packed`` (any order, repeats allowed) not found before."""
        new = np.unique(packed[~self._has(packed)]) if len(packed) else packed
        if 2 * (self.count + len(new)) > len(self.table):
            held = self.table[self.table >= 0]
            size = len(self.table)
            while 2 * (self.count + len(new)) > size:
                size *= 2
            self.table = np.full(size, -1, dtype=np.int64)
            self._put(held)
        self._put(new)
        self.count += len(new)

    def sorted(self) -> np.ndarray:
        """Every pair found, sorted."""
        values = self.table[self.table >= 0]
        values.sort()
        return values


class KeyClasses:
    """The records of one side of the held-out search grouped by their keys in every band: two
    records with the same key in each band meet the same records in each band, so the bands
    are searched with one record per class and each pair of a class is expanded to its records
    once at the end. A child's few new records are mostly copies of each other and of old ones
    (at 1.1 GB a band's ~8k changed records made ~236k pairs, ~14k from one per class), and
    every band found the same pairs again."""

    def __init__(self, rows: np.ndarray, keys: np.ndarray) -> None:
        """``rows`` (one side's records) and ``keys`` (bands, len(rows)), a band per row."""
        order = np.lexsort(keys[::-1]) if len(rows) else np.empty(0, np.intp)
        ordered = keys[:, order]
        first = np.r_[True, np.any(ordered[:, 1:] != ordered[:, :-1], axis=0)][: len(rows)]
        self.keys = ordered[:, first]  # (bands, classes)
        self.rows = np.asarray(rows, dtype=np.int64)[order]  # class by class
        self.starts = np.flatnonzero(first)
        self.counts = np.diff(np.r_[self.starts, len(rows)])

    def expand(self, packed: np.ndarray, n: int) -> np.ndarray:
        """Pairs packed ``class * n + row`` as the rows' pairs ``a * n + b`` (a < b; a record
        and itself left out), sorted unique."""
        cls, other = np.divmod(packed, max(n, 1))
        count = self.counts[cls]
        total = int(count.sum())
        step = np.repeat(self.starts[cls] - (count.cumsum() - count), count)
        a = self.rows[np.arange(total) + step]
        b = np.repeat(other, count)
        pairs = np.minimum(a, b) * n + np.maximum(a, b)
        pairs = pairs[a != b]
        pairs.sort()
        return pairs[np.r_[True, pairs[1:] != pairs[:-1]]] if len(pairs) else pairs
