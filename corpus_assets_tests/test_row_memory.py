"""A record at ``max_chars`` costs a bounded multiple of its size on the row path.

``utf8`` (a long text encoded a window at a time) gives ``str.encode``'s bytes for every
window size; the whole row path (parse, canonicalise, keep) of one long record is measured
in a child process by its peak RSS (``bench/max_chars_memory.py`` runs the full-size case).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus_assets.core.records import canonicalize

BENCH = Path(__file__).resolve().parents[1] / "bench" / "max_chars_memory.py"


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(max_size=60).filter(lambda t: t.encode("utf-8", "ignore").decode() == t),
    window=st.integers(min_value=1, max_value=7),
)
def test_windowed_encoding_gives_the_same_bytes(text: str, window: int) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(canonicalize, "_ENCODE_WINDOW", window)
        assert canonicalize.utf8(text) == text.encode()


def _row_peak(kind: str, chars: int) -> float:
    """The bench's ``row`` stage for one record: peak RSS extra over the record's UTF-8 size."""
    out = subprocess.run(
        [sys.executable, str(BENCH), "--child", "row", kind, str(chars)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = json.loads(out)
    return result["extra"] / result["size"]


@pytest.mark.parametrize("kind", ["ascii", "cjk"])
def test_a_long_record_costs_a_bounded_multiple_of_its_size(kind: str) -> None:
    assert _row_peak(kind, 4_000_000) < 10.0
