"""Exact Jaccard over shingle fingerprint sets: the check behind every near-duplicate verdict.

MinHash only estimates similarity, so candidate pairs are confirmed exactly. Fingerprint sets
are kept as sorted unique uint64 arrays (:func:`sorted_unique`) because that form is compact,
content-addressable and intersects with one ``searchsorted`` instead of Python sets.
"""

import numpy as np

EMPTY_FP = np.zeros(0, dtype=np.uint64)  # the fingerprint set of a text with no shingles
EMPTY_FP.setflags(write=False)


def sorted_unique(x: np.ndarray) -> np.ndarray:
    """``np.unique`` for a 1-D array, without its extra index bookkeeping."""
    x = np.sort(x)
    if len(x) > 1:
        keep = np.empty(len(x), dtype=bool)
        keep[0] = True
        np.not_equal(x[1:], x[:-1], out=keep[1:])
        x = x[keep]
    return x


def jaccard_sorted(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sorted unique uint64 arrays (e.g. ``minhash.fingerprints`` rows).

    Two empty arrays are 1.0 by convention (identical, no 0/0); one empty array gives 0.0.
    """
    na, nb = len(a), len(b)
    if not na or not nb:
        return 1.0 if na == nb else 0.0
    if na > nb:
        a, b, na, nb = b, a, nb, na
    idx = np.searchsorted(b, a)  # the smaller array looked up in the larger one
    np.minimum(idx, nb - 1, out=idx)
    inter = int(np.count_nonzero(b[idx] == a))
    return inter / (na + nb - inter)


def jaccard(a: set, b: set) -> float:
    """Exact Jaccard similarity; two empty sets are 1.0 by convention (identical, no 0/0)."""
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)
