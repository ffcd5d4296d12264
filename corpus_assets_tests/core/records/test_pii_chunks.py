"""PII redaction of a long text a newline-cut chunk at a time: byte-identical to the whole-text
implementation it replaced (kept here as the oracle), with bounded transient memory.

Token-shaped values are assembled at run time so no secret-looking literal sits in the repo.
"""

import re
import sys
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from corpus_assets.core.records import pii, pii_secrets
from corpus_assets.core.records.pii import redact_parts
from corpus_assets.core.records.text_chunks import line_cuts


def _old_splice(text: str, spans: list[tuple[int, int, str]]) -> str:
    parts, last = [], 0
    for start, end, placeholder in spans:
        parts += (text[last:start], placeholder)
        last = end
    parts.append(text[last:])
    return "".join(parts)


def _old_count(counts: dict[str, int], spans: list[tuple[int, int, str]]) -> None:
    for _, _, placeholder in spans:
        kind = pii._KIND[placeholder]
        counts[kind] = counts.get(kind, 0) + 1


def old_redact_parts(text: str) -> tuple[str, dict[str, int]]:
    """``redact_parts`` before chunking (whole-text ``subn`` and splices): the oracle."""
    counts: dict[str, int] = {}
    secrets = 0
    rules: list[tuple[bool, re.Pattern[str], str]] = [
        ("-----BEGIN " in text, pii._PEM, "[SECRET]"),
    ]
    for present, pattern, placeholder in rules:
        if present:
            text, n = pattern.subn(placeholder, text)
            secrets += n
    text, n = pii_secrets.redact_line_secrets(text)  # token shapes and key-value secrets
    secrets += n
    if secrets:
        counts["secret"] = secrets
    if "@" in text:
        spans = pii._email_spans(text)
        if spans:
            text = _old_splice(text, spans)
            _old_count(counts, spans)
    spans = pii._number_spans(text)
    if spans:
        text = _old_splice(text, spans)
        _old_count(counts, spans)
    if ":" in text:
        spans = pii._ipv6_spans(text)
        if spans:
            text = _old_splice(text, spans)
            _old_count(counts, spans)
    return text, counts


@contextmanager
def chunk_chars(size: int) -> Iterator[None]:
    """Shrink the chunk size so small texts cross many chunk boundaries."""
    old = pii._CHUNK_CHARS
    pii._CHUNK_CHARS = size
    try:
        yield
    finally:
        pii._CHUNK_CHARS = old


B64 = "MIIEpAIBAAKCAQEA0Z3VS5JJcds3xfn/ygWyF8PbnGy0AHB7MhgwMbRvI0MBZhpF"
FRAGMENTS = [
    *"\n\n\n\r \t.-/+():@_=,'\"[]0123456789aAeE1x",
    "\r\n",
    "\x00",
    "\x1b[31m",
    "\b",
    "e\u0301",
    "\u0301",
    "\U0001f600",
    "\u4e2d",
    "\ud800",
    "john.doe@example.co.uk",
    "a@b.io",
    "8.8.8.8",
    "1.2.3.4",
    "v2.10.0.1",
    "version 9.9.9.9",
    "+44 20 7946 0958",
    "(555) 123-4567",
    "1-800-555-0199",
    "020 7946 0958",
    "4111 1111 1111 1111",
    "4111111111111111",
    "2001:4860:4860::8888",
    "::",
    "AK" + "IAIOSFODNN7EXAMPLE",
    "aws_secret_access_key = " + "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "gh" + "p_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5",
    "xo" + "xb-1234567890-AbCdEf",
    "s" + "k-Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op",
    "ey" + "JhbGciOi.ey" + "JzdWIi.Sfl",
    "-----BEGIN RSA PRIVATE" + " KEY-----",
    "-----END RSA PRIVATE KEY-----",
    "Proc-Type: 4,ENCRYPTED",
    B64,
    B64[:20],
]
TEXTS = st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join)


@settings(max_examples=400, deadline=None)
@given(TEXTS, st.integers(1, 40))
@example("x\n/8.8.8.8\n", 2)
@example("2001:4860:4860::8888\n+44 20 7946 0958\n", 3)  # counts: phone before IPv6's ip
@example("a@b.io\n" + "AK" + "IAIOSFODNN7EXAMPLE\n", 3)  # counts: secret before email
@example("-----BEGIN RSA PRIVATE" + f" KEY-----\n{B64}\n{B64}\n-----END RSA PRIVATE KEY-----\n", 5)
@example("-----BEGIN RSA PRIVATE" + " KEY-----\n\n" + B64[:20] + "!\n" + "8.8.8.8\n", 3)
def test_chunked_redaction_equals_whole_text(text: str, size: int) -> None:
    """Any text, any chunk size: the same text and counts (keys in the same order)."""
    expected = old_redact_parts(text)
    with chunk_chars(size):
        got = redact_parts(text)
    assert got == expected
    assert list(got[1]) == list(expected[1])


def test_pem_block_is_never_cut() -> None:
    """A PEM block spans lines; the chunk cut moves past it."""
    key = "-----BEGIN RSA PRIVATE" + f" KEY-----\n{B64}\n{B64}\n-----END RSA PRIVATE KEY-----"
    text = "a\n" * 5 + key + "\nmail a@b.io\n" * 3
    with chunk_chars(4):
        assert redact_parts(text) == old_redact_parts(text)
    spans = [(m.start(), m.end(), "") for m in pii._PEM.finditer(text)]
    for cut in line_cuts(text, 4, spans):
        assert text[cut - 1] == "\n" or cut == len(text)
        assert not any(s <= cut - 1 < e for s, e, _ in spans)


def test_real_docs_sized_text_matches_in_default_chunks() -> None:
    """A text several default chunks long, with every kind of value, matches the oracle."""
    line = "".join(FRAGMENTS).replace("\n", " ") + "\n"
    text = line * (3 * pii._CHUNK_CHARS // len(line) + 1)
    assert len(text) > pii._CHUNK_CHARS
    assert redact_parts(text) == old_redact_parts(text)


def _peak(text: str) -> tuple[int, int]:
    """(tracemalloc peak of ``redact_parts``, size of its output)."""
    tracemalloc.start()
    try:
        out, _ = redact_parts(text)
        return tracemalloc.get_traced_memory()[1], sys.getsizeof(out)
    finally:
        tracemalloc.stop()


@pytest.mark.skipif(sys.gettrace() is not None, reason="a tracer disables in-place str append")
def test_long_text_peak_is_its_output_plus_a_chunk() -> None:
    """A 4M-character text at 4 bytes a character (one astral character): the transient
    memory is the output plus ~1 MiB; unchanged, ~1 MiB (the old code held ~10x)."""
    para = "word 12345 and mail u42@example.org, call +44 20 7946 0958 at 8.8.8.8.\n"
    text = "\U0001f600" + para * (4_000_000 // len(para))
    peak, out = _peak(text)
    assert out > 10_000_000
    assert peak - out < 2 << 20, (peak, out)
    clean = "\U0001f600" + "word twelve and mail nobody at home.\n" * 110_000
    peak, _ = _peak(clean)
    assert peak < 2 << 20, peak
