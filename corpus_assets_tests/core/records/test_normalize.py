"""Normalisation stage: golden cases cut from the real fortunes corpus, plus one pass over it.

The golden strings are embedded so the suite passes without ``../shared``; the corpus test
skips cleanly when the shared corpora are absent.
"""

import json
import re
import unicodedata

import pytest
import zstandard

from corpus_assets.core.records.normalize import (
    Normalized,
    ParseReject,
    dedup_normalize,
    normalize_text,
)
from corpus_assets_tests.paths import CORPORA

CORPORA = CORPORA
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

# (fortune id or "synthetic", raw text, normalised text, changes)
GOLDEN_PROSE = [
    (
        "fortunes-1454ac6928f56335",  # zh, colour codes around the attribution
        "\x1b[33m    -- Debian \x1b[32m《行为准则》\x1b[m第一条\x1b[m",
        "    -- Debian 《行为准则》第一条",
        ("ansi",),
    ),
    (
        "fortunes-9ce4fd26f2e526ab",  # a CSI cut short by the next ESC: dropped like a terminal
        "你可以通过\x1b[35;1m“~/.bashrc”\x1b[;\x1b[34;1mm来定制bash(1)\x1b[m的行为。",
        "你可以通过“~/.bashrc”m来定制bash(1)的行为。",
        ("ansi",),
    ),
    (
        "synthetic",  # reset with empty parameter list, OSC window title
        "\x1b[;mbold\x1b[0;31m red \x1b]0;title\x07end",
        "bold red end",
        ("ansi",),
    ),
    (
        "fortunes-df3a45c7f0148ea7",  # underline: run of underscores, backspaces, then the word
        "whiter teeth *___\x08\x08\x08and* fresher breath.",
        "whiter teeth *and* fresher breath.",
        ("overstrike",),
    ),
    (
        "fortunes-1eb572194c4dca56",  # underline written character by character
        "a dead squid -- *_\x08_\x08_\x08_\x08that _\x08_\x08_\x08had _\x08_\x08to",
        "a dead squid -- *that had to",
        ("overstrike",),
    ),
    (
        "fortunes-28a4455d3cd95684",  # underlined variable names
        "We know it's true for _\x08n equal to 1.",
        "We know it's true for n equal to 1.",
        ("overstrike",),
    ),
    (
        "fortunes-86ed134c29c3a8da",  # accent struck over a letter composes (then NFC)
        "\t\t-- H. Poincar'\x08e",
        "\t\t-- H. Poincaré",
        ("overstrike", "nfc"),
    ),
    (
        "fortunes-493bfc981aad854a",
        'Plus ,\x08ca change -- Alphonse Karr, "Les Gu^\x08epes"',
        'Plus ça change -- Alphonse Karr, "Les Guêpes"',
        ("overstrike", "nfc"),
    ),
    (
        "fortunes-2dad756da2827a18",
        "Madame de Sta\"\x08el; In me R'\x08ecamier",
        "Madame de Staël; In me Récamier",
        ("overstrike", "nfc"),
    ),
    # bold and plain overstrike; a backspace mid-line moves back (the space is struck over)
    (
        "synthetic",
        "bold x\x08x, struck a\x08b, gap \x08!",
        "bold x, struck b, gap!",
        ("overstrike",),
    ),
    # a backspace never crosses a newline; one with nothing to its left is dropped
    ("synthetic", "\x08lead\nline\x08\x08\x08\x08\x08two", "lead\ntwoe", ("overstrike",)),
    (
        "fortunes-7f4ecc598af3421d",  # ru, CRLF and a trailing lone CR
        "Любовь привносит в жизнь все то, что мертво вокруг нас.\r\n\t\t-- Розенцвейг\r",
        "Любовь привносит в жизнь все то, что мертво вокруг нас.\n\t\t-- Розенцвейг\n",
        ("crlf",),
    ),
    (
        "fortunes-49a9e57f56e02e22",  # a run of BELs is removed, not a reject
        "Look out!  Behind you!" + "\x07" * 22,
        "Look out!  Behind you!",
        ("control",),
    ),
    (
        "fortunes-63dd2ebcad7234d9",  # de, cp1252 apostrophe decoded as a C1 control: removed
        "Schafft er\x92s wohl auch noch bis neunzig?",
        "Schafft ers wohl auch noch bis neunzig?",
        ("control",),
    ),
    (
        "fortunes-28eee724c3a5fc33",  # ar, shadda before fatha: NFC reorders the marks
        "المتب\u0651\u064eثة",
        "المتب\u064e\u0651ثة",
        ("nfc",),
    ),
    ("synthetic", "a\x00b" + "c" * 200, "ab" + "c" * 200, ("nul",)),
    ("synthetic", "tab\tand\nnewline stay", "tab\tand\nnewline stay", ()),
]


@pytest.mark.parametrize(("source", "raw", "expected", "changes"), GOLDEN_PROSE)
def test_golden_prose(source: str, raw: str, expected: str, changes: tuple[str, ...]) -> None:
    result = normalize_text(raw)
    assert result == Normalized(expected, changes), source
    assert normalize_text(result.text) == Normalized(result.text, ())  # idempotent


def test_clean_text_is_returned_unchanged_and_uncopied() -> None:
    text = "Plain text.\n\tWith a tab, ümlauts and 中文."
    result = normalize_text(text)
    assert result.changes == ()
    assert result.text is text


def test_decomposed_text_is_composed() -> None:
    assert normalize_text("Poincare\u0301") == Normalized("Poincaré", ("nfc",))


def test_changes_follow_stage_order() -> None:
    raw = "\x00" + "x" * 200 + "\x1b[1mcaf'\x08e\x1b[m\r\n\x0c\u0065\u0301"
    result = normalize_text(raw)
    assert result.text == "x" * 200 + "café\né"
    assert result.changes == ("nul", "ansi", "crlf", "overstrike", "control", "nfc")


def test_mostly_nul_text_is_a_parse_reject_without_the_text() -> None:
    # the start of a .pyc that sits in the licenses corpus
    raw = "Ë\r\r\n\x00\x00\x00\x00\x80\x16Ï\x125%\x00\x00ã\x00\x00\x00\x00secretword"
    with pytest.raises(ParseReject) as caught:
        normalize_text(raw)
    assert caught.value.reason == "parse.nul_bytes"
    assert "secretword" not in str(caught.value)
    assert caught.value.detail == f"10 NUL in {len(raw)} characters"


def test_one_percent_nul_is_stripped_and_more_rejects() -> None:
    assert normalize_text("\x00" + "a" * 99).changes == ("nul",)  # exactly 1%: stripped
    with pytest.raises(ParseReject):
        normalize_text("\x00" + "a" * 98)


def test_binary_controls_are_a_parse_reject() -> None:
    raw = "header " + "".join(chr(c) for c in (1, 2, 3, 4, 5, 6, 14, 15, 16, 17, 18)) * 3
    with pytest.raises(ParseReject) as caught:
        normalize_text(raw)
    assert caught.value.reason == "parse.control_chars"
    assert "header" not in caught.value.detail


def test_a_few_stray_controls_are_removed_not_rejected() -> None:
    assert normalize_text("x\x01y\x02z" + "w" * 500) == Normalized("xyz" + "w" * 500, ("control",))
    assert normalize_text("ok\x01") == Normalized("ok", ("control",))  # below the minimum count


def test_code_keeps_whitespace_byte_for_byte() -> None:
    raw = "def f():\r\n\tif x:  \r\n        return 1\t \r\n\x0c\n    pass   \n"
    result = normalize_text(raw, kind="code")
    assert result == Normalized(
        "def f():\n\tif x:  \n        return 1\t \n\x0c\n    pass   \n", ("crlf",)
    )


def test_code_removes_controls_but_does_not_interpret_them() -> None:
    # In code an ESC or a backspace is not a terminal instruction: it is just removed.
    raw = 'print("\x1b[1mbold")  # a_\x08b\n'
    assert normalize_text(raw, kind="code") == Normalized('print("[1mbold")  # a_b\n', ("control",))


def test_code_with_mostly_nul_is_rejected_too() -> None:
    with pytest.raises(ParseReject, match=r"parse\.nul_bytes"):
        normalize_text("x\x00\x00y", kind="code")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("  Hello,\t WORLD \n\n Straße  ", "hello, world strasse"),
        ("A\u00a0B\u3000C", "a b c"),  # NBSP and ideographic space are whitespace
        ("ǰ", unicodedata.normalize("NFC", "ǰ".casefold())),  # casefold can decompose
    ],
)
def test_dedup_normalize_prose(raw: str, expected: str) -> None:
    assert dedup_normalize(raw, "prose") == expected


def test_dedup_normalize_code_keeps_indentation() -> None:
    raw = "def f():   \n\n\n    return 1\t\n\x0c\n  \n"
    assert dedup_normalize(raw, "code") == "def f():\n    return 1"
    assert dedup_normalize("def f():\n    return 1\n", "code") == dedup_normalize(raw, "code")
    assert dedup_normalize("def f():\n  return 1", "code") != dedup_normalize(raw, "code")
    assert dedup_normalize("Return", "code") != dedup_normalize("return", "code")


def _fortunes() -> list[str]:
    shards = sorted((CORPORA / "fortunes").glob("*.jsonl.zst"))
    if not shards:
        pytest.skip(f"shared corpora not present at {CORPORA}")
    texts = []
    for shard in shards:
        with shard.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as reader:
            lines = reader.read().decode("utf-8").splitlines()
        texts += [json.loads(line)["text"] for line in lines]
    return texts


def test_real_fortunes_corpus() -> None:
    """Every fortune normalises to control-free NFC text, idempotently; none is a reject."""
    changes: dict[str, int] = {}
    for raw in _fortunes():
        result = normalize_text(raw)
        for change in result.changes:
            changes[change] = changes.get(change, 0) + 1
        text = result.text
        assert CONTROL.search(text) is None, raw[:80]
        assert unicodedata.is_normalized("NFC", text)
        assert normalize_text(text).text == text
    # Real corpora hold ANSI colour codes, backspace overstrike and CRLF.
    assert changes["ansi"] > 1000
    assert changes["overstrike"] > 50
    assert changes["crlf"] > 100
