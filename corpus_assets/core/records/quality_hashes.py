"""Bounded-memory counts for the quality rules on long texts: lines and word n-grams by hash.

A record may hold up to 16M characters; ``str.split`` plus sets of words and n-gram tuples
peaks at ~13x its UTF-8 size. Here the text is read ``chunk`` characters at a time as code
points (numpy), each whitespace-split word or ``\\n``-split line gets a deterministic 64-bit
key (a polynomial over its code points mod 2**64, then a splitmix64 finaliser; never Python's
randomised ``hash``), a word or line cut by a piece's end is carried into the next piece, and
distinct keys are counted in sorted numpy arrays. When the distinct keys would exceed
``limit``, the key space is split by its top bits and the text is re-read once per part, so
memory stays bounded whatever the text (time grows instead).

Whitespace is exactly ``str.isspace`` (what ``str.split()`` and ``str.strip()`` use), so the
results equal the exact ``Counter``/``set`` counts except on a 64-bit key collision (two
different words, lines or n-grams with the same key, ~n**2/2**65 for n distinct ones).
"""

import functools
from collections.abc import Callable, Iterator

import numpy as np

U64 = np.uint64
_MASK = (1 << 64) - 1
_K = 0x9E3779B97F4A7C15  # odd, so invertible mod 2**64
_K_INV = pow(_K, -1, 1 << 64)
_LENGTH_SALT = 0xD6E8FEB86659FD93
_GRAM_SALT = 0xA0761D6478BD642F
# Whitespace by code point (none above U+3000, a test checks); the last entry (False) stands
# for every code point above the table.
_WS_END = 0x3001
_WS = np.array([chr(cp).isspace() for cp in range(_WS_END)] + [False])
_MIN_LIMIT = 1 << 16
Stream = Callable[[], Iterator[tuple[np.ndarray, np.ndarray | None]]]


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise in wrapping uint64."""
    z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
    return z ^ (z >> U64(31))


def _pieces(text: str, chunk: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(code points, whitespace mask) of each ``chunk``-character piece of ``text``."""
    for start in range(0, len(text), chunk):
        raw = text[start : start + chunk].encode("utf-32-le", "surrogatepass")
        cps = np.frombuffer(raw, dtype="<u4")
        yield cps, _WS[np.minimum(cps, _WS_END)]


def _segment_raws(cps: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """sum((cp_i + 1) * K**(i - start)) over each [start, end) of ``cps``, mod 2**64."""
    n = len(cps)
    powers, inverse = _powers(n)
    prefix = np.zeros(n + 1, dtype=U64)
    np.cumsum((cps.astype(U64) + U64(1)) * powers[:n], out=prefix[1:])
    return (prefix[ends] - prefix[starts]) * inverse[starts]


@functools.lru_cache(maxsize=2)
def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """K**i and K**-i mod 2**64 for i in 0..n (one piece's worth, kept for the next piece)."""
    tables = np.full((2, n + 1), [[_K], [_K_INV]], dtype=U64)
    tables[:, 0] = 1
    np.cumprod(tables, axis=1, out=tables)
    return tables[0], tables[1]


def _join(raw1: int, len1: int, raw2: int) -> int:
    """The raw sum of a segment cut after ``len1`` code points, from its two parts."""
    return (raw1 + pow(_K, len1, 1 << 64) * raw2) & _MASK


def _keys(raws: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Final 64-bit keys of segments from their raw sums and lengths."""
    return _mix(raws ^ (lengths.astype(U64) * U64(_LENGTH_SALT)))


def word_keys(text: str, chunk: int) -> Iterator[np.ndarray]:
    """Keys of ``text.split()``'s words in order, a piece at a time."""
    carry: tuple[int, int] | None = None  # (raw, length) of a word cut by a piece's end
    for cps, space in _pieces(text, chunk):
        edges = np.diff((~space).view(np.int8), prepend=np.int8(0), append=np.int8(0))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        raws, lengths = _segment_raws(cps, starts, ends), ends - starts
        if carry is not None and len(starts) and starts[0] == 0:
            raws[0] = _join(carry[0], carry[1], int(raws[0]))
            lengths[0] += carry[1]
        elif carry is not None:
            yield _keys(np.array([carry[0]], U64), np.array([carry[1]]))
        carry = None
        if len(ends) and ends[-1] == len(cps):
            carry = int(raws[-1]), int(lengths[-1])
            raws, lengths = raws[:-1], lengths[:-1]
        yield _keys(raws, lengths)
    if carry is not None:
        yield _keys(np.array([carry[0]], U64), np.array([carry[1]]))


def gram_keys(text: str, n: int, chunk: int) -> Iterator[np.ndarray]:
    """Keys of the word ``n``-grams of ``text`` in order (``n`` = 1: the word keys)."""
    tail = np.empty(0, dtype=U64)
    for keys in word_keys(text, chunk):
        run = np.concatenate([tail, keys])
        count = len(run) - n + 1
        if count > 0:
            grams = run[:count]
            for j in range(1, n):
                grams = _mix(grams * U64(_GRAM_SALT) + run[j : j + count])
            yield grams
        tail = run[max(count, 0) :]


def _line_parts(cps: np.ndarray, space: np.ndarray) -> tuple[np.ndarray, ...]:
    """(raws, lengths, first, last non-whitespace offset or -1) of a piece's ``\\n`` segments."""
    breaks = np.flatnonzero(cps == 10)
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [len(cps)]])
    visible = np.append(np.flatnonzero(~space), len(cps))  # a sentinel past the end
    lo = np.searchsorted(visible, starts)
    hi = np.searchsorted(visible, ends) - 1
    has = hi >= lo
    first = np.where(has, visible[lo] - starts, -1)
    last = np.where(has, visible[np.maximum(hi, 0)] - starts, -1)
    return _segment_raws(cps, starts, ends), ends - starts, first, last


def line_items(text: str, chunk: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(keys, stripped lengths) of ``text.split("\\n")``'s lines in order, a piece at a time."""
    raw, length, first, last = 0, 0, -1, -1  # the line cut by the previous piece's end
    for cps, space in _pieces(text, chunk):
        raws, lengths, firsts, lasts = _line_parts(cps, space)
        f2, l2 = int(firsts[0]), int(lasts[0])
        raws[0] = _join(raw, length, int(raws[0]))
        firsts[0] = first if first >= 0 else (length + f2 if f2 >= 0 else -1)
        lasts[0] = length + l2 if l2 >= 0 else last
        lengths[0] += length
        raw, length, first, last = int(raws[-1]), int(lengths[-1]), int(firsts[-1]), int(lasts[-1])
        sizes = np.where(firsts >= 0, lasts - firsts + 1, 0)[:-1]
        yield _keys(raws[:-1], lengths[:-1]), sizes
    size = last - first + 1 if first >= 0 else 0
    yield _keys(np.array([raw], U64), np.array([length])), np.array([size])


class _Part:
    """Distinct keys (and one weight each) whose top ``bits`` bits equal ``part``."""

    def __init__(self, bits: int, part: int) -> None:
        self.bits, self.part = bits, part
        self.keys = np.empty(0, dtype=U64)
        self.weights: np.ndarray | None = None
        self.pending: list[tuple[np.ndarray, np.ndarray | None]] = []
        self.pending_size = 0

    def _select(
        self, keys: np.ndarray, weights: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        if not self.bits:
            return keys, weights
        inside = (keys >> U64(64 - self.bits)) == U64(self.part)
        return keys[inside], None if weights is None else weights[inside]

    def add(self, keys: np.ndarray, weights: np.ndarray | None, limit: int) -> None:
        """Take a piece's keys; merge when pending outgrows the sorted set, split when full."""
        keys, weights = self._select(keys, weights)
        self.pending.append((keys, weights))
        self.pending_size += len(keys)
        if self.pending_size > max(len(self.keys), limit // 4):
            self.merge()
        while len(self.keys) > limit and self.bits < 48:
            self.bits, self.part = self.bits + 1, self.part * 2
            self.keys, self.weights = self._select(self.keys, self.weights)

    def merge(self) -> None:
        """Fold the pending keys into the sorted distinct ones."""
        keys = np.concatenate([self.keys, *(k for k, _ in self.pending)])
        self.keys = np.empty(0, dtype=U64)
        weights = self.weights
        if weights is not None or (self.pending and self.pending[0][1] is not None):
            parts = [] if weights is None else [weights]
            weights = np.concatenate(parts + [w for _, w in self.pending if w is not None])
            order = np.argsort(keys, kind="stable")
            keys, weights = keys[order], weights[order]
            del order
        else:
            keys.sort()
        self.pending, self.pending_size = [], 0
        first = np.empty(len(keys), dtype=bool)
        first[:1] = True
        np.not_equal(keys[1:], keys[:-1], out=first[1:])
        self.keys = keys[first]
        self.weights = None if weights is None else weights[first]


def distinct(stream: Stream, limit: int) -> tuple[int, int, int, int]:
    """(keys, their weight, distinct keys, one weight per distinct key) over ``stream()``.

    Reads the stream once per part of the key space; parts are split (top bits) while a
    part holds more than ``limit`` distinct keys, so memory stays near ``limit`` keys.
    """
    seen = seen_weight = count = weight = 0
    part = _Part(0, 0)
    first_pass = True
    while True:
        for keys, weights in stream():
            if first_pass:
                seen += len(keys)
                seen_weight += 0 if weights is None else int(weights.sum())
            part.add(keys, weights, limit)
        part.merge()
        first_pass = False
        count += len(part.keys)
        weight += 0 if part.weights is None else int(part.weights.sum())
        if part.part + 1 == 1 << part.bits:
            return seen, seen_weight, count, weight
        part = _Part(part.bits, part.part + 1)


def _limit(text: str) -> int:
    """Distinct keys held at once: ~1/32 of the text's characters (each key costs ~40 B)."""
    return max(_MIN_LIMIT, len(text) // 32)


def hashed_line_chars(text: str, chunk: int) -> tuple[int, int]:
    """``_repeated_line_chars`` by line keys: equal to it but on a 64-bit key collision."""
    # Half the limit: a weighted merge also sorts an order and the weights.
    stream = functools.partial(line_items, text, chunk)
    lines, total, unique, unique_chars = distinct(stream, _limit(text) // 2)
    return (0, 0) if unique == lines else (total - unique_chars, total)


def hashed_ngrams(text: str, n: int, ppm: int, chunk: int) -> tuple[int, int]:
    """``_repeated_ngrams`` by word keys: equal to it but on a 64-bit key collision."""
    words, _, unique_words, _ = distinct(
        lambda: ((k, None) for k in word_keys(text, chunk)), _limit(text)
    )
    total = words - n + 1
    if total <= 0:
        return 0, 0
    if (words - unique_words) * 1_000_000 <= ppm * total:
        return 0, total
    _, _, unique, _ = distinct(lambda: ((k, None) for k in gram_keys(text, n, chunk)), _limit(text))
    return total - unique, total
