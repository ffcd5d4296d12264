"""Word segmentation of unspaced-script text (Han, kana, Thai, ...) for ``minhash.v3``.

Character 5-shingles overlap far more than word 5-shingles for the same edit (a changed word
touches 5 word shingles but only a few character shingles), so at one threshold Japanese or
Chinese pages of different commands (``sha1sum``/``sha384sum``) were removed while their
English pages were kept. v3 cuts such a text into words with ICU's dictionary-based word break
iterator (``icu4py``, which ships ICU in its wheels) and shingles the words like spaced text;
measured on Debian's translated man pages (``bench/parallel_manpages.py``) this gives the
verdicts of the English pages, where a higher character threshold did not.

The ICU version is part of the signature spec payload: its dictionaries decide the words.
"""

from icu4py._version import icu_version
from icu4py.breakers import WordBreaker

SEGMENTER = f"icu{icu_version}-word(und),pieces<=65536@space"
_PIECE = 1 << 16  # characters segmented at a time: a long text never becomes one token list


def _words(piece: str) -> str:
    return " ".join(word for word in WordBreaker(piece, "und") if not word.isspace())


def segment_words(norm: str) -> str:
    """The normalised text's ICU words (whitespace segments dropped) joined by one space.

    A long text is segmented in pieces of at most ``_PIECE`` characters ending after a space
    (a word break anyway, so the words are the whole text's), or cut hard if a piece has none.
    """
    if len(norm) <= _PIECE:
        return _words(norm)
    parts, start = [], 0
    while start < len(norm):
        end = min(start + _PIECE, len(norm))
        if end < len(norm):
            cut = norm.rfind(" ", start, end)
            end = cut + 1 if cut > start else end
        part = _words(norm[start:end])
        if part:
            parts.append(part)
        start = end
    return " ".join(parts)
