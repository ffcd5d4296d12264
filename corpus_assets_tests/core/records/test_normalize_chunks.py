"""Normalisation of a long text a chunk at a time: byte-identical to the whole-text
implementation it replaced (kept here as the oracle), with bounded transient memory."""

import sys
import tracemalloc
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from corpus_assets.core.records import normalize as nz
from corpus_assets.core.records.normalize import ParseReject, normalize_parts


def old_normalize_parts(text: str, code: bool) -> tuple[str, tuple[str, ...]]:
    """``normalize_parts`` before chunking (whole-text encode, check and NFC): the oracle."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw.translate(None, nz._NEEDS_WORK_CODE if code else nz._NEEDS_WORK_PROSE)) == len(
        raw
    ) and (b"\xc2" not in raw or nz._C1.search(text) is None):
        if text.isascii() or unicodedata.is_normalized("NFC", text):
            return text, ()
        return unicodedata.normalize("NFC", text), ("nfc",)
    changes: list[str] = []
    if "\x00" in text:
        nul = text.count("\x00")
        if nz._exceeds(nul, len(text), nz.NUL_REJECT_PPM):
            raise ParseReject("parse.nul_bytes", f"{nul} NUL in {len(text)} characters")
        text = text.replace("\x00", "")
        changes.append("nul")
    if not code and "\x1b" in text:
        text, n = nz._ANSI.subn("", text)
        if n:
            changes.append("ansi")
    if "\r" in text:
        text = nz._CR.sub("\n", text)
        changes.append("crlf")
    if not code and "\b" in text:
        text = nz._overstrike(text)
        changes.append("overstrike")
    binary = len(nz._BINARY_CONTROL.findall(text))
    if binary >= nz.CONTROL_REJECT_MIN and nz._exceeds(binary, len(text), nz.CONTROL_REJECT_PPM):
        raise ParseReject(
            "parse.control_chars", f"{binary} binary control characters in {len(text)}"
        )
    text, n = (nz._CONTROL_CODE if code else nz._CONTROL_PROSE).subn("", text)
    if n:
        changes.append("control")
    if not text.isascii() and not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
        changes.append("nfc")
    return text, tuple(changes)


@contextmanager
def chunk_chars(size: int) -> Iterator[None]:
    """Shrink the chunk size so small texts cross many chunk boundaries."""
    old = nz._CHUNK_CHARS
    nz._CHUNK_CHARS = size
    try:
        yield
    finally:
        nz._CHUNK_CHARS = old


def _outcome(text: str, code: bool) -> object:
    try:
        return normalize_parts(text, code)
    except ParseReject as reject:
        return ("reject", reject.reason, reject.detail)


def _old_outcome(text: str, code: bool) -> object:
    try:
        return old_normalize_parts(text, code)
    except ParseReject as reject:
        return ("reject", reject.reason, reject.detail)


FRAGMENTS = [
    *"\n\n\n\n\r \tab_'`^\"~,e.",
    "\r\n",
    "\x00",
    "\x01",
    "\x07",
    "\x0b",
    "\x0c",
    "\x7f",
    "\x85",
    "\x9b",
    "\x1b[31m",
    "\x1b[1;",
    "\x1b]0;title\x07",
    "\x1b(B",
    "\x1b",
    "\b",
    "_\bx",
    "'\be",
    "e\u0301",
    "\u0301",
    "\u0327",
    "\u0323\u0307",
    "\u1100\u1161",
    "\u00e9",
    "\u2126",
    "\U0001f600",
    "\U0002f800",
    "\u4e2d",
    "\ud800",
    "\u00c5",
]
TEXTS = st.lists(st.sampled_from(FRAGMENTS), max_size=80).map("".join)


@settings(max_examples=500, deadline=None)
@given(TEXTS, st.booleans(), st.integers(1, 40))
@example("e\n\u0301\n" * 4, False, 2)
@example("\U0002f800\n" + "a\n" * 10, False, 3)
@example("\x01" * 4 + "\r\n" * 198, False, 16)  # 1% of the length after CRLF, not before
@example("\x00" * 3 + "a\r\n" * 100, True, 7)
def test_chunked_normalisation_equals_whole_text(text: str, code: bool, size: int) -> None:
    """Any text, either kind, any chunk size: the same text, changes or reject."""
    with chunk_chars(size):
        got = _outcome(text, code)
    assert got == _old_outcome(text, code)


def test_long_text_reject_counts_the_repaired_length() -> None:
    """The binary-control reject compares with the length after CRLF and overstrike fixes."""
    text = "\x01" * 4 + "\r\n" * 198
    with chunk_chars(16), pytest.raises(ParseReject) as caught:
        normalize_parts(text, False)
    assert caught.value.detail == "4 binary control characters in 202"


def test_unchanged_long_text_is_returned_uncopied() -> None:
    """A clean long text comes back as the same object."""
    text = "caf\u00e9 \U0001f600\n" * 1000
    with chunk_chars(64):
        assert normalize_parts(text, False)[0] is text


def _peak(text: str) -> tuple[int, int]:
    """(tracemalloc peak of ``normalize_parts``, size of its output)."""
    tracemalloc.start()
    try:
        out, _ = normalize_parts(text, False)
        return tracemalloc.get_traced_memory()[1], sys.getsizeof(out)
    finally:
        tracemalloc.stop()


@pytest.mark.skipif(sys.gettrace() is not None, reason="a tracer disables in-place str append")
def test_long_text_peak_is_its_output_plus_a_chunk() -> None:
    """A 4M-character text at 4 bytes a character needing NFC: the transient memory is the
    output plus ~1 MiB; already NFC, ~1 MiB (the old code held ~2-9x the text)."""
    text = "\U0001f600" + "cafe\u0301 au lait, s'il vous pla\u00eet.\n" * 120_000
    peak, out = _peak(text)
    assert out > 14_000_000
    assert peak - out < 2 << 20, (peak, out)
    clean = unicodedata.normalize("NFC", text)
    peak, _ = _peak(clean)
    assert peak < 2 << 20, peak


@pytest.mark.skipif(sys.gettrace() is not None, reason="a tracer disables in-place str append")
def test_long_text_with_terminal_fixes_peaks_at_its_output() -> None:
    """CRLF, overstrike, a stray BEL and NFC on a 4M-character text: still the output plus
    ~1 MiB (the old code held ~4x the output)."""
    text = "\U0001f600" + "cafe\u0301 au lait,\x07 s'il vous pla\u00eet._\bx\r\n" * 100_000
    tracemalloc.start()
    try:
        out, changes = normalize_parts(text, False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert changes == ("crlf", "overstrike", "control", "nfc")
    assert peak - sys.getsizeof(out) < 2 << 20, (peak, sys.getsizeof(out))
