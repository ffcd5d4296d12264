"""Benchmark decontamination (``contamination.v2``): any shared token n-gram flags (the rules).

A record is contaminated by a benchmark item when they share a token n-gram, or a short item
occurs in it whole. Splitting on whitespace and asking for 50% containment (the earlier rule)
let real leaks through: a 12-token answer has no 13-gram once ``that's`` is two tokens
elsewhere, and re-spaced code shares no whitespace-split n-gram at all. This follows the
lm-eval-harness "janitor":

- Tokens (:func:`tokens`): NFKC, casefold, then the runs of word characters (Python ``re``
  Unicode ``\\w``: ``str.isalnum()`` or ``_``). Whitespace and punctuation never matter:
  ``that's`` is ``that s``; ``a+b`` and ``a + b`` are both ``a b``. One tokenisation serves prose
  and code: for code the identifiers, keywords and literals are the tokens. Operator tokens
  (``\\w+|[^\\w\\s]``) were rejected: they make every punctuation edit of a prose item (``,``
  dropped, quotes changed) break the n-grams it touches, and 13 identifier tokens in order are
  already specific to one piece of code.
- An item is *unspaced* when at least half of its word characters belong to scripts written
  without spaces (CJK, kana, Thai, ...): there one ``\\w`` run is a whole clause, so its n-grams
  are ``ngram_chars`` consecutive word characters (separators dropped) instead of tokens, and
  they are looked for only in records holding at least one unspaced-script character (so a
  Latin-only corpus pays nothing for them).
- A record is flagged by an item when it shares ANY n-gram with it; the containment
  ``|A & B| / |A|`` is recorded as evidence, not used as a threshold.
- An item shorter than ``n`` (tokens, or word characters when unspaced) is checked *whole*: its
  token sequence must occur contiguously in the record at token boundaries (unspaced: its word
  characters as a substring of the record's). An item shorter than ``min_whole_tokens`` tokens
  (``min_whole_chars`` word characters when unspaced) is not checked at all and reported as
  unchecked: "why" or a 7-character common Chinese phrase would flag unrelated text.

``None`` from a match means "no match with this method, policy and reference set", not "not
contaminated". This module is the definition (reference functions the fast path must agree
with); the fast path is :mod:`.tokens` (vectorised tokenisation) and :mod:`.index`.
"""

import functools
import re
import sys
import unicodedata
from dataclasses import asdict, dataclass

import numpy as np

from corpus_assets.core.runtime.row_policies import ContaminationConfig

VERSION = "contamination.v2"  # the policy's name in config, payloads and reports
DEFAULT = ContaminationConfig()  # the config's defaults are the engine's: one source, never two
INDEX_FORMAT = "contamination.index.v2"
PPM = 1_000_000
UNCHECKED, NGRAM, WHOLE = 0, 1, 2  # how an item is checked
_WORD = re.compile(r"\w+")
_UNSPACED_RANGES = (  # Thai, Lao, Tibetan, Myanmar, Khmer, kana, CJK
    (0x0E00, 0x0EFF),
    (0x0F00, 0x0FFF),
    (0x1000, 0x109F),
    (0x1780, 0x17FF),
    (0x3040, 0x30FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xF900, 0xFAFF),
    (0x20000, 0x3134F),
)
FIRST_UNSPACED = _UNSPACED_RANGES[0][0]
_NO_SPACE_SCRIPTS = re.compile(
    "[" + "".join(f"{chr(low)}-{chr(high)}" for low, high in _UNSPACED_RANGES) + "]"
)


@dataclass(frozen=True)
class TokenPolicy:
    """The contamination policy; integers only (it is hashed into task keys)."""

    version: str = VERSION
    ngram_words: int = DEFAULT.ngram_words
    ngram_chars: int = DEFAULT.ngram_chars
    min_whole_tokens: int = DEFAULT.min_whole_tokens
    min_whole_chars: int = DEFAULT.min_whole_chars

    def __post_init__(self) -> None:
        if self.version != VERSION:
            raise ValueError(f"a TokenPolicy is {VERSION}, not {self.version!r}")
        for name in ("ngram_words", "ngram_chars", "min_whole_tokens", "min_whole_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"contamination policy {name} must be a positive int: {value!r}")
        if self.min_whole_tokens > self.ngram_words or self.min_whole_chars > self.ngram_chars:
            raise ValueError("a whole-item minimum above the n-gram size leaves items unchecked")

    def payload(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Match:
    """The benchmark item a record is excluded for (reason ``contamination.benchmark``).

    ``containment_ppm`` is ``|A & B| / |A|`` in parts per million (``A`` the item's n-grams,
    ``B`` the record's; 1_000_000 for an item found whole), the evidence, not a threshold;
    ``shared`` counts the item n-grams found in the record; ``whole`` says a short item was
    found whole; ``benchmark`` names the item's benchmark when the index was told it.
    """

    item_id: str
    containment_ppm: int
    shared: int = 0
    whole: bool = False
    benchmark: str = ""


def tokens(text: str) -> list[str]:
    """The reference tokenisation: NFKC, casefold, ``\\w+`` runs."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def normalise(text: str) -> str:
    """Tokens joined by one space: what the fast path's stream holds per text."""
    return " ".join(tokens(text))


def unspaced(normalised: str) -> bool:
    """At least half of the word characters are in scripts written without spaces."""
    letters = len(normalised) - normalised.count(" ")
    return 2 * len(_NO_SPACE_SCRIPTS.findall(normalised)) >= letters > 0


def plan(normalised: str, policy: TokenPolicy) -> tuple[str, int]:
    """(``"word"`` or ``"char"``, ``NGRAM`` / ``WHOLE`` / ``UNCHECKED``) for a normalised item."""
    if unspaced(normalised):
        size = len(normalised) - normalised.count(" ")
        n, low, mode = policy.ngram_chars, policy.min_whole_chars, "char"
    else:
        size = normalised.count(" ") + 1 if normalised else 0
        n, low, mode = policy.ngram_words, policy.min_whole_tokens, "word"
    return mode, NGRAM if size >= n else WHOLE if size >= low else UNCHECKED


def ngrams(normalised: str, mode: str, n: int) -> set[str]:
    """Token n-grams (space-joined) or n-grams of the word characters (separators dropped)."""
    if mode == "char":
        letters = normalised.replace(" ", "")
        return {letters[i : i + n] for i in range(len(letters) - n + 1)}
    toks = normalised.split(" ") if normalised else []
    return {" ".join(toks[i : i + n]) for i in range(len(toks) - n + 1)}


def occurs_whole(item: str, record: str, mode: str) -> bool:
    """The item's tokens contiguous in the record at token boundaries (``char``: substring)."""
    if mode == "char":
        return item.replace(" ", "") in record.replace(" ", "")
    return f" {item} " in f" {record} "


def reference_match(items: list[tuple[str, str]], text: str, policy: TokenPolicy) -> Match | None:
    """The definition without any index: highest containment, ties to the smallest item id."""
    record = normalise(text)
    best: Match | None = None
    for item_id, item_text in sorted(items):
        item = normalise(item_text)
        mode, how = plan(item, policy)
        if how == UNCHECKED or (mode == "char" and not _NO_SPACE_SCRIPTS.search(record)):
            continue
        if how == WHOLE and not occurs_whole(item, record, mode):
            continue
        shared = 0
        if how == NGRAM:
            n = policy.ngram_chars if mode == "char" else policy.ngram_words
            grams = ngrams(item, mode, n)
            shared = len(grams & ngrams(record, mode, n))
            if not shared:
                continue
            ppm = shared * PPM // len(grams)
        else:
            ppm = PPM
        if best is None or ppm > best.containment_ppm:
            best = Match(item_id, ppm, shared=shared, whole=how == WHOLE)
    return best


@functools.cache
def word_table() -> np.ndarray:
    """Code point -> is a ``\\w`` character (the regex itself decides, so the two agree)."""
    every = "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c < 0xE000)
    table = np.zeros(sys.maxunicode + 1, dtype=bool)
    starts = [m.start() for m in re.finditer(r"\w", every)]
    positions = np.array(starts, dtype=np.int64)
    positions[positions >= 0xD800] += 0x800  # the surrogates left out of ``every``
    table[positions] = True
    table.flags.writeable = False
    return table


@functools.cache
def unspaced_table() -> np.ndarray:
    """Code point -> belongs to a script written without spaces (:func:`unspaced`)."""
    table = np.zeros(sys.maxunicode + 1, dtype=bool)
    for low, high in _UNSPACED_RANGES:
        table[low : high + 1] = True
    table.flags.writeable = False
    return table
