"""The layer's faster paths give exactly what the reference functions give.

- ``parse_line`` (orjson, falling back to the standard library) against ``_parse_stdlib``:
  same objects with the same types, same reason and detail when a line is excluded; big
  integers, NaN, out-of-range floats, lone surrogate escapes, duplicate keys, deep nesting.
- orjson's string and dict bytes against ``CANONICAL`` for every code point, and the
  byte-template digest (``digest_with``) against ``json_digest`` of the whole record.
- ``scripts_of`` (one array over a batch) against ``script_of`` per text.
- ``_number_spans``' numpy candidate path (long texts) against the ``finditer`` scan.
"""

import json
import subprocess
import sys
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from corpus_assets.core.records import pii
from corpus_assets.core.records.canonicalize import Excluded, _parse_stdlib, parse_line
from corpus_assets.core.records.envelope import CANONICAL, digest_with, envelope, template_for
from corpus_assets.core.records.scripts import script_of, scripts_of
from corpus_assets.core.storage.digests import json_digest
from corpus_assets_tests.core.records.test_canonical_fast_paths import (
    ANY_TEXT,
    MEMBERS,
    MIXED,
    PAYLOAD,
)


def _typed(value: Any) -> Any:
    """A value with its JSON types spelled out (``1 == 1.0`` and ``True == 1`` in Python)."""
    if isinstance(value, dict):
        return ("dict", [(k, _typed(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def _outcome(parse: Any, raw: bytes) -> Any:
    try:
        return _typed(parse(raw))
    except Excluded as why:
        return ("excluded", why.reason, why.detail)


SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)
LINES = [
    b'{"id": 123456789012345678901234567890, "text": "big"}',
    b'{"id": -9223372036854775809, "text": "just below i64"}',
    b'{"id": 18446744073709551616, "text": "just above u64"}',
    b'{"text": "n", "x": NaN, "y": -Infinity}',
    b'{"text": "f", "x": 1e400}',
    b'{"text": "lone \\ud800"}',
    b'{"text": "pair \\ud83d\\ude00"}',
    b'{"text": "a", "text": "b"}',
    b'\xef\xbb\xbf{"text": "bom"}',
    b'{"text": "raw \x01 control"}',
    b'{"text": "bad \xff byte"}',
    b"[" * 3000 + b"]" * 3000,
    b'{"a":' * 1200 + b"1" + b"}" * 1200,
    b'{"text": "x"} trailing',
    b"[1, 2]",
    b'{"text": 1.0, "id": -0.0, "ts": 5e-324}',
]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), VALUES, max_size=5))
@example({"id": 2**64, "text": "x"})
@example({"id": -(2**63) - 1, "nested": {"deep": [10**19]}})
def test_parse_line_matches_the_standard_library(obj: dict[str, Any]) -> None:
    for raw in (
        json.dumps(obj).encode(),
        json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass"),
    ):
        assert _outcome(parse_line, raw) == _outcome(_parse_stdlib, raw)


@pytest.mark.parametrize("raw", LINES)
def test_parse_line_matches_the_standard_library_on_edge_lines(raw: bytes) -> None:
    assert _outcome(parse_line, raw) == _outcome(_parse_stdlib, raw)


def test_orjson_writes_canonical_bytes_for_every_code_point() -> None:
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert orjson.dumps(every) == CANONICAL.encode(every).encode("utf-8")
    nested = {"b": [every[:300], {"z": None, "a": "\x00"}], "a": {"k": 1}}
    assert orjson.dumps(nested, option=orjson.OPT_SORT_KEYS) == CANONICAL.encode(nested).encode()


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries(MEMBERS), PAYLOAD)
def test_digest_with_is_the_digest_of_the_whole_record(
    members: dict[str, Any], payload: dict[str, Any]
) -> None:
    template = template_for(
        members["source_id"],
        members["kind"],
        members["adapter"],
        members["licence"],
        members["purposes"],
        members["retention"],
    )
    if template is None:  # a constant holding a marker string: record_digest's other path
        return
    varying = tuple(
        members[k] for k in ("record_id", "group_id", "lang", "script", "event_time", "pii")
    )
    payload_json = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    expected = json_digest({**envelope(**members), "payload": payload})
    assert digest_with(template, varying, payload_json) == expected  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(MIXED, ANY_TEXT), max_size=20), st.integers(1, 80))
@example(["ж" * 32 + "a" * 32, "", "a" * 64 + "ж", "x" * 2047 + "ж", "1_²"], 64)
def test_scripts_of_matches_script_of(texts: list[str], sample: int) -> None:
    assert scripts_of(texts, sample) == [script_of(t, sample) for t in texts]


NUMBERY = st.lists(
    st.sampled_from([*"0123456789 .-+()/=_:aZé\n", "1-800-", "+44 ", "(555) ", "192.0."]),
    max_size=80,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(NUMBERY, NUMBERY)
@example("4111 1111 1111 1111 (555) 123-4567 +44 20 7946 0958 8.8.8.8", "")
@example("", "1-800-555-0199 01 23 45 67 89 é")
@example("call +7 495 123 45 67", "")  # one digit after the '+': the international branch
def test_number_spans_long_path_matches_the_scan(head: str, tail: str) -> None:
    text = head + " " * pii._SCAN_CHARS + tail  # long enough for the numpy candidates
    reference: list[tuple[int, int, str]] = []
    for m in pii._NUMBERS.finditer(text):
        pii._number_span(text, m, reference)
    assert pii._number_spans(text) == reference


_PARSE_ONCE = """
import json, sys
from pathlib import Path
from corpus_assets.core.records.canonicalize import parse_line

def rss(field):
    status = Path("/proc/self/status").read_text().splitlines()
    line = next(x for x in status if x.startswith(field))
    return int(line.split()[1]) * 1024

text = "\\U0001F600 " + "word 1234567890123456789012 " * 150_000
raw = json.dumps({"id": 7, "text": text}, ensure_ascii=False).encode()
size = len(raw)
del text
Path("/proc/self/clear_refs").write_text("5")
base = rss("VmRSS")
obj = parse_line(raw)
print((rss("VmHWM") - base) / size)
"""


def test_a_digit_run_inside_a_long_text_is_parsed_once() -> None:
    """A 19-digit run inside a string is no wide integer: the line is parsed by orjson alone
    (about the text as Python holds it, 4 B/char here, plus the line once), never also decoded
    and parsed whole by the standard library (twice that)."""
    done = subprocess.run(
        [sys.executable, "-c", _PARSE_ONCE], capture_output=True, text=True, check=True
    )
    assert float(done.stdout) < 7.0
    text = "word 1234567890123456789012 " * 100
    raw = json.dumps({"id": 7, "text": text, "n": 2**70, "f": 1e300})
    assert _typed(parse_line(raw.encode())["n"]) == ("int", 2**70)  # a wide int still is one
    narrow = raw.replace(str(2**70), "1").encode()
    assert _outcome(parse_line, narrow) == _outcome(_parse_stdlib, narrow)
