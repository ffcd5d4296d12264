"""Vectorised ``contamination.v2`` tokenisation: a batch of texts as one token stream.

The stream has the layout of :class:`.stream.Stream` (text ``r`` is
``out[off[r] + 1 : off[r + 1]]``, every token preceded by exactly one space), so its rolling
hashes, window spans and validity checks are reused: a window of ``n`` tokens is the substring
from a token's first character to the ``n``-th token's last, spaces included, and its hash is
two prefix-sum lookups. Equal to :func:`.rules.normalise` text for text (tested).
"""

import unicodedata
from collections.abc import Sequence

import numpy as np

from corpus_assets.core.records.contamination.rules import (
    FIRST_UNSPACED as _FIRST_UNSPACED,
)
from corpus_assets.core.records.contamination.rules import normalise, unspaced_table, word_table
from corpus_assets.core.records.contamination.stream import Stream, _code_points


def token_stream(texts: Sequence[str], folded: bool = False) -> Stream:
    """NFKC + casefold per text (unless ``folded``: already done, see :func:`fold`), then every
    ``\\w`` character kept and every run of other characters in front of one replaced by one
    space (the text's separator included)."""
    parts = list(texts) if folded else [fold(t) for t in texts]
    codes = _code_points(" " + " ".join(parts) + " ")
    word = word_table()[codes]
    keep = word.copy()
    keep[:-1] |= word[1:] & ~word[:-1]
    starts = np.cumsum([0] + [len(p) + 1 for p in parts[:-1]], dtype=np.int64)
    counts = np.add.reduceat(keep, starts, dtype=np.int64) if parts else starts
    off = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    out = np.where(word, codes, codes.dtype.type(32))[keep]
    return Stream.of(out, off)


def fold(text: str) -> str:
    """NFKC + casefold; on ASCII (most records) NFKC is the identity and casefold is lower."""
    if text.isascii():
        return text.lower()
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    return text.casefold()


def single_stream(text: str) -> Stream:
    """One text through the reference :func:`normalise`: fewer numpy calls for a short one."""
    normalised = normalise(text)
    if not normalised:
        return Stream.of(np.empty(0, dtype=np.uint8), np.zeros(2, dtype=np.int64))
    return Stream.of(_code_points(" " + normalised), np.array([0, len(normalised) + 1]))


def letter_stream(stream: Stream, every: bool = False) -> Stream | None:
    """The word characters only of the texts holding an unspaced-script character (the others
    are left empty: an unspaced item's letter n-grams are matched only in such texts); None
    when no text holds one. ``every``: all texts chosen (windows of a text that holds one).
    Each chosen text keeps its one leading space, so windows that cross texts stay detectable."""
    out, off = stream.out, stream.off
    lengths = np.diff(off)
    chosen_texts = np.full(lengths.size, every)
    if not every:
        if out.dtype == np.uint8:  # ASCII only
            return None
        high = (out >= _FIRST_UNSPACED).nonzero()[0]
        marked = high[unspaced_table()[out[high]]]
        if not marked.size:
            return None
        chosen_texts[np.searchsorted(off, marked, side="right") - 1] = True
    chosen = chosen_texts.repeat(lengths)
    inner = (out != 32) & chosen
    lead = off[:-1][lengths > 0]
    inner[lead] = chosen[lead]  # the leading spaces
    kept = np.concatenate(([0], np.cumsum(inner, dtype=np.int64)))
    return Stream.of(out[inner], kept[off])
