"""``dedup_key`` hashes the dedup-normalised text a window at a time: every window size gives
the whole-text rule's bytes (the oracle below is that rule as it was written), and a text at
``max_chars`` is hashed without its normalised copy or word list in memory."""

import hashlib
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus_assets.core.records import normalize
from corpus_assets.core.records.normalize import dedup_key, dedup_normalize


def whole_text_rule(text: str, kind: str) -> str:
    """The dedup normalisation of the whole text at once (the reference)."""
    if kind == "code":
        return "\n".join(filter(None, [line.rstrip() for line in text.split("\n")]))
    text = " ".join(text.split()).casefold()
    if text.isascii() or unicodedata.is_normalized("NFC", text):
        return text
    return unicodedata.normalize("NFC", text)


# Separators of every kind, letters that casefold to several (ß, ﬁ) or decompose (İ), combining
# marks that NFC composes with the letter before them or reorders, and astral characters.
ALPHABET = st.sampled_from(
    [
        *"ab; \n\t\r\x1c\x1f\u00a0\u2003\u3000\u0085\u2028",
        "ß",
        "ﬁ",
        "İ",
        "e",
        "\u0301",
        "\u0327",
        "\u0323",
        "Å",
        "\U0001f600",
        "字",
    ]
)
TEXTS = st.text(alphabet=ALPHABET, max_size=80)


@settings(max_examples=400, deadline=None)
@given(
    text=TEXTS,
    window=st.integers(min_value=1, max_value=9),
    kind=st.sampled_from(["prose", "code"]),
)
def test_every_window_gives_the_whole_text_rule(text: str, window: int, kind: str) -> None:
    expected = whole_text_rule(text, kind)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(normalize, "DEDUP_WINDOW", window)
        assert dedup_normalize(text, kind) == expected
        digest = "sha256:" + hashlib.sha256(expected.encode()).hexdigest()
        assert dedup_key(text, kind) == digest


_PEAK = """
import sys, tracemalloc
from corpus_assets.core.records.normalize import dedup_key
text = "\\U0001F600 " + "Straße  Word\\u0301 tab\\there " * 800_000
if sys.argv[2] == "one-line":  # minified code, a word of 10M chars
    text = "\\U0001F600" + "x=f(a)+\\u00e9;" * 1_000_000 + " " + "tail \\n" * 10
tracemalloc.start()
dedup_key(text, sys.argv[1])
print(tracemalloc.get_traced_memory()[1] / sys.getsizeof(text))
"""


@pytest.mark.parametrize("kind", ["prose", "code"])
@pytest.mark.parametrize("shape", ["lines", "one-line"])
def test_a_long_text_is_hashed_in_bounded_memory(kind: str, shape: str) -> None:
    """~22M characters: the peak is a few windows, not the text again (the whole-text rule held
    its word list, the joined copy and its casefolded copy: ~5x the text)."""
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, kind, shape], capture_output=True, text=True, check=True
    )
    assert float(done.stdout) < 0.5
