"""First occurrences in the stated total order of dedup.

Every "earlier record" in dedup is earlier in the total order, never in completion order: source
priority (config order - where a user ranks sources by governance and trust), longer text first
(the fuller copy wins), record id, object, line. The order itself is sorted on integers
(:meth:`~corpus_assets.core.dedup.partition_db.PartitionDb.total_order`: source rank, length,
the row's rank by record id); dedup then works on integer codes in that order, a few machine
words per record. The integer sort itself is here (:func:`sorted_by`, :func:`ordered_by_key`).
"""

from collections.abc import Mapping, Sequence

import numpy as np

# The clusters table's sort keys (the total order's last ones): each part, one per canonical
# chunk, is in this order, their concatenation is not, so a reader that needs it asks for it.
RECORD_ORDER = ("record_id", "object", "line")


def first_in_order(codes_in_order: np.ndarray) -> np.ndarray:
    """Mask of positions holding the first occurrence of their code (sort based, stable)."""
    by_code = np.argsort(codes_in_order, kind="stable")
    sorted_codes = codes_in_order[by_code]
    first = np.zeros(len(codes_in_order), dtype=bool)
    if not len(first):
        return first
    first[by_code[np.r_[True, sorted_codes[1:] != sorted_codes[:-1]]]] = True
    return first


def source_ranks(source_order: Mapping[str, int], sources: Sequence[str | None]) -> np.ndarray:
    """Each of ``sources``' rank in the total order (config order; a source not listed, or
    none, after all of them), as int32."""
    last = max(source_order.values(), default=-1) + 1
    return np.array(
        [source_order.get(s, last) if s is not None else last for s in sources], np.int32
    )


def sorted_hits(sorted_values: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``values`` would sit in ascending ``sorted_values`` (clipped to its last
    index) and whether it is there: the membership lookup by binary search (none is there in an
    empty array)."""
    if not len(sorted_values):
        return np.zeros(len(values), dtype=np.intp), np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_values, values), len(sorted_values) - 1)
    return at, sorted_values[at] == values


def code_dtype(n: int) -> type[np.signedinteger]:
    """Codes of ``n`` rows (at most ``n`` distinct values), or row numbers among ``n`` rows:
    int32 below 2**31 rows, half the driver memory of int64 (the five coded columns were ~76 MB
    at 3.8 million records; ranks, positions, matches and leakage rows are the same size).
    Anything multiplied by a row count is widened first."""
    return np.int32 if n < 2**31 else np.int64


def sorted_by(
    source_rank: np.ndarray, longer_first: np.ndarray, position: np.ndarray
) -> np.ndarray:
    """``np.lexsort((position, longer_first, source_rank))``: positions are distinct, so the
    three keys fit one int64 key when small enough and one sort of it gives the same order
    (:func:`ordered_by_key`); else the lexsort itself."""
    n = len(position)
    missing = longer_first == np.iinfo(np.int64).max
    shortest = int(longer_first[~missing].max(initial=0))  # minus the shortest length
    longest = int(-longer_first[~missing].min(initial=0))
    span = longest + shortest + 2  # longer-first keys 0..longest+shortest, missing one past
    ranks = int(source_rank.max(initial=0)) + 1
    if not n or ranks * span * n >= 2**62 or shortest > 0:
        return np.lexsort((position, longer_first, source_rank)).astype(code_dtype(n))
    key = np.full(n, span - 1, dtype=np.int64)  # the length key (a missing length: last)
    np.add(longer_first, longest, out=key, where=~missing)
    del missing
    for rank in range(1, ranks):  # a handful of sources: a mask each, no int64 temporary
        key[source_rank == rank] += rank * span
    return ordered_by_key(key, position)


ORDER_SLICE = 1 << 16  # positions inverted at a time (bounds the arange temporaries)


def place_ranks(into: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``into[order[i]] = i`` for every ``i``, a slice at a time: a permutation's inverse, or
    each ordered row's rank, with no ``arange`` of every row beside it; ``into``."""
    for lo in range(0, len(order), ORDER_SLICE):
        at = order[lo : lo + ORDER_SLICE]
        into[at] = np.arange(lo, lo + len(at), dtype=into.dtype)
    return into


def ordered_by_key(key: np.ndarray, position: np.ndarray) -> np.ndarray:
    """Rows in ascending (``key``, ``position``) order, ``position`` a permutation of the
    rows. ``key`` (int64, below 2**62 / n) is consumed: it becomes key * n + position in
    place, sorted (a sort, not an argsort: no int64 order beside it), reduced to the
    positions in order, and each mapped to its row: 16 bytes a row at most beside the
    inputs. The order is held through near-dedup in ``code_dtype``: 4 bytes a row."""
    n = len(position)
    key *= n
    key += position
    key.sort()
    np.remainder(key, max(n, 1), out=key)
    return place_ranks(np.empty(n, dtype=code_dtype(n)), position)[key]
