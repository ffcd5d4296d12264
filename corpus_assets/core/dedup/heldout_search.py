"""High-recall search for near duplicates of held-out records (validation, test) among members.

Near-dedup's LSH (``bands x rows``, default 16 x 8, with a bucket member cap) is tuned for the
whole corpus and misses a pair at J = 0.8 with probability 0.05; a missed pair whose records
hash to train and test leaks. Held-out records are few, so they are searched again, for recall:

- **Candidates**: the held-out records' signatures are banded with few rows per band (``rows``
  = 3, ``num_perm // 3`` bands: a pair at J = 0.8 is missed with probability
  ``(1 - 0.8^3)^42`` = 9e-14), and every member's band key is looked up among them by sort and
  ``searchsorted``: no bucket cap, one band of keys in memory at a time. A band's pairs found in
  an earlier band (most of them: a near-duplicate cluster collides in nearly every band) are
  dropped by a hash table of the distinct pairs found; only new pairs are sorted.
- **Estimate**: a candidate is kept only if its full signatures agree on at least
  ``min_agree`` permutations, the lower ``1e-12`` quantile of the binomial at the threshold, so
  a pair at the threshold survives with probability 1 - 1e-12 while the many low-J collisions of
  short bands are dropped before any text is read.
- **Verification**: the exact Jaccard of the two shingle-fingerprint sets (the project's own
  shingles), which must reach the larger of the two records' thresholds. A Jaccard is a
  function of the two texts and the spec only: one computed before (``known``: an identical
  text, dedup's or a parent's verified pairs) is taken as it is, and only the other pairs'
  texts are read and fingerprinted.

Pure numpy over ``SignatureBlock``s and a fingerprint callable; pairs come back sorted by
(a, b) on global rows, so the result does not depend on the worker count or chunk timing.
"""

import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from corpus_assets.core.dedup.binomial import lower_quantile
from corpus_assets.core.dedup.near_dedup import SignatureBlock, band_keys
from corpus_assets.core.dedup.order import sorted_hits
from corpus_assets.core.dedup.pair_set import DistinctPairs, KeyClasses
from corpus_assets.core.dedup.signature_cache import BandMajorFile
from corpus_assets.core.dedup.spilled_prints import pair_jaccards

ROWS = 3  # rows per band of the held-out search
MISS = 1e-12  # the estimate's allowed miss probability for a pair at the threshold
CLASSES = 1 << 15  # a side's smaller half searched by key classes up to this many records
EMPTY = np.empty(0, dtype=np.int64)
Known = Callable[[np.ndarray, np.ndarray], np.ndarray]  # rows a, b -> Jaccard or nan


@dataclass(frozen=True)
class HeldoutParams:
    num_perm: int
    threshold: float  # the smallest Jaccard any pair needs (the estimate's floor)
    rows: int = ROWS

    @property
    def bands(self) -> int:
        return self.num_perm // self.rows

    @property
    def min_agree(self) -> int:
        """Permutations a pair at the threshold agrees on, except with probability ``MISS``."""
        return max(0, lower_quantile(MISS, self.num_perm, self.threshold))

    def miss_probability(self, s: float) -> float:
        """The chance a pair at Jaccard ``s`` is no candidate (independent bands)."""
        return float((1.0 - s**self.rows) ** self.bands)


@dataclass
class HeldoutPairs:
    """Verified pairs (global rows a < b, exact Jaccard) and what the search did."""

    a: np.ndarray
    b: np.ndarray
    jaccard: np.ndarray
    stats: dict[str, int | float] = field(default_factory=dict)
    # every estimated pair (rows a < b) and its exact Jaccard, at or above the threshold or not
    verified: tuple[np.ndarray, np.ndarray, np.ndarray] = (EMPTY, EMPTY, np.empty(0))


def _columns(blocks: Sequence[SignatureBlock], band: int, rows: int) -> np.ndarray:
    """One band's ``(rows, records)`` signature values for every record (blocks end to end)."""
    parts = [block.band(band, rows) for block in blocks]
    return np.concatenate(parts, axis=1) if parts else np.empty((rows, 0), dtype=np.uint32)


@dataclass(frozen=True)
class _Mapped:
    """A signature file mapped read-only: ``values`` ``(num_perm, records)``, read where
    indexed. ``release`` drops the pages read from this process (the page cache keeps them): a
    mapped file's resident pages count in the process's memory, and every band read would
    leave the whole file there."""

    values: np.ndarray
    pages: mmap.mmap

    @classmethod
    def open(cls, block: BandMajorFile) -> "_Mapped":
        with open(block.path, "rb") as f:
            pages = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        count = block.num_perm * block.records
        values = np.frombuffer(pages, "<u4", count, block.offset)
        return cls(values.reshape(block.num_perm, block.records), pages)

    def release(self) -> None:
        self.pages.madvise(mmap.MADV_DONTNEED)


def _maps(blocks: Sequence[SignatureBlock]) -> list[_Mapped] | None:
    """Every block mapped, when all are signature files (else None: read by band)."""
    if blocks and all(isinstance(b, BandMajorFile) for b in blocks):
        return [_Mapped.open(b) for b in blocks]  # type: ignore[arg-type]
    return None


Blocks = Sequence[SignatureBlock]
Maps = list[_Mapped] | None


class _Band:
    """One band of every record (blocks end to end): its first row whole (the prefilter's),
    the band's values taken at some records. Over signature files only those records' values
    of the other rows are read (the prefilter lets few through); else the band is read whole."""

    def __init__(self, blocks: Blocks, maps: Maps, band: int, rows: int) -> None:
        self.rows = rows
        if maps is not None:
            self._maps = [m.values for m in maps]
            self._at = band * rows
            self._ends = np.cumsum([m.shape[1] for m in self._maps])
            self._whole = None
        else:
            self._whole = _columns(blocks, band, rows)

    @cached_property
    def first(self) -> np.ndarray:
        """The band's first row of every record (read when asked: keys of a few records not)."""
        if self._whole is not None:
            return self._whole[0]
        return np.concatenate([m[self._at] for m in self._maps])

    def take(self, records: np.ndarray) -> np.ndarray:
        """The ``(rows, len(records))`` values of the band at global ``records``."""
        if self._whole is not None:
            return self._whole[:, records]
        order = np.argsort(records, kind="stable")
        ascending = records[order]
        cut = np.searchsorted(ascending, np.r_[0, self._ends])
        band = slice(self._at, self._at + self.rows)
        parts = [
            m[band, ascending[cut[i] : cut[i + 1]] - (self._ends[i - 1] if i else 0)]
            for i, m in enumerate(self._maps)
        ]
        out = np.empty((self.rows, len(records)), dtype=np.uint32)
        out[:, order] = np.concatenate(parts, axis=1)
        return out


def _unique(values: np.ndarray) -> np.ndarray:
    """``values`` sorted unique; sorted in place (every caller hands over a fresh array)."""
    values.sort()
    return values[np.r_[True, values[1:] != values[:-1]]] if len(values) else values


def _prefilter(held: np.ndarray, probe: np.ndarray) -> np.ndarray:
    """Indices of ``probe`` whose band may equal one of ``held``'s: a bitmap over the low bits
    of the band's first values (at least 8 slots per held record, and at least 2^20: a
    child's few moved records probed by every member let ~1 in 700 through, not 1 in 45; a
    4M-slot table cost more to clear and miss in than it saved) drops most members before any
    key is computed."""
    bits = min(26, max(20, len(held).bit_length() + 3))
    mask = np.uint32((1 << bits) - 1)
    table = np.zeros(1 << bits, dtype=bool)
    table[held & mask] = True
    return np.flatnonzero(np.take(table, probe & mask))  # take: no cast of the index to intp


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of sorted ``values``: where each run of equal values starts, its value and length."""
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]]) if len(values) else EMPTY
    return starts, values[starts], np.diff(np.r_[starts, len(values)])


def _hits(
    columns: _Band, band: int, small: np.ndarray, keys: np.ndarray, large: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """The (entry of ``keys``, record of ``large`` or of all when None) pairs of equal keys in
    this band, int64; the prefilter's bitmap holds every ``small`` record's first value."""
    first = columns.first
    if large is None:  # every record: no gather of the whole band's first row
        probing = _prefilter(first[small], first)
    else:
        probing = large[_prefilter(first[small], first[large])]
    order = np.argsort(keys, kind="stable")
    starts, unique_keys, counts = _runs(keys[order])
    probe = band_keys(columns.take(probing), band)
    by_key = np.argsort(probe)  # sorted needles: the binary search walks forward
    probe, probing = probe[by_key], probing[by_key]
    at, hit = sorted_hits(unique_keys, probe)
    probing, lo, count = probing[hit], starts[at[hit]], counts[at[hit]]
    total = int(count.sum())
    if not total:
        return EMPTY, EMPTY
    m = np.repeat(probing.astype(np.int64), count)
    step = np.repeat(lo - (count.cumsum() - count), count)  # run start minus pair offset
    return order[np.arange(total) + step].astype(np.int64), m


def _band_pairs(
    columns: _Band, band: int, small: np.ndarray, large: np.ndarray | None, n: int
) -> np.ndarray:
    """Packed ``a * n + b`` (any order, no self pairs) of the records of the smaller side and
    of the larger whose keys of this band are equal (keys computed only for the smaller side
    and the prefilter's hits on the other: a pair is the same whichever side it is looked up
    from)."""
    entry, m = _hits(columns, band, small, band_keys(columns.take(small), band), large)
    h = small.astype(np.int64)[entry]
    packed = np.minimum(h, m) * n + np.maximum(h, m)
    return packed[h != m]


def _side_keys(blocks: Blocks, maps: Maps, sides: list[np.ndarray], p: HeldoutParams) -> list:
    """Each side of at most ``CLASSES`` records as ``KeyClasses`` (None: a larger one), the
    keys in every band read in one pass for all such sides (at their records only)."""
    rows = _unique(np.concatenate([EMPTY, *(s for s in sides if len(s) <= CLASSES)]))
    keys = np.empty((p.bands if len(rows) else 0, len(rows)), dtype=np.uint64)
    for band in range(len(keys)):
        keys[band] = band_keys(_Band(blocks, maps, band, p.rows).take(rows), band)
        for mapped in maps or []:
            mapped.release()
    at = [np.searchsorted(rows, s) if len(s) <= CLASSES else None for s in sides]
    return [i if i is None else KeyClasses(s, keys[:, i]) for s, i in zip(sides, at, strict=True)]


def candidates(
    blocks: Sequence[SignatureBlock],
    heldout: np.ndarray,
    members: np.ndarray,
    p: HeldoutParams,
    n: int,
    moved: np.ndarray | None = None,
) -> np.ndarray:
    """Packed ``a * n + b`` (a < b, global rows, ``n`` records in the blocks) of every held-out
    record and member sharing a band key, sorted unique; self pairs are left out. With
    ``moved`` (ascending rows, members), only the pairs with a moved record: the moved held-out
    records against every member and every held-out record against the moved members, each
    band read once for both."""
    if moved is None:
        sides = [(heldout, members)]
    else:
        sides = [(heldout[np.isin(heldout, moved)], members), (heldout, moved)]
    return side_candidates(blocks, sides, p, n)


def side_candidates(
    blocks: Sequence[SignatureBlock],
    sides: Sequence[tuple[np.ndarray, np.ndarray]],
    p: HeldoutParams,
    n: int,
) -> np.ndarray:
    """``candidates`` of each (held-out rows, member rows) side, packed, sorted unique. A
    side's smaller half of at most ``CLASSES`` records is searched by ``KeyClasses`` (its keys
    read in a first pass over the bands); a larger one record by record."""
    sides = [(h, m) if len(h) <= len(m) else (m, h) for h, m in sides if len(h) and len(m)]
    maps = _maps(blocks) if sides else None
    classes = _side_keys(blocks, maps, [small for small, _ in sides], p)
    found = [DistinctPairs() for _ in sides]
    every = [len(m) == n and m[0] == 0 and bool(np.all(np.diff(m) == 1)) for _, m in sides]
    for band in range(p.bands if sides else 0):
        columns = _Band(blocks, maps, band, p.rows)
        for i, (small, large) in enumerate(sides):
            large = None if every[i] else large  # every record, in order
            if classes[i] is None:
                found[i].add(_band_pairs(columns, band, small, large, n))
            else:  # (class, record): a class's own records too, for its other records
                entry, m = _hits(columns, band, small, classes[i].keys[band], large)
                found[i].add(entry * n + m)
        del columns
        for mapped in maps or []:
            mapped.release()
    each = zip(classes, found, strict=True)
    parts = [f.sorted() if c is None else c.expand(f.sorted(), n) for c, f in each]
    return parts[0] if len(parts) == 1 else _unique(np.concatenate([EMPTY, *parts]))


def agreement(blocks: Blocks, a: np.ndarray, b: np.ndarray, perms: int) -> np.ndarray:
    """Per pair, on how many of the ``perms`` permutations the two signatures agree (one
    permutation row of a block in memory at a time, only the pairs' records kept)."""
    agree = np.zeros(len(a), dtype=np.int32)
    if not len(a):
        return agree
    involved = _unique(np.concatenate([a, b]))
    at_a, at_b = np.searchsorted(involved, a), np.searchsorted(involved, b)
    ends = np.cumsum([int(block.band(0, 1).shape[1]) for block in blocks])
    cut = np.searchsorted(involved, np.r_[0, ends])
    parts = [
        (i, involved[cut[i] : cut[i + 1]] - (ends[i - 1] if i else 0)) for i in range(len(blocks))
    ]
    parts = [(_rows_of(blocks[i]), local) for i, local in parts if len(local)]
    for row in range(perms):
        values = np.concatenate([rows_of(row, local) for rows_of, local in parts])
        agree += values[at_a] == values[at_b]
    return agree


def _rows_of(block: SignatureBlock) -> Callable[[int, np.ndarray], np.ndarray]:
    """A permutation row's values at some records of ``block``: a signature file is mapped and
    only the pages holding them are read (a few candidates' records, not every record of
    every row: a child's search verifies a few pairs)."""
    if isinstance(block, BandMajorFile):
        mapped = _Mapped.open(block)

        def values(row: int, local: np.ndarray) -> np.ndarray:
            taken = mapped.values[row, local]  # a copy: the pages can go
            mapped.release()
            return taken

        return values
    return lambda row, local: block.band(row, 1)[0][local]


def _total(blocks: Sequence[SignatureBlock]) -> int:
    """Records in the blocks (one permutation row read per block)."""
    return sum(int(block.band(0, 1).shape[1]) for block in blocks)


def search(
    blocks: Sequence[SignatureBlock],
    heldout: np.ndarray,
    members: np.ndarray,
    p: HeldoutParams,
    fingerprints: Callable[[np.ndarray], list[np.ndarray]],
    thresholds: np.ndarray | None = None,
    known: Known | None = None,
    moved: np.ndarray | None = None,
    spill: Path | None = None,
) -> HeldoutPairs:
    """Every pair (held-out record, member) at or above its threshold; see the module doc.

    ``heldout`` and ``members`` are global rows (``members`` may include the held-out ones);
    ``fingerprints(rows)`` gets ascending unique rows (in ascending windows, each row once) and
    returns their fingerprint sets, which go to a temporary file in ``spill`` (else the
    system's temporary folder); ``thresholds`` is each global row's threshold (else
    ``p.threshold`` for all);
    ``known(a, b)`` gives the exact Jaccards already computed elsewhere (nan where not), so
    only the other pairs are fingerprinted and verified. With ``moved`` (ascending member
    rows), only the pairs with at least one of them.
    """
    n = len(thresholds) if thresholds is not None else _total(blocks)
    # no name holds the candidates through the verification, only the likely pairs
    packed = candidates(blocks, heldout, members, p, n, moved)
    likely = likely_pairs(blocks, *np.divmod(packed, max(n, 1)), p)
    del packed
    return verified_pairs(likely, p, fingerprints, thresholds, known, spill)


@dataclass(frozen=True)
class LikelyPairs:
    """The candidate pairs the signatures' agreement keeps, and how many candidates there were:
    all the verification needs, so the candidates themselves (~25 MB at 1.1 GB of raw text)
    can go before it reads texts (the search's peak)."""

    a: np.ndarray
    b: np.ndarray
    candidates: int


def likely_pairs(
    blocks: Sequence[SignatureBlock], a: np.ndarray, b: np.ndarray, p: HeldoutParams
) -> LikelyPairs:
    """The estimate: the candidates whose full signatures agree on ``min_agree`` permutations."""
    likely = agreement(blocks, a, b, p.num_perm) >= p.min_agree
    return LikelyPairs(a[likely], b[likely], len(a))


def verified_pairs(
    likely: LikelyPairs,
    p: HeldoutParams,
    fingerprints: Callable[[np.ndarray], list[np.ndarray]],
    thresholds: np.ndarray | None = None,
    known: Known | None = None,
    spill: Path | None = None,
) -> HeldoutPairs:
    """The likely pairs verified (known Jaccards taken as they are), those at or above their
    threshold kept."""
    a, b = likely.a, likely.b
    stats: dict[str, int | float] = {"candidates": likely.candidates, "estimated": len(a)}
    jaccards = np.full(len(a), np.nan) if known is None or not len(a) else known(a, b)
    todo = np.flatnonzero(np.isnan(jaccards))
    jaccards[todo], stats["fingerprinted"] = pair_jaccards(a[todo], b[todo], fingerprints, spill)
    stats["known"], stats["computed"] = len(a) - len(todo), len(todo)
    if thresholds is None:
        need = np.full(len(a), p.threshold)
    else:
        need = np.maximum(thresholds[a], thresholds[b])
    hit = jaccards >= need
    stats["verified"] = len(a)
    stats["pairs"] = int(hit.sum())
    return HeldoutPairs(a[hit], b[hit], jaccards[hit], stats, (a, b, jaccards))
