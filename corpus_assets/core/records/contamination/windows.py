"""Bounded windows of one long folded text, so the v2 screen's arrays are O(window), not O(text).

A window ends just before a non-word character (no token is cut) and the next one starts at
the token holding the last ``words - 1`` tokens / ``letters - 1`` word characters before that
end. A span of at most ``words`` tokens (or ``letters`` word characters) that crosses a cut
therefore starts inside the overlap, and since every window holds more than the overlap, each
such span lies whole in some window: matching window by window sees every n-gram and every
short item the whole text holds, and nothing else (windows start at real token starts). The
text is folded a piece at a time too (:func:`folded_windows`), so no whole-text copy is held.
"""

import re
from collections.abc import Iterator

import numpy as np

from corpus_assets.core.records.contamination.rules import unspaced_table, word_table
from corpus_assets.core.records.contamination.stream import _code_points
from corpus_assets.core.records.contamination.tokens import fold

WINDOW_CHARS = 1 << 18  # a longer text is screened in windows of about this size (a batch)
_NON_WORD = re.compile(r"\W")  # the complement of ``word_table`` (built from ``\w``)
_SAFE = re.compile("[\x00-\x7f\u4e00-\u9fff]")  # safe places to fold a text in pieces
_TAIL = 256


def windows(folded: str, window: int, words: int, letters: int) -> Iterator[tuple[int, int]]:
    """``[start, end)`` windows of at least ``window`` characters covering ``folded``."""
    start = 0
    while True:
        end, nxt = _step(folded, start, window, words, letters)
        yield start, end
        if end >= len(folded):
            return
        start = nxt


def folded_windows(text: str, window: int, words: int, letters: int) -> Iterator[str]:
    """The windows of ``fold(text)``, folding a piece at a time: no whole folded copy is held.
    A window is yielded once it ends before the buffer's end, so it is the one of the whole."""
    buf = ""
    for piece in _folded_pieces(text, window):
        buf += piece
        start = 0
        while len(buf) - start >= 2 * window:
            end, nxt = _step(buf, start, window, words, letters)
            if end >= len(buf):
                break
            yield buf[start:end]
            start = nxt
        buf = buf[start:]
    yield from (buf[lo:hi] for lo, hi in windows(buf, window, words, letters))


def _folded_pieces(text: str, size: int) -> Iterator[str]:
    """``fold`` of consecutive pieces of ``text``, cut before an ASCII character or a CJK
    ideograph: a starter that composes with neither neighbour, so the pieces join to the fold
    of the whole (case folding is per character)."""
    lo = 0
    while lo < len(text):
        found = _SAFE.search(text, lo + size)
        hi = found.start() if found else len(text)
        yield fold(text[lo:hi])
        lo = hi


def _step(folded: str, start: int, window: int, words: int, letters: int) -> tuple[int, int]:
    """(end, next start) of the window from ``start`` (end = the text's length: the last one)."""
    end = start
    while True:
        end = _cut(folded, max(end + 1, start + window))
        if end >= len(folded):
            return len(folded), len(folded)
        nxt = _overlap(folded, start, end, words - 1, letters - 1)
        if nxt > start:  # else the window holds too few tokens: widen it
            return end, nxt


def _cut(folded: str, at: int) -> int:
    """The first non-word character at or after ``at`` (the text's length if none)."""
    found = _NON_WORD.search(folded, min(at, len(folded)))
    return found.start() if found else len(folded)


def _overlap(folded: str, start: int, end: int, words: int, letters: int) -> int:
    """Start of the token holding the ``words``-th last token and the ``letters``-th last word
    character before ``end`` (``end`` when both are 0; ``start`` when the window is too short)."""
    if not words and not letters:
        return end
    span = _TAIL
    while True:
        lo = max(start, end - span)
        word = word_table()[_code_points(folded[lo:end])]
        heads = np.flatnonzero(word & ~np.concatenate(([False], word[:-1])))
        if lo > start and heads.size and heads[0] == 0 and word_table()[ord(folded[lo - 1])]:
            heads = heads[1:]  # a token cut by the tail's start
        found = _earliest(heads, np.flatnonzero(word), words, letters)
        if found is not None:
            return lo + found
        if lo == start:
            return start
        span *= 4


def _earliest(heads: np.ndarray, chars: np.ndarray, words: int, letters: int) -> int | None:
    """The earliest of the two token starts in tail coordinates (None: the tail is too short)."""
    best = np.iinfo(np.int64).max
    if words:
        if heads.size < words:
            return None
        best = int(heads[-words])
    if letters:
        if chars.size < letters:
            return None
        at = np.searchsorted(heads, chars[-letters], side="right") - 1
        if at < 0:
            return None
        best = min(best, int(heads[at]))
    return best


def holds_unspaced(text: str, window: int) -> bool:
    """Whether a word character of ``fold(text)`` belongs to an unspaced script (a piece at a
    time)."""
    for piece in _folded_pieces(text, window):
        codes = _code_points(piece)
        if codes.dtype != np.uint8 and (unspaced_table()[codes] & word_table()[codes]).any():
            return True
    return False
