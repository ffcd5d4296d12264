"""Near-duplicate clustering: sort-based LSH banding, verified edges, deletion scan, leakage.

Input: MinHash signatures (uint32 rows, possibly memory-mapped per chunk), the participants in a
stated total order, and a way to fetch exact shingle fingerprints. Output, per participant: kept
or dropped, the direct match that justified a drop and its Jaccard, and the verified edges.

- **Banding** is sort based and one band at a time: the ``rows`` columns of a band are mixed
  into a 64-bit key per record, the keys are sorted (stable, so ties stay in total order) and
  runs of equal keys are the buckets. Memory is O(records) per band, never O(records x bands),
  and a bucket never becomes an in-memory dict of lists.
- **Star edges with a head cap**: in a bucket, each member is paired only with the members
  before it among the bucket's first ``bucket_heads`` (in total order), not with every other
  member. A template bucket of u records costs at most ``u x bucket_heads`` pairs instead of
  ``u(u-1)/2``; the pairs not examined are counted and reported, because a cap changes recall.
- **Verification** computes the exact Jaccard of the two shingle-fingerprint sets; an LSH
  collision alone never deletes anything. A pair needs ``threshold``, or with per-record
  ``thresholds`` (one per shingle mode, :mod:`.near_rule`) the larger of its two records'.
- **Deletion** scans records in total order. A record is dropped only when a
  candidate that is *kept* directly reaches ``threshold``; its direct match is the first such
  candidate in total order. Kept records may still be linked through dropped ones (in the
  non-transitive chain A-B-C, where only A-B and B-C match, A and C are kept).
- **Leakage**: every verified edge (at or above threshold, in either state) joins two records in
  a union-find; its connected components are the leakage groups the splits layer keeps together.
  A candidate already in the record's component is not re-verified once the record's fate is
  known (it can add neither a match nor a new link).
"""

from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Protocol

import numpy as np

from corpus_assets.core.dedup.class_rows import RankLookup
from corpus_assets.core.dedup.fingerprint_window import FingerprintWindow
from corpus_assets.core.runtime.config import NearDedupPolicy

BAND_KEY = "xor-mul-shift64(seed=band)"
_MIX = np.uint64(0x9E3779B97F4A7C15)
_SHIFT = np.uint64(29)


class SignatureBlock(Protocol):
    """A block of records' signatures that can hand out one band at a time."""

    def band(self, band: int, rows: int) -> np.ndarray:
        """The band's ``rows`` signature components, shape (rows, records), uint32."""
        ...


@dataclass(frozen=True)
class RowMajor:
    """An in-memory (records x num_perm) signature array as a :class:`SignatureBlock`."""

    rows: np.ndarray

    def band(self, band: int, rows: int) -> np.ndarray:
        return self.rows[:, band * rows : (band + 1) * rows].T


DEFAULT = NearDedupPolicy()  # the config's defaults are the parameters': one source


@dataclass(frozen=True)
class LshParams:
    bands: int = DEFAULT.bands
    rows: int = DEFAULT.rows
    threshold: float = float(DEFAULT.threshold)
    bucket_heads: int = DEFAULT.bucket_heads

    @classmethod
    def of(cls, policy: NearDedupPolicy) -> "LshParams":
        return cls(policy.bands, policy.rows, float(policy.threshold), policy.bucket_heads)


@dataclass
class BandStats:
    band: int
    buckets: int  # buckets holding two or more records
    records: int  # records in such buckets
    largest: int
    capped_buckets: int  # buckets larger than bucket_heads + 1
    pairs: int  # (member, head) pairs emitted
    pairs_skipped_by_cap: int  # pairs a full all-pairs expansion would add


class Triples:
    """(x, y, J) appended one at a time by the scan, in three typed arrays: 24 bytes a
    triple, where a list of tuples was ~140 (the near stage's peak at 1.1 GB: ~125k edges)."""

    def __init__(self) -> None:
        self.x, self.y, self.j = array("q"), array("q"), array("d")

    def append(self, x: int, y: int, j: float) -> None:
        self.x.append(x)
        self.y.append(y)
        self.j.append(j)

    def __len__(self) -> int:
        return len(self.x)

    def __iter__(self) -> Iterator[tuple[int, int, float]]:
        return zip(self.x, self.y, self.j, strict=True)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Triples) and (self.x, self.y, self.j) == (
            other.x,
            other.y,
            other.j,
        )

    __hash__ = None  # type: ignore[assignment]  # mutable

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """x and y as int64, J as float64 (copies)."""
        return (
            np.array(self.x, dtype=np.int64),
            np.array(self.y, dtype=np.int64),
            np.array(self.j, dtype=np.float64),
        )


@dataclass
class NearResult:
    """By rank (position in the class's total order): the dropped records with their direct
    matches (every other record is kept), the verified edges. Sparse: a class's scan holds
    O(pairs), never an array over its records; ``kept``, ``match`` and ``match_jaccard`` are
    the dense views, built on demand (tests, benchmarks)."""

    n: int  # the class's records
    dropped: np.ndarray  # int64 ranks of the dropped records, ascending
    dropped_match: np.ndarray  # int64 rank of each one's direct match
    dropped_jaccard: np.ndarray  # float64, its Jaccard
    edges: Triples  # verified (x, y, J) with J >= threshold, y < x
    bands: list[BandStats] = field(default_factory=list)
    candidate_pairs: int = 0  # unique (x, y) pairs after all bands
    verified_pairs: int = 0  # exact Jaccard computations
    skipped_same_group: int = 0  # candidates already linked once the record's fate was known
    fingerprinted: int = 0  # records in candidate pairs (whose fingerprints a full scan needs)
    fingerprinted_now: int = 0  # records fingerprinted in this run (fewer with known pairs)
    computed_pairs: int = 0  # exact Jaccards computed in this run (the rest were known)
    pair_x: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    pair_y: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    verified: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.float64))

    @property
    def kept(self) -> np.ndarray:
        """Per rank, whether the record is kept."""
        kept = np.ones(self.n, dtype=bool)
        kept[self.dropped] = False
        return kept

    @property
    def match(self) -> np.ndarray:
        """Per rank, its direct match's rank (-1: kept)."""
        match = np.full(self.n, -1, dtype=np.int64)
        match[self.dropped] = self.dropped_match
        return match

    @property
    def match_jaccard(self) -> np.ndarray:
        """Per rank, its direct match's Jaccard (nan: kept)."""
        jaccard = np.full(self.n, np.nan, dtype=np.float64)
        jaccard[self.dropped] = self.dropped_jaccard
        return jaccard


def s_curve(bands: int, rows: int) -> list[dict[str, float]]:
    """Candidate probability 1 - (1 - s^r)^b at s = 0.50, 0.55, ..., 0.95."""
    points = [round(0.5 + 0.05 * i, 2) for i in range(10)]
    return [{"s": s, "p": round(1.0 - (1.0 - s**rows) ** bands, 6)} for s in points]


def band_keys(columns: np.ndarray, band: int) -> np.ndarray:
    """64-bit key per record of one band, from its (rows, records) uint32 components, folded
    with xor-multiply-shift.

    Two records share a key when the components are equal; a 64-bit fold collision only adds a
    candidate, which verification then rejects.
    """
    seed = ((band + 1) * int(_MIX)) & 0xFFFFFFFFFFFFFFFF
    key = np.full(columns.shape[1], seed, dtype=np.uint64)
    for row in columns:
        key ^= row.astype(np.uint64)
        key *= _MIX
        key ^= key >> _SHIFT
    return key


def _unique(values: np.ndarray) -> np.ndarray:
    """Sorted unique values by sort + mask (numpy 2's hash-based ``unique`` is far slower here)."""
    values = np.sort(values)
    return values[np.r_[True, values[1:] != values[:-1]]] if len(values) else values


def star_pairs(
    sorted_keys: np.ndarray, by_key: np.ndarray, n: int, heads: int, band: int
) -> tuple[np.ndarray, BandStats]:
    """(x, y) rank pairs, y < x, packed as ``x * n + y``, of one band's buckets (star + cap),
    from records sorted by (key, rank) (:func:`sorted_band`): ``by_key`` their ranks, ``n`` the
    class size (for packing). Any subset of whole buckets gives those buckets' pairs
    and figures, so a band-key partition (:mod:`.band_tasks`) needs no other records."""
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    sizes = np.diff(np.r_[starts, len(sorted_keys)])
    multi = sizes >= 2
    stats = BandStats(
        band=band,
        buckets=int(multi.sum()),
        records=int(sizes[multi].sum()),
        largest=int(sizes.max(initial=0)),
        capped_buckets=int((sizes > heads + 1).sum()),
        pairs=0,
        pairs_skipped_by_cap=0,
    )
    if not stats.buckets:
        return np.empty(0, dtype=np.int64), stats
    in_multi = np.repeat(multi, sizes)  # sorted positions inside a bucket of two or more
    positions = np.flatnonzero(in_multi)
    run_starts = np.repeat(starts, sizes)[in_multi]
    offset = positions - run_starts  # position of the member inside its bucket
    fan = np.minimum(offset, heads)  # heads before this member
    member = np.repeat(positions, fan)
    first = np.repeat(run_starts, fan)
    step = np.arange(len(member)) - np.repeat(np.cumsum(fan) - fan, fan)
    x = by_key[member].astype(np.int64)
    y = by_key[first + step].astype(np.int64)
    stats.pairs = len(x)
    full = (sizes[multi] * (sizes[multi] - 1) // 2).sum()
    stats.pairs_skipped_by_cap = int(full - stats.pairs)
    return x * n + y, stats


def sorted_bands(
    signature_chunks: Sequence[SignatureBlock], order: np.ndarray, params: LshParams
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Each band's keys of the records at the ranks of ``order`` in bucket order (sorted, ties
    in rank order), with the ranks in that order. One band is in memory at a time."""
    for band in range(params.bands):
        yield sorted_band(band_keys_of(signature_chunks, band, params.rows)[order])


def band_keys_of(signature_chunks: Sequence[SignatureBlock], band: int, rows: int) -> np.ndarray:
    """One band's key of every record of ``signature_chunks`` (their concatenation)."""
    return np.concatenate(
        [band_keys(chunk.band(band, rows), band) for chunk in signature_chunks]
        or [np.empty(0, dtype=np.uint64)]
    )


def sorted_band(keys_by_rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keys in bucket order and the ranks in that order (a stable sort: ties keep rank order)."""
    by_key = np.argsort(keys_by_rank, kind="stable")
    return keys_by_rank[by_key], by_key


def candidate_pairs(
    signature_chunks: Sequence[SignatureBlock],
    order: np.ndarray,
    params: LshParams,
    bands: Iterable[tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[np.ndarray, list[BandStats]]:
    """Unique packed (x, y) rank pairs over all bands, sorted by x then y.

    ``signature_chunks`` are blocks whose concatenation indexes records; ``order`` lists the
    participating record indices in total order. ``bands``, if given, yields each band in
    bucket order instead (:func:`sorted_bands`' output, e.g. from a parent's band index).
    """
    pending: list[np.ndarray] = []
    pending_rows = compacted = 0
    stats = []
    n = len(order)
    for band, (sorted_keys, by_key) in enumerate(
        bands if bands is not None else sorted_bands(signature_chunks, order, params)
    ):
        band_pairs, band_stats = star_pairs(sorted_keys, by_key, n, params.bucket_heads, band)
        stats.append(band_stats)
        pending.append(band_pairs)
        pending_rows += len(band_pairs)
        if pending_rows > 2 * compacted + (1 << 20):  # the same pairs recur across bands
            pending = [_unique(np.concatenate(pending))]
            pending_rows = compacted = len(pending[0])
    pairs = _unique(np.concatenate(pending)) if pending else np.empty(0, dtype=np.int64)
    return pairs, stats


class UnionFind:
    """Union-find over 0..n-1 with path halving; the smaller index becomes the root, so a
    component is named by its smallest member."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def near_dedup(
    signature_chunks: Sequence[SignatureBlock],
    order: np.ndarray,
    params: LshParams,
    fingerprints: Callable[[np.ndarray], list[np.ndarray]],
    jaccard: Callable[[np.ndarray, np.ndarray], float],
    prefetch: Callable[[np.ndarray], None] | None = None,
    thresholds: RankLookup | None = None,
    known: Callable[[np.ndarray], np.ndarray] | None = None,
    fresh: np.ndarray | None = None,
    bands: Iterable[tuple[np.ndarray, np.ndarray]] | None = None,
) -> NearResult:
    """The deletion scan over LSH candidates; see the module docstring.

    ``fingerprints(ranks)`` returns the sorted-unique shingle fingerprints of the records at
    those ranks (only records that share a bucket are asked for, a window at a time);
    ``prefetch``, if given, first receives every rank that will be asked for, ascending, once;
    ``jaccard`` compares two; ``thresholds``, if given, is each rank's threshold (a pair needs
    the larger of its two), else every pair needs ``params.threshold``. ``known``, if given,
    maps the packed candidate pairs (``x * n + y``) to Jaccards already verified elsewhere (nan
    when not): those are used as they are, and only records of the other pairs are fetched.
    ``fresh``, if given with ``known``, flags each rank whose record is new since the known
    pairs were verified: only the unknown pairs with a fresh record are scheduled (windowed,
    ``prefetch``), any other record is fetched alone if the scan verifies one of its pairs
    (most such pairs the earlier scan skipped too, and this one skips again).
    The scan, and so every verdict, edge and count, is the same with or without ``known``.
    ``bands``, if given, are the class's bands in bucket order (:func:`candidate_pairs`).
    """
    n = len(order)
    pairs, band_stats = candidate_pairs(signature_chunks, order, params, bands)
    result = _unscanned(n, band_stats, len(pairs))
    if not len(pairs):
        return result
    cached = known(pairs) if known is not None else np.full(len(pairs), np.nan)
    xs, ys = np.divmod(pairs, n)
    del pairs
    unknown = np.isnan(cached)
    scheduled = unknown if fresh is None else unknown & (fresh[xs] | fresh[ys])
    prints = None
    if unknown.any():
        prints = FingerprintWindow(xs[scheduled], ys[scheduled], fingerprints)
    if prints is not None and prefetch is not None:
        prefetch(prints.involved)
    _scan(result, xs, ys, cached, prints, jaccard, params.threshold, thresholds)
    if prints is not None:
        result.fingerprinted_now = len(prints.involved) + prints.late_fetched
    return result


def _unscanned(n: int, band_stats: list[BandStats], candidates: int) -> NearResult:
    """Every record kept, no match yet: what the scan starts from."""
    none = np.empty(0, dtype=np.int64)
    return NearResult(
        n, none, none, np.empty(0, np.float64), Triples(), band_stats, candidate_pairs=candidates
    )


def scan_verified(
    n: int,
    pairs: np.ndarray,
    jaccards: np.ndarray,
    band_stats: list[BandStats],
    params: LshParams,
    thresholds: RankLookup | None = None,
) -> NearResult:
    """:func:`near_dedup`'s result when every candidate pair's Jaccard is already known
    (``pairs`` unique packed ``x * n + y``, sorted; verified on workers): the same scan, so the
    same verdicts, edges and counts, with nothing fetched here."""
    result = _unscanned(n, band_stats, len(pairs))
    if not len(pairs):
        return result
    xs, ys = np.divmod(pairs, n)
    _scan(result, xs, ys, jaccards, None, _no_jaccard, params.threshold, thresholds)
    return result


def _no_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    raise AssertionError("a pair to verify, but every pair was known")


def _nothing_unknown(record: int) -> np.ndarray:
    raise AssertionError(f"record {record}: a pair to verify, but every pair was known")


def _scan(
    result: NearResult,
    xs: np.ndarray,
    ys: np.ndarray,
    cached: np.ndarray,
    prints: FingerprintWindow | None,
    jaccard: Callable[[np.ndarray, np.ndarray], float],
    tau: float,
    thresholds: RankLookup | None,
) -> None:
    """The scan in total order: dropped records, direct matches, edges and every pair's
    Jaccard (``result.verified``, nan for pairs skipped). Its state (kept flags, the leakage
    union-find, thresholds) is over the records in a pair only, numbered in rank order: the
    components run on the edges' records, not on the class."""
    touched = _unique(np.concatenate([xs, ys]))  # ranks; local numbers keep their order
    result.fingerprinted = len(touched)
    local_x, local_y = np.searchsorted(touched, xs), np.searchsorted(touched, ys)
    groups = UnionFind(len(touched))
    alive = bytearray(b"\x01") * len(touched)  # kept flags: cheap to index in the loop
    taus = thresholds[touched].tolist() if thresholds is not None else None
    verified = np.full(len(xs), np.nan, dtype=np.float64)
    dropped = Triples()  # (x, its direct match, J), x ascending (the scan's order)
    bounds = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1], True]).tolist()
    get = prints.get if prints is not None else _nothing_unknown
    for lo, hi in pairwise(bounds):
        x, u = int(xs[lo]), int(local_x[lo])
        tau_x = tau if taus is None else taus[u]
        if prints is not None:
            prints.before(x)
        direct, direct_j = -1, np.nan
        ys_x, vs_x = ys[lo:hi].tolist(), local_y[lo:hi].tolist()
        cached_x = cached[lo:hi].tolist()
        # ascending rank: the first kept match is the direct one
        for i, (y, v) in enumerate(zip(ys_x, vs_x, strict=True)):
            if (direct >= 0 or not alive[v]) and groups.find(u) == groups.find(v):
                result.skipped_same_group += 1
                continue
            j = cached_x[i]
            if j != j:  # nan: not verified before
                j = jaccard(get(x), get(y))
                result.computed_pairs += 1
            verified[lo + i] = j
            result.verified_pairs += 1
            if j >= (tau_x if taus is None else max(tau_x, taus[v])):
                groups.union(u, v)
                result.edges.append(x, y, j)
                if direct < 0 and alive[v]:
                    direct, direct_j = y, j
        if direct >= 0:
            alive[u] = 0
            dropped.append(x, direct, direct_j)
        if prints is not None:
            prints.after(x)
    if len(dropped):
        result.dropped, result.dropped_match, result.dropped_jaccard = dropped.arrays()
    result.verified = verified
    result.pair_x, result.pair_y = xs, ys
