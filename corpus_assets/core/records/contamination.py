"""Benchmark decontamination by n-gram containment (Broder 1997): the rules
of ``contamination.v1`` (selectable; the default ``contamination.v2`` is :mod:`.contamination_v2`).

A training record is contaminated by a benchmark item when most of the item's n-grams occur in
the record: containment ``C(A, B) = |A & B| / |A|`` with ``A`` the item's n-gram set and ``B``
the record's. Jaccard ``|A & B| / |A | B|`` is the wrong measure here: a 30-word question pasted
into a 5,000-word page has containment 1 and Jaccard below 1%.

Normalisation (:func:`normalise`, shared by items and records): NFC, casefold, split on
whitespace (``str.split``), strip Unicode punctuation (general category ``P*``) from both ends of
every token, drop tokens left empty, join with one space. Punctuation inside a token stays
(``e.g`` , ``don't``, ``3.14``). Word n-grams are ``ngram_words`` consecutive tokens; character
n-grams are ``ngram_chars`` consecutive characters of the normalised text (spaces included).

An item uses character n-grams when at least half of its non-space characters belong to scripts
written without spaces (CJK, kana, Thai, Lao, Khmer, Myanmar, Tibetan) or when it has fewer than
``ngram_words`` tokens; an item that then has fewer than ``ngram_chars`` characters cannot be
checked by this method and is listed as unchecked (so a gate report can say what was not
checked) instead of being dropped silently. Records are n-grammed both ways.
``None`` from a match means "no match with this method, policy and reference set", not "not
contaminated".

This module is the definition (the policy and the reference functions, which the fast path
must agree with); the fast path is :mod:`.contamination_stream` (vectorised normalisation and
n-gram hashing), :mod:`.contamination_tables` (indexing the items) and
:mod:`.contamination_index` (``BenchmarkIndex``: screening records and confirming matches).
"""

import functools
import re
import sys
import unicodedata
from dataclasses import asdict, dataclass

import numpy as np

from corpus_assets.core.runtime.row_policies import ContaminationConfig

INDEX_FORMAT = "contamination.index.v1"  # bump when normalisation or n-gram rules change
PPM = 1_000_000
DEFAULT = ContaminationConfig()  # the config's defaults are both engines': one source, never two
WORD, SPACE, PUNCT = 0, 1, 2  # character classes of :func:`char_classes`
_NO_SPACE_SCRIPTS = re.compile(
    "[\u0e00-\u0eff\u0f00-\u0fff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf"
    "\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]"
)


@dataclass(frozen=True)
class ContaminationPolicy:
    """Integers only: the policy is hashed into task keys, and hashed payloads carry no floats.

    ``threshold_ppm`` is containment in parts per million; a record is contaminated at or above
    it (so 1_000_000 means "every n-gram of the item occurs in the record").
    """

    version: str = "contamination.v1"
    ngram_words: int = DEFAULT.ngram_words
    ngram_chars: int = DEFAULT.ngram_chars
    threshold_ppm: int = DEFAULT.threshold_ppm

    def __post_init__(self) -> None:
        if not isinstance(self.version, str) or not self.version:
            raise ValueError("contamination policy version must be a non-empty string")
        for name in ("ngram_words", "ngram_chars", "threshold_ppm"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"contamination policy {name} must be a positive int: {value!r}")
        if self.threshold_ppm > PPM:
            raise ValueError(f"threshold_ppm {self.threshold_ppm} is above {PPM}")


def policy_payload(policy: ContaminationPolicy) -> dict:
    """The policy as a hashable JSON object (field names as in the config's policy dumps)."""
    return asdict(policy)


@dataclass(frozen=True)
class Match:
    """The benchmark item a record is excluded for (reason ``contamination.benchmark``).

    ``shared`` (v2) counts the item n-grams found in the record; ``whole`` (v2) says a short
    item was found whole; ``benchmark`` names the item's benchmark when the index was told it.
    """

    item_id: str
    containment_ppm: int
    shared: int = 0
    whole: bool = False
    benchmark: str = ""


def normalise(text: str) -> str:
    """The reference definition of the normalisation; batches use a vectorised equivalent.

    (A token with alphanumeric ends needs no strip: skipping it is only a shortcut.)
    """
    punct = _punctuation()
    tokens = (
        t if t[0].isalnum() and t[-1].isalnum() else t.strip(punct)
        for t in unicodedata.normalize("NFC", text).casefold().split()
    )
    return " ".join(t for t in tokens if t)


def word_ngrams(normalised: str, n: int) -> set[str]:
    """The set of ``n``-token n-grams of a normalised text."""
    tokens = normalised.split(" ") if normalised else []
    return {" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def char_ngrams(normalised: str, n: int) -> set[str]:
    """The set of ``n``-character n-grams of a normalised text (spaces included)."""
    return {normalised[i : i + n] for i in range(len(normalised) - n + 1)}


def containment_ppm(item_grams: set[str], record_grams: set[str]) -> int:
    """``|A & B| / |A|`` in ppm, rounded down; 0 for an empty item."""
    if not item_grams:
        return 0
    return len(item_grams & record_grams) * PPM // len(item_grams)


def ngram_size(mode: str, policy: ContaminationPolicy) -> int:
    """``n`` of the ``"word"`` or ``"char"`` n-grams under ``policy``."""
    return policy.ngram_words if mode == "word" else policy.ngram_chars


def ngrams(text: str, mode: str, policy: ContaminationPolicy) -> set[str]:
    """The exact n-gram set of a normalised text in ``mode`` (what a match is confirmed on)."""
    if mode == "word":
        return word_ngrams(text, policy.ngram_words)
    return char_ngrams(text, policy.ngram_chars)


def item_mode(text: str, policy: ContaminationPolicy) -> str | None:
    """The n-gram kind for a normalised item text; None when it is too short for either."""
    tokens = text.count(" ") + 1 if text else 0
    letters = len(text) - (tokens - 1 if tokens else 0)
    no_spaces = 2 * len(_NO_SPACE_SCRIPTS.findall(text)) >= letters > 0
    if tokens >= policy.ngram_words and not no_spaces:
        return "word"
    if len(text) >= policy.ngram_chars:
        return "char"
    return None


@functools.cache
def char_classes() -> np.ndarray:
    """Code point -> word / space (``str.isspace``) / punctuation (category ``P*``)."""
    table = np.zeros(sys.maxunicode + 1, dtype=np.uint8)
    for code in range(sys.maxunicode + 1):
        ch = chr(code)
        if ch.isspace():
            table[code] = SPACE
        elif unicodedata.category(ch)[0] == "P":
            table[code] = PUNCT
    table.flags.writeable = False
    return table


@functools.cache
def _punctuation() -> str:
    """Every punctuation character, for ``str.strip`` in :func:`normalise`."""
    return "".join(chr(c) for c in np.flatnonzero(char_classes() == PUNCT).tolist())
