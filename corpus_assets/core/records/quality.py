"""Quality stage: a versioned, hashable heuristic policy with one reason code per rule.

A quality reject means the text was interpretable but fails a stated condition, so
each rule has its own ``quality.*`` code and the first failing rule, in the fixed order below,
is the one reported. Ratios are integers in parts per million and compared exactly
(``count * 1e6 > ppm * total`` in integers), so a hashed policy carries no float and a boundary
case cannot flip between machines. A rule at its permissive bound is skipped, not computed.

Rules, in order:

- ``quality.too_short``: fewer than ``min_chars`` characters once leading/trailing whitespace is
  stripped. ``quality.too_long``: more than ``max_chars`` characters (code points).
- prose only (code is symbol-heavy by nature), over non-whitespace characters:
  ``quality.symbol_ratio``: punctuation + symbols (Unicode P*, S*) above
  ``max_symbol_ratio_ppm``; ``quality.alpha_ratio``: letters + combining marks (L*, M*; marks
  count so Indic scripts are not penalised) below ``min_alpha_ratio_ppm``.
- ``quality.repeated_lines``: characters (leading/trailing whitespace not counted) in lines
  that exactly repeat an earlier line, as a share of the characters of all lines, above
  ``max_repeated_line_ratio_ppm``. Character-weighted so short repeated lines (``}``,
  ``end``) weigh little in code and blank lines weigh nothing.
- ``quality.repeated_ngrams``: word ``ngram``-grams (whitespace-split) that repeat an earlier
  one, as a share of all of them, above ``max_repeated_ngram_ratio_ppm``. Texts with fewer
  than ``ngram`` words are not judged; unsegmented scripts (Chinese, Japanese) are one "word"
  per run, so this rule effectively does not apply to them.

Long texts (above ``CHUNK_CHARS``) are read a piece at a time: repeated lines and n-grams are
counted by deterministic 64-bit keys (``quality_hashes``) in bounded memory, equal to the exact
counts except on a 64-bit key collision.

Character classes come from ``unicodedata`` (its version is part of ``policy_payload``); code
points above U+2FFFF count as neither letter nor symbol.
"""

import dataclasses
import functools
import string
import unicodedata
from collections import Counter
from dataclasses import dataclass

from corpus_assets.core.records.quality_hashes import hashed_line_chars, hashed_ngrams
from corpus_assets.core.runtime.row_policies import QualityConfig

PPM = 1_000_000
CODE_KIND = "code"
# Characters per piece on a long text: bounds each rule's working memory (a test shrinks it).
CHUNK_CHARS = 1 << 17
DEFAULT = QualityConfig()  # the config's defaults are the policy's: one source, never two


@dataclass(frozen=True)
class QualityPolicy:
    """Thresholds for ``check_quality``; the defaults (``QualityConfig``'s) are permissive, a
    config tightens them."""

    version: str = "quality.v1"
    min_chars: int = DEFAULT.min_chars
    max_chars: int = DEFAULT.max_chars
    max_symbol_ratio_ppm: int = DEFAULT.max_symbol_ratio_ppm
    min_alpha_ratio_ppm: int = DEFAULT.min_alpha_ratio_ppm
    max_repeated_line_ratio_ppm: int = DEFAULT.max_repeated_line_ratio_ppm
    max_repeated_ngram_ratio_ppm: int = DEFAULT.max_repeated_ngram_ratio_ppm
    ngram: int = DEFAULT.ngram

    def __post_init__(self) -> None:
        if not isinstance(self.version, str) or not self.version:
            raise ValueError("quality policy version must be a non-empty string")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "version":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"quality policy {f.name} must be an int >= 0, not {value!r}")
            if f.name.endswith("_ppm") and value > PPM:
                raise ValueError(f"quality policy {f.name} is parts per million: {value} > {PPM}")
        if self.ngram < 1:
            raise ValueError("quality policy ngram must be >= 1")


def policy_payload(policy: QualityPolicy) -> dict[str, str | int]:
    """The policy as JSON of ints and strings, plus the Unicode version its classes depend on."""
    payload: dict[str, str | int] = dataclasses.asdict(policy)
    payload["unicode"] = unicodedata.unidata_version
    return payload


# Byte -> class for ASCII ("a" letter, "s" punctuation/symbol, "w" whitespace, "o" other);
# bytes >= 0x80 (UTF-8 of non-ASCII characters) map to "x" and are classified separately.
_ASCII_CLASS = bytes(
    ord(
        "x"
        if b >= 0x80
        else "a"
        if chr(b).isalpha()
        else "s"
        if chr(b) in string.punctuation
        else "w"
        if chr(b).isspace()
        else "o"
    )
    for b in range(256)
)
_ASCII_BYTES = bytes(range(128))
_TABLE_END = 0x30000


@functools.cache
def _unicode_classes() -> str:
    """Class letter per code point below U+30000 (built on first non-ASCII text, ~0.1 s)."""

    def cls(cp: int) -> str:
        char = chr(cp)
        major = unicodedata.category(char)[0]
        if major in "LM":
            return "a"
        if major in "PS":
            return "s"
        return "w" if char.isspace() else "o"

    return "".join([cls(cp) for cp in range(_TABLE_END)])


def _class_counts(text: str) -> tuple[int, int, int]:
    """(letters, symbols, non-whitespace characters) of ``text``, a piece at a time.

    Counts add up over pieces, so working on ``CHUNK_CHARS`` at a time bounds the encoded and
    translated copies without changing the result.
    """
    alpha = symbol = space = 0
    for start in range(0, len(text), CHUNK_CHARS):
        piece = text[start : start + CHUNK_CHARS]
        raw = piece.encode("utf-8", "surrogatepass")
        classes = raw.translate(_ASCII_CLASS)
        alpha += classes.count(b"a")
        symbol += classes.count(b"s")
        space += classes.count(b"w")
        if not piece.isascii():
            rest = raw.translate(None, _ASCII_BYTES).decode("utf-8", "surrogatepass")
            rest = rest.translate(_unicode_classes())
            alpha += rest.count("a")
            symbol += rest.count("s")
            space += rest.count("w")
    return alpha, symbol, len(text) - space


def _repeated_line_chars(text: str) -> tuple[int, int]:
    """(characters in lines repeating an earlier line, characters in all lines).

    Texts above ``CHUNK_CHARS`` are counted with line hashes (``quality_hashes``) in bounded
    memory; a small text keeps the exact ``Counter`` (the common case, and faster).
    """
    if len(text) > CHUNK_CHARS:
        return hashed_line_chars(text, CHUNK_CHARS)
    lines = text.split("\n")
    counts = Counter(lines)
    if len(counts) == len(lines):
        return 0, 0  # no line repeats: nothing to weigh
    repeated = total = 0
    for line, times in counts.items():
        size = len(line.strip())
        total += size * times
        repeated += size * (times - 1)
    return repeated, total


def _repeated_ngrams(text: str, n: int, ppm: int) -> tuple[int, int]:
    """(n-grams repeating an earlier one, all n-grams) over whitespace-split words.

    A repeated n-gram starts with a repeated word, so when repeated words alone stay within
    ``ppm`` the n-grams are never counted. Texts above ``CHUNK_CHARS`` are counted with word
    hashes (``quality_hashes``) in bounded memory; a small text keeps exact sets.
    """
    if len(text) > CHUNK_CHARS:
        return hashed_ngrams(text, n, ppm, CHUNK_CHARS)
    words = text.split()
    total = len(words) - n + 1
    if total <= 0:
        return 0, 0
    repeated_words = len(words) - len(set(words))
    if repeated_words * PPM <= ppm * total:
        return 0, total
    grams = words if n == 1 else zip(*(words[i:] for i in range(n)), strict=False)
    return total - len(set(grams)), total


def _above(count: int, total: int, ppm: int) -> bool:
    """``count / total > ppm / 1e6`` in integers (policies carry no floats)."""
    return count * PPM > ppm * total


def check_quality(text: str, kind: str, policy: QualityPolicy) -> str | None:
    """``None`` if ``text`` passes ``policy``, else the first failing rule's reason code."""
    size = len(text)
    if size < policy.min_chars or (
        policy.min_chars
        and (text[:1].isspace() or text[-1:].isspace())
        and len(text.strip()) < policy.min_chars
    ):
        return "quality.too_short"
    if size > policy.max_chars:
        return "quality.too_long"
    if kind != CODE_KIND and (policy.max_symbol_ratio_ppm < PPM or policy.min_alpha_ratio_ppm > 0):
        alpha, symbol, visible = _class_counts(text)
        if _above(symbol, visible, policy.max_symbol_ratio_ppm):
            return "quality.symbol_ratio"
        if policy.min_alpha_ratio_ppm > 0 and (
            visible == 0 or alpha * PPM < policy.min_alpha_ratio_ppm * visible
        ):
            return "quality.alpha_ratio"
    if policy.max_repeated_line_ratio_ppm < PPM:
        repeated, total = _repeated_line_chars(text)
        if _above(repeated, total, policy.max_repeated_line_ratio_ppm):
            return "quality.repeated_lines"
    if policy.max_repeated_ngram_ratio_ppm < PPM:
        repeated, total = _repeated_ngrams(text, policy.ngram, policy.max_repeated_ngram_ratio_ppm)
        if _above(repeated, total, policy.max_repeated_ngram_ratio_ppm):
            return "quality.repeated_ngrams"
    return None
