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
