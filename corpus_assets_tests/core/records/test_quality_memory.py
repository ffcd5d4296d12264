"""Quality rules on long texts: hashed counts equal the exact ones, in bounded memory."""

import random
import sys
import tracemalloc
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus_assets.core.records import quality, quality_hashes
from corpus_assets.core.records.quality_hashes import hashed_line_chars, hashed_ngrams, word_keys

PPM = 1_000_000
WHITESPACE = [chr(cp) for cp in range(sys.maxunicode + 1) if chr(cp).isspace()]
# Few letters so words, lines and n-grams repeat; every whitespace; astral, NUL, a surrogate.
ALPHABET = ["a", "b", "é", "中", "\U0001f600", "\x00", "\ud800", *WHITESPACE]
TEXTS = st.text(st.sampled_from(ALPHABET), max_size=80) | st.text(max_size=40)


def old_line_chars(text: str) -> tuple[int, int]:
    """The exact ``_repeated_line_chars`` before hashing (the oracle)."""
    lines = text.split("\n")
    counts = Counter(lines)
    if len(counts) == len(lines):
        return 0, 0
    repeated = total = 0
    for line, times in counts.items():
        size = len(line.strip())
        total += size * times
        repeated += size * (times - 1)
    return repeated, total


def old_ngrams(text: str, n: int, ppm: int) -> tuple[int, int]:
    """The exact ``_repeated_ngrams`` before hashing (the oracle)."""
    words = text.split()
    total = len(words) - n + 1
    if total <= 0:
        return 0, 0
    repeated_words = len(words) - len(set(words))
    if repeated_words * PPM <= ppm * total:
        return 0, total
    grams = words if n == 1 else zip(*(words[i:] for i in range(n)), strict=False)
    return total - len(set(grams)), total


def old_class_counts(text: str) -> tuple[int, int, int]:
    """The exact ``_class_counts`` before pieces (the oracle)."""
    raw = text.encode("utf-8", "surrogatepass")
    classes = raw.translate(quality._ASCII_CLASS)
    alpha, symbol, space = classes.count(b"a"), classes.count(b"s"), classes.count(b"w")
    if not text.isascii():
        rest = raw.translate(None, quality._ASCII_BYTES).decode("utf-8", "surrogatepass")
        rest = rest.translate(quality._unicode_classes())
        alpha += rest.count("a")
        symbol += rest.count("s")
        space += rest.count("w")
    return alpha, symbol, len(text) - space


@settings(max_examples=400, deadline=None)
@given(TEXTS, st.integers(1, 12), st.integers(1, 4), st.sampled_from([0, 300_000, PPM]))
def test_hashed_counts_equal_the_exact_ones(text: str, chunk: int, n: int, ppm: int) -> None:
    assert hashed_ngrams(text, n, ppm, chunk) == old_ngrams(text, n, ppm)
    assert hashed_line_chars(text, chunk) == old_line_chars(text)


@settings(max_examples=100, deadline=None)
@given(TEXTS, st.integers(1, 9))
def test_split_key_space_gives_the_same_counts(text: str, chunk: int) -> None:
    # A tiny limit splits the key space into many parts, each read in its own pass.
    saved = quality_hashes._MIN_LIMIT
    quality_hashes._MIN_LIMIT = 2
    try:
        assert hashed_ngrams(text, 2, 0, chunk) == old_ngrams(text, 2, 0)
        assert hashed_line_chars(text, chunk) == old_line_chars(text)
    finally:
        quality_hashes._MIN_LIMIT = saved


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "\n",
        "\n" * 50,
        "x" * 1000,  # one word, no whitespace, across many pieces
        ("y" * 333 + " ") * 7 + "y" * 333,
        ("same line\n" * 40) + "  same line  \n" + "z",
        "".join(WHITESPACE) * 3 + "a" + "".join(WHITESPACE),
        " ".join(["a", "b", "a", "b", "c"] * 30),
    ],
)
@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 17])
def test_edge_texts_and_piece_boundaries(text: str, chunk: int) -> None:
    for n in (1, 3):
        assert hashed_ngrams(text, n, 0, chunk) == old_ngrams(text, n, 0)
    assert hashed_line_chars(text, chunk) == old_line_chars(text)


def test_rules_take_the_hashed_path_above_the_piece_size(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    monkeypatch.setattr(quality, "CHUNK_CHARS", 5)
    for _ in range(300):
        text = "".join(rng.choice([*ALPHABET, "!", "1", "Z"]) for _ in range(rng.randrange(40)))
        assert quality._class_counts(text) == old_class_counts(text)
        assert quality._repeated_line_chars(text) == old_line_chars(text)
        assert quality._repeated_ngrams(text, 3, 0) == old_ngrams(text, 3, 0)


def test_the_whitespace_table_covers_every_whitespace_character() -> None:
    assert max(map(ord, WHITESPACE)) < quality_hashes._WS_END
    assert [chr(cp) for cp in range(quality_hashes._WS_END) if quality_hashes._WS[cp]] == WHITESPACE


def test_word_keys_are_deterministic() -> None:
    # Fixed 64-bit keys (not Python's per-process hash): the same word, the same key.
    keys = [hex(int(k)) for part in word_keys("hello world héllo\u3000hello", 4) for k in part]
    assert keys == [
        "0x392a3f27a8ed1487",
        "0x6c581c0df9146712",
        "0xcceaf01901addc4e",
        "0x392a3f27a8ed1487",
    ]


def _ascii_text(chars: int) -> str:
    """Random 8-character words of letters and digits (nearly all distinct), 100 per line."""
    codes = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789", np.uint8)
    raw = codes[np.random.default_rng(7).integers(0, len(codes), chars)]
    raw[8::9] = ord(" ")
    raw[899::900] = ord("\n")
    return raw.tobytes().decode("ascii")


def _cjk_text(chars: int) -> str:
    """Random Chinese characters, 200 per line."""
    cps = np.random.default_rng(7).integers(0x4E00, 0x4E00 + 3000, chars, dtype=np.uint32)
    cps[199::200] = ord("\n")
    return cps.astype("<u4").tobytes().decode("utf-32-le")


@pytest.mark.parametrize("make", [_ascii_text, _cjk_text])
def test_each_rule_peaks_within_twice_the_utf8_size(make: Callable[[int], str]) -> None:
    text = make(4_000_000) + "\U0001f600"  # an astral character: 4 bytes per character
    size = len(text.encode("utf-8"))
    rules = {
        "classes": lambda: quality._class_counts(text),
        "lines": lambda: quality._repeated_line_chars(text),
        "ngrams": lambda: quality._repeated_ngrams(text, 3, 0),
    }
    for name, rule in rules.items():
        tracemalloc.start()
        try:
            rule()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak <= 2 * size, (name, peak, size)
