"""A record at ``max_chars`` costs a bounded multiple of its size on the row path.

``utf8`` (a long text encoded a window at a time) gives ``str.encode``'s bytes for every
window size; the whole row path (parse, canonicalise, screen, keep) of one record at the
bound is measured in a child process by its peak RSS (``bench/max_chars_memory.py``'s row
stage; the bench adds real python-docs text stored at 4 bytes per character).
"""

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus_assets.core.records import text_chunks
from corpus_assets_tests.paths import REPO

BENCH = REPO / "bench" / "max_chars_memory.py"


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(max_size=60).filter(lambda t: t.encode("utf-8", "ignore").decode() == t),
    window=st.integers(min_value=1, max_value=7),
)
def test_windowed_encoding_gives_the_same_bytes(text: str, window: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(text_chunks, "_ENCODE_WINDOW", window)
        assert text_chunks.utf8(text) == text.encode()


def _row_peak(kind: str, chars: int) -> float:
    """The bench's ``row`` stage for one record: peak RSS extra over the record's UTF-8 size."""
    out = subprocess.run(
        [sys.executable, str(BENCH), "--child", "row", kind, str(chars)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = json.loads(out)
    assert result["ok"], "the record was excluded: its columns were never built"
    return result["extra"] / result["size"]


@pytest.mark.parametrize("kind", ["ascii", "cjk"])
def test_a_record_at_the_max_chars_bound_costs_under_ten_times_its_size(kind: str) -> None:
    """At ``quality.max_chars``' upper bound (16M characters): digit-heavy ASCII (the number
    scans' worst case) and CJK (3 UTF-8 bytes per char). Below it a fixed ~50 MB (the screen's
    windows, hashed pieces, Arrow's pool) weighs more than the record."""
    assert _row_peak(kind, 16_000_000) < 10.0
