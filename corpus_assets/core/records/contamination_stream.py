"""Vectorised contamination normalisation and n-gram hashing over batches of texts.

Kept apart from the rules (:mod:`.contamination`) because it is an optimisation that must
agree with them exactly: the common record matches nothing, so the record path has to be cheap.
A batch of texts (:func:`batches`, ~256k characters; a longer text goes alone, at ~50 bytes per
character) is normalised into one code-point stream (:func:`normalise_stream`, the equivalent
of :func:`.contamination.normalise`), and every n-gram window of the stream is hashed with a
polynomial rolling hash mod 2**64 from prefix sums, made position independent by the inverse of
the odd base (:meth:`Stream.windows`). Collisions of this hash cost time, never a result: every
hit is confirmed on the real n-gram strings.
"""

import functools
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from corpus_assets.core.records.contamination import PUNCT, SPACE, WORD, char_classes, normalise

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

    @classmethod
    def single(cls, text: str) -> "Stream":
        """One text through :func:`normalise`: fewer numpy calls than the batch path."""
        normalised = normalise(text)
        if not normalised:
            return cls.of(np.empty(0, dtype=np.uint8), np.zeros(2, dtype=np.int64))
        return cls.of(_code_points(" " + normalised), np.array([0, len(normalised) + 1]))

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


def normalise_stream(texts: Sequence[str]) -> Stream:
    """:func:`normalise` for a batch, vectorised over code points.

    Each text gets a leading separator space (and the stream a trailing one), so every token
    has whitespace on both sides. A punctuation run is kept only with word characters on both
    sides (inside a token); a whitespace character is kept, as one space, only right before a
    token's first kept character.
    """
    parts = [unicodedata.normalize("NFC", t).casefold() for t in texts]
    codes, classes, spaced = _classified(" " + " ".join(parts) + " ")
    word = classes == WORD
    keep = word.copy()
    keep[:-1] |= (classes[:-1] == SPACE) & word[1:]
    punct = np.flatnonzero(classes == PUNCT)
    if punct.size:
        breaks = np.flatnonzero(np.diff(punct) != 1)
        first = punct[np.concatenate(([0], breaks + 1))]
        last = punct[np.append(breaks, punct.size - 1)]
        before, after = classes[first - 1], classes[last + 1]
        inner = (before == WORD) & (after == WORD)
        if inner.any():
            keep[punct[np.repeat(inner, last - first + 1)]] = True
        keep[first[(before == SPACE) & (after == WORD)] - 1] = True
    starts = np.zeros(len(parts), dtype=np.int64)
    np.cumsum(np.fromiter(map(len, parts[:-1]), np.int64, len(parts) - 1) + 1, out=starts[1:])
    counts = np.add.reduceat(keep, starts, dtype=np.int64) if parts else EMPTY
    off = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    if spaced is not None:
        return Stream.of(spaced[keep], off)
    out = codes[keep]
    out[classes[keep] == SPACE] = 32
    return Stream.of(out, off)


@functools.cache
def _ascii_tables() -> tuple[bytes, bytes]:
    """``bytes.translate`` tables of ASCII: the class of each byte, and each byte with every
    whitespace byte made a space (what the stream keeps of a kept whitespace character)."""
    classes = char_classes()[:256]
    return bytes(classes.tolist()), bytes(32 if c == SPACE else b for b, c in enumerate(classes))


def _classified(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(code points, their classes, code points with whitespace as 32 or None)``.

    ASCII text (the common case) is classified by ``bytes.translate``, which runs at memory
    speed where a numpy lookup in the Unicode-wide table costs a gather per character; its
    third array lets the kept characters be taken once. Other text takes the table."""
    if text.isascii():
        raw = text.encode("ascii")
        classes, spaces = _ascii_tables()
        return (
            np.frombuffer(raw, dtype=np.uint8),
            np.frombuffer(raw.translate(classes), dtype=np.uint8),
            np.frombuffer(raw.translate(spaces), dtype=np.uint8),
        )
    codes = _code_points(text)
    return codes, char_classes()[codes], None


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
