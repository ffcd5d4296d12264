"""Hashed n-gram tables of the benchmark items: what an index screens record windows with.

Built once per reference set and consulted for every record, so the structures are shaped for
the record side: per table, the sorted unique 64-bit n-gram hashes of all items, their postings
(which items hold each hash) and a bitmap of 16 one-byte slots per benchmark n-gram (~6% false
positives) that rejects most record windows before any ``searchsorted``. Memory is the keys,
postings and bitmap (~36 bytes per distinct benchmark n-gram, at least 64 KiB), independent of
corpus size.
"""

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from corpus_assets.core.records.contamination.stream import EMPTY


@dataclass(frozen=True)
class NgramTable:
    """Sorted unique n-gram hashes, their postings (item indexes) and the screening bitmap."""

    keys: np.ndarray  # uint64, sorted, unique
    ptr: np.ndarray  # int64, len(keys) + 1: postings of keys[k] are post[ptr[k]:ptr[k+1]]
    post: np.ndarray  # int32 item indexes
    bits: np.ndarray  # bool, 2**b entries, indexed by the top b bits of a hash
    shift: int

    @classmethod
    def build(cls, hashes: np.ndarray, items: np.ndarray) -> "NgramTable":
        """The table of (hash, item index) pairs, duplicates across items kept as postings."""
        order = np.lexsort((items, hashes))
        hashes, items = hashes[order], items[order]
        keys, first = np.unique(hashes, return_index=True)
        b = max(16, (16 * keys.size - 1).bit_length())
        bits = np.zeros(1 << b, dtype=bool)
        bits[keys >> np.uint64(64 - b)] = True
        ptr = np.append(first, hashes.size).astype(np.int64)
        return cls(keys, ptr, items.astype(np.int32), bits, 64 - b)

    def probe(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(window indexes whose hash is a key, key indexes); the bitmap keeps this cheap."""
        if not self.keys.size or not h.size:
            return EMPTY, EMPTY
        cand = self.bits[h >> np.uint64(self.shift)].nonzero()[0]
        if not cand.size:
            return EMPTY, EMPTY
        hc = h[cand]
        k = np.minimum(np.searchsorted(self.keys, hc), self.keys.size - 1)
        found = self.keys[k] == hc
        return cand[found], k[found]

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.ptr.nbytes + self.post.nbytes + self.bits.nbytes


def checked_pairs(items: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The items sorted by id, refusing non-string pairs and repeated ids."""
    pairs = sorted(items)
    for item_id, text in pairs:
        if not isinstance(item_id, str) or not isinstance(text, str):
            raise TypeError(f"benchmark items are (str id, str text) pairs: {item_id!r}")
    for a, b in itertools.pairwise(item_id for item_id, _ in pairs):
        if a == b:
            raise ValueError(f"benchmark item id {a!r} is given twice")
    return pairs
