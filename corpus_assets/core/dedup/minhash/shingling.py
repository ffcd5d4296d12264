"""Normalisation and shingling shared by both MinHash versions (the input side of a signature).

Kept apart from the hashing so both versions see byte-for-byte the same shingles, and so the
v2 vectorised path can reuse :func:`normalise` and :func:`is_unspaced` on whole blocks.

The text is normalised: NFC, casefold, every run of whitespace (``str.split()``) collapsed to
one space, ends trimmed (then NFC again if casefolding denormalised it). Texts written mostly in
unspaced scripts (Han, kana, Thai, Lao, Khmer, Myanmar, Tibetan characters are at least a third
of those plus all other letters) are *char mode*: the units are the code points of the
normalised text (spaces included) and ``n = shingle_chars``. Every other text is *word mode*:
the units are the space-separated tokens of the normalised text (``norm.split(" ")``) and
``n = shingle_words``. A shingle is ``n`` consecutive units; a text with fewer than ``n`` units
yields one shingle of all its units (so a short document still has a non-empty set); the empty
(or all-whitespace) text yields none. Shingles are a set: duplicates are dropped, first
occurrence order kept. As text a shingle is its units joined by ``" "`` (word mode) or by
``""`` (char mode), i.e. a substring of the normalised text.

From ``minhash.v3`` on an unspaced text is not char mode: its normalised text is cut into ICU
words (:func:`.segment.segment_words`, joined by single spaces) and shingled as word mode.
"""

import re
import unicodedata
from collections.abc import Sequence

from corpus_assets.core.dedup.minhash.segment import segment_words
from corpus_assets.core.dedup.minhash.spec import DEFAULT_SPEC, SignatureSpec, segments_unspaced

_UNSPACED_BLOCKS = (
    "\u0e00-\u0e7f\u0e80-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff"
    "\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003134f"
)
_UNSPACED = re.compile(f"[{_UNSPACED_BLOCKS}]")
_NOT_UNSPACED = re.compile(f"[^{_UNSPACED_BLOCKS}]+")
_LETTER = re.compile(r"[^\W\d_]")
# Every character with str.isspace(): longer texts than _SPLIT_MAX are split into segments of
# about _SEGMENT characters that end at one of them, so no token is cut and the collapse is the
# same as " ".join(text.split()) without a list of every token.
_SPACES = dict.fromkeys(
    [
        *range(0x09, 0x0E),
        *range(0x1C, 0x21),
        *(0x85, 0xA0, 0x1680),
        *range(0x2000, 0x200B),
        *(0x2028, 0x2029, 0x202F, 0x205F, 0x3000),
    ],
    " ",
)
_SPLIT_MAX = 1 << 16
_SEGMENT = 1 << 16
_WHITESPACE = re.compile("[" + re.escape("".join(map(chr, _SPACES))) + "]")


def normalise(text: str) -> str:
    """The normalised text every shingle is cut from (see module docstring)."""
    text = unicodedata.normalize("NFC", text).casefold()
    # A long text the same way without a list of every token (so in a few copies' memory).
    text = " ".join(text.split()) if len(text) <= _SPLIT_MAX else _collapse_segments(text)
    if text.isascii() or unicodedata.is_normalized("NFC", text):
        return text
    return unicodedata.normalize("NFC", text)  # casefolding can decompose


def _collapse_segments(text: str) -> str:
    """``" ".join(text.split())`` a segment at a time; each segment ends where whitespace
    starts, so the segments' tokens are the text's tokens (one pass, unlike repeated
    replacing of double spaces, which rescanned the whole text per halving of the runs)."""
    parts, start = [], 0
    while start < len(text):
        cut = _WHITESPACE.search(text, min(start + _SEGMENT, len(text)))
        end = cut.start() if cut else len(text)
        part = " ".join(text[start:end].split())
        if part:
            parts.append(part)
        start = end
    return " ".join(parts)


def is_unspaced(norm: str) -> bool:
    """True for char mode: unspaced-script characters are at least a third of the letters."""
    if norm.isascii():
        return False
    found = _NOT_UNSPACED.sub("", norm)  # counted with C loops: no list of characters
    if not found:
        return False
    # Characters of the unspaced blocks (letters and their vowel-sign marks) vs other letters.
    alpha = len(found) if found.isalpha() else sum(map(str.isalpha, found))
    if 2 * len(found) >= len(norm) - alpha:  # other letters are fewer than that: no count
        return True
    other = len(norm) - len(_LETTER.sub("", norm)) - alpha
    return len(found) * 3 >= len(found) + other


def _units(text: str, spec: SignatureSpec) -> tuple[Sequence[str], int, bool]:
    """``(units, n, unspaced)`` of the normalised text."""
    norm = normalise(text)
    if not norm:
        return [], spec.shingle_words, False
    if is_unspaced(norm):
        if segments_unspaced(spec):
            return segment_words(norm).split(" "), spec.shingle_words, True
        return norm, spec.shingle_chars, True
    return norm.split(" "), spec.shingle_words, False


def shingle_units(text: str, spec: SignatureSpec = DEFAULT_SPEC) -> list[tuple[str, ...]]:
    """The document's shingle set as tuples of units (first-occurrence order); see module doc."""
    units, n, _ = _units(text, spec)
    if not units:
        return []
    if len(units) < n:
        return [tuple(units)]
    return list(dict.fromkeys(tuple(units[i : i + n]) for i in range(len(units) - n + 1)))


def shingles(text: str, spec: SignatureSpec = DEFAULT_SPEC) -> list[bytes]:
    """The document's shingle set (UTF-8 bytes, first-occurrence order); see module docstring."""
    norm = normalise(text)
    if not norm:
        return []
    unspaced = is_unspaced(norm)
    if unspaced and segments_unspaced(spec):
        norm, unspaced = segment_words(norm), False
    if unspaced:
        n = spec.shingle_chars
        if len(norm) < n:
            return [norm.encode()]
        grams = [norm[i : i + n] for i in range(len(norm) - n + 1)]
    else:
        tokens = norm.split(" ")
        n = spec.shingle_words
        if len(tokens) < n:
            return [norm.encode()]
        if n == 1:
            grams = tokens
        else:
            grams = [" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return [g.encode() for g in dict.fromkeys(grams)]
