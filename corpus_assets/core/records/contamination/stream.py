"""Rolling n-gram hashes over a batch of texts held as one code-point stream.

Kept apart from the rules (:mod:`.rules`) because it is an optimisation that must agree with
them exactly: the common record matches nothing, so the record path has to be cheap. A batch of
texts (:func:`batches`, ~256k characters; a longer text goes alone, at ~50 bytes per character)
is tokenised into one stream (:mod:`.tokens`), and every n-gram window of the stream is hashed
with a polynomial rolling hash mod 2**64 from prefix sums, made position independent by the
inverse of the odd base (:meth:`Stream.windows`). Collisions of this hash cost time, never a
result: every hit is confirmed on the real n-gram strings.
"""

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

_BASE = 0x9E3779B97F4A7C15  # odd, so it is invertible mod 2**64
_BATCH_CHARS = 1 << 18
EMPTY = np.empty(0, dtype=np.int64)  # no window / key / record indexes
_NO_HASHES = np.empty(0, dtype=np.uint64)
Spans = tuple[np.ndarray, np.ndarray]


def _no_spans(w: np.ndarray) -> Spans:
    return EMPTY, EMPTY


@dataclass
class Stream:
    """A batch of texts normalised into one code-point stream.

    Text ``r`` is ``out[off[r] + 1 : off[r + 1]]``; each non-empty text starts with one space,
    so every token in the stream is preceded by exactly one space.
    """

    out: np.ndarray
    off: np.ndarray
    prefix: np.ndarray  # uint64 prefix sums of out[t] * BASE**t, len(out) + 1

    @classmethod
    def of(cls, out: np.ndarray, off: np.ndarray) -> "Stream":
        """The stream with its prefix sums, from which any window's hash is two lookups."""
        powers, _ = _powers(out.size)
        prefix = np.empty(out.size + 1, dtype=np.uint64)
        prefix[0] = 0
        terms = prefix[1:]
        np.multiply(out, powers[: out.size], out=terms)
        np.cumsum(terms, out=terms)
        return cls(out, off, prefix)

    def text(self, r: int) -> str:
        """Text ``r``, normalised (what n-grams are confirmed on)."""
        chunk = self.out[self.off[r] + 1 : self.off[r + 1]]
        if chunk.dtype == np.uint8:
            return chunk.tobytes().decode("ascii")
        return chunk.astype("<u4").tobytes().decode("utf-32-le")

    def records_of(self, starts: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.off, starts, side="right") - 1

    def windows(self, mode: str, n: int) -> tuple[np.ndarray, Callable[[np.ndarray], Spans]]:
        """Hashes of every ``mode`` n-gram window of the stream (crossing texts too: callers
        check :meth:`valid` on the few that hit) and a function from window indexes to spans.
        """
        if mode == "char":
            m = self.out.size - n + 1
            if m <= 0:
                return _NO_HASHES, _no_spans
            _, inverse = _powers(m)
            h = self.prefix[n:] - self.prefix[:-n]
            h *= inverse[:m]
            return h, lambda w: (w, w + n)
        spaces = (self.out == 32).nonzero()[0]  # one before every token
        m = spaces.size - n + 1
        if m <= 0:
            return _NO_HASHES, _no_spans
        start = spaces[:m] + 1
        end = np.append(spaces[n:], self.out.size)
        _, inverse = _powers(self.out.size + 1)
        h = self.prefix[end] - self.prefix[start]
        h *= inverse[start]
        return h, lambda w: (start[w], end[w])

    def valid(self, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask, record) for windows: inside one text, not starting at its leading space."""
        rec = self.records_of(start)
        return (start > self.off[rec]) & (end <= self.off[rec + 1]), rec


def batches(texts: Sequence[str]) -> Iterable[tuple[int, int]]:
    """[lo, hi) ranges of about _BATCH_CHARS characters (a longer text is alone)."""
    lo, size = 0, 0
    for i, text in enumerate(texts):
        size += len(text) + 1
        if size >= _BATCH_CHARS:
            yield lo, i + 1
            lo, size = i + 1, 0
    if lo < len(texts):
        yield lo, len(texts)


def _code_points(text: str) -> np.ndarray:
    """Code points as uint8 when the text is ASCII (the common case: 4x less memory)."""
    if text.isascii():
        return np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    return np.frombuffer(text.encode("utf-32-le"), dtype="<u4")


_POWERS: list[tuple[np.ndarray, np.ndarray]] = []


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(BASE**t, BASE**-t) mod 2**64 for t < at least n; grown by doubling, shared."""
    if _POWERS and _POWERS[0][0].size >= n:
        return _POWERS[0]
    size = max(1 << 16, 1 << max(0, n - 1).bit_length())
    forward = np.empty(size, dtype=np.uint64)
    inverse = np.empty(size, dtype=np.uint64)
    forward[0] = inverse[0] = 1
    forward[1:] = _BASE
    inverse[1:] = pow(_BASE, -1, 1 << 64)
    np.cumprod(forward, out=forward)
    np.cumprod(inverse, out=inverse)
    _POWERS[:] = [(forward, inverse)]
    return forward, inverse
