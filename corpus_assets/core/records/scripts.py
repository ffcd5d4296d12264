"""Dominant writing system of a text (the record's ``script``), from a code point lookup table.

The rule: among the first 64 letters (``[^\\W\\d_]``) of the first 2,048 characters whose
Unicode name starts with one of ``SCRIPTS``' prefixes, the most frequent script, ties going to
the one seen first; ``Zyyy`` if there is none. ``script_by_names`` states it one character at
a time (``unicodedata.name`` per letter) and is kept as the reference; ``script_of`` gives the
same answer from a numpy table of code point -> script, so a record costs a few array
operations instead of a Python loop over its letters. The table is filled in as code points are
first seen (``_codes``): building it for all 1.1M code points up front cost every process ~0.2
CPU-s (a +1% child build's canonical step is a few thousand records), while real text uses a few
thousand distinct code points.
"""

import functools
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence

import numpy as np

SCRIPTS = (
    ("LATIN", "Latn"),
    ("CYRILLIC", "Cyrl"),
    ("GREEK", "Grek"),
    ("ARABIC", "Arab"),
    ("HEBREW", "Hebr"),
    ("DEVANAGARI", "Deva"),
    ("BENGALI", "Beng"),
    ("TAMIL", "Taml"),
    ("TELUGU", "Telu"),
    ("THAI", "Thai"),
    ("HANGUL", "Hang"),
    ("HIRAGANA", "Jpan"),
    ("KATAKANA", "Jpan"),
    ("CJK", "Hani"),
    ("GEORGIAN", "Geor"),
    ("ARMENIAN", "Armn"),
)
NO_SCRIPT = "Zyyy"
HEAD_CHARS = 2048
SAMPLE_LETTERS = 64

_LETTER = re.compile(r"[^\W\d_]")
# Table value 0 is "not a letter, or a letter of no listed script"; code n is _CODES[n - 1].
_CODES = tuple(dict.fromkeys(code for _, code in SCRIPTS))
# SCRIPTS' prefixes in order: a regex alternation tries them in that order, as the loop does.
_SCRIPT_PREFIX = re.compile("|".join(prefix for prefix, _ in SCRIPTS))
_CODE_OF_PREFIX = {prefix: _CODES.index(code) + 1 for prefix, code in SCRIPTS}
_NON_ASCII_BYTE = re.compile(rb"[\x80-\xff]")
_NOT_ASCII_LETTER = bytes(b for b in range(256) if not chr(b).isascii() or not chr(b).isalpha())


def _script_of_char(char: str) -> str | None:
    name = unicodedata.name(char, "")
    for prefix, code in SCRIPTS:
        if name.startswith(prefix):
            return code
    return None


_cached_script_of_char = functools.lru_cache(maxsize=65536)(_script_of_char)


def script_by_names(text: str, sample: int = SAMPLE_LETTERS) -> str:
    """The rule one letter at a time: the reference ``script_of`` is tested against."""
    head = text[:HEAD_CHARS]
    if head.isascii():
        return "Latn" if _LETTER.search(head) else NO_SCRIPT
    counts: Counter[str] = Counter()
    seen = 0
    for match in _LETTER.finditer(head):
        code = _cached_script_of_char(match.group())
        if code is not None:
            counts[code] += 1
            seen += 1
            if seen >= sample:
                break
    return counts.most_common(1)[0][0] if counts else NO_SCRIPT


WHOLE_TABLE_AFTER = 20_000  # code points looked up one by one (~1 us each) before the pass
_UNSEEN = 255  # a code point whose script is not looked up yet (codes are 0..len(_CODES))
_TABLE = np.full(0x110000, _UNSEEN, dtype=np.uint8)  # this process's lookups, by code point


def _code_of_point(point: int) -> int:
    """Table code of one code point: 0 unless it is a letter of a listed script."""
    char = chr(point)
    if not _LETTER.match(char):
        return 0
    prefix = _SCRIPT_PREFIX.match(unicodedata.name(char, ""))
    return 0 if prefix is None else _CODE_OF_PREFIX[prefix.group()]


def _codes(points: np.ndarray) -> np.ndarray:
    """uint8 table code of each code point in ``points``, looking up the ones not seen before
    (past ``WHOLE_TABLE_AFTER`` of them at once, every code point in one pass: ~0.15 s)."""
    codes = _TABLE[points]
    unseen = codes == _UNSEEN
    if unseen.any():
        marked = np.zeros(len(_TABLE), dtype=bool)
        marked[points[unseen]] = True
        new = np.flatnonzero(marked).tolist()  # np.unique sorts: slower on large batches
        if len(new) > WHOLE_TABLE_AFTER:
            _fill_whole_table()
        else:
            for point in new:
                _TABLE[point] = _code_of_point(point)
        codes = _TABLE[points]
    return codes


def _fill_whole_table() -> None:
    """Every code point's table code, from one regex pass over all of them (letters only named)."""
    table = np.zeros(0x110000, dtype=np.uint8)
    every = np.arange(0x110000, dtype=np.uint32).tobytes().decode("utf-32-le", "surrogatepass")
    for match in _LETTER.finditer(every):
        prefix = _SCRIPT_PREFIX.match(unicodedata.name(match.group(), ""))
        if prefix is not None:
            table[match.start()] = _CODE_OF_PREFIX[prefix.group()]
    _TABLE[:] = table


def script_of(text: str, sample: int = SAMPLE_LETTERS) -> str:
    """ISO 15924 code of the dominant script among the first letters (``Zyyy`` if none)."""
    head = text[:HEAD_CHARS]
    if head.isascii():
        return "Latn" if _LETTER.search(head) else NO_SCRIPT
    raw = head.encode("utf-8", "surrogatepass")
    first_non_ascii = _NON_ASCII_BYTE.search(raw)
    ascii_run = raw[: first_non_ascii.start()] if first_non_ascii else raw
    if len(ascii_run.translate(None, _NOT_ASCII_LETTER)) >= sample:
        return "Latn"  # the sample is all ASCII letters, every one of them Latin
    points = np.frombuffer(head.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    codes = _codes(points)
    letters = codes[codes != 0][:sample].tobytes()
    if not letters:
        return NO_SCRIPT
    # most frequent, a tie going to the script whose first letter came first (Counter's order)
    return _CODES[max(dict.fromkeys(letters), key=letters.count) - 1]


def scripts_of(texts: Sequence[str], sample: int = SAMPLE_LETTERS) -> list[str]:
    """``script_of`` of each text, the non-ASCII heads looked up together in one array.

    Per head: its letters' script codes in order, the first ``sample`` of them counted per
    script; the winner has the most, a tie going to the script whose first letter came first.
    """
    results: list[str] = []
    heads: list[str] = []
    where: list[int] = []
    for n, text in enumerate(texts):
        head = text[:HEAD_CHARS]
        if head.isascii():
            results.append("Latn" if _LETTER.search(head) else NO_SCRIPT)
        else:
            results.append(NO_SCRIPT)
            heads.append(head)
            where.append(n)
    if heads:
        for n, code in zip(where, _dominant(heads, sample), strict=True):
            if code:
                results[n] = _CODES[code - 1]
    return results


def _dominant(heads: list[str], sample: int) -> list[int]:
    """Winning table code per head (0: no letter of a listed script)."""
    lengths = np.fromiter(map(len, heads), dtype=np.int64, count=len(heads))
    starts = np.zeros(len(heads), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    points = np.frombuffer("".join(heads).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    codes = _codes(points)
    letters = np.cumsum(codes != 0)  # letters up to and including each point
    before = letters[starts] - (codes[starts] != 0)  # letters before each head
    at = np.flatnonzero(codes)
    head = np.repeat(np.arange(len(heads)), lengths)[at]
    rank = letters[at] - 1 - before[head]
    keep = rank < sample
    head, rank, code = head[keep], rank[keep], codes[at[keep]].astype(np.int64)
    width = len(_CODES) + 1
    key = head * width + code
    counts = np.bincount(key, minlength=len(heads) * width)
    first = np.full(len(heads) * width, sample, dtype=np.int64)
    np.minimum.at(first, key, rank)
    score = np.where(counts > 0, counts * (sample + 1) - first, -1).reshape(len(heads), width)
    winner = score.argmax(axis=1)
    winner[score.max(axis=1) < 0] = 0
    return winner.tolist()
