"""The canary replays a fixed, bounded set of source rows and names the first row that differs."""

from pathlib import Path

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.publication.verify import Report
from corpus_assets.core.runtime.workspace import open_workspace

SOURCES = 3  # the demo's sources, each one chunk first in its source


def _with_policies(demo_home: Path, *lines: str) -> None:
    config = demo_home / "corpus.yaml"
    config.write_text(config.read_text() + "".join(f"  {line}\n" for line in lines))


def _built_and_checked(demo_home: Path, canary_lines: str) -> Report:
    """The demo built under ``validation: {canary_lines: ...}`` and its validation report."""
    _with_policies(demo_home, f"validation: {{canary_lines: {canary_lines}}}")
    with open_workspace() as ws:
        sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
        return validate_snapshot(ws, sid)


def test_the_canary_replays_the_first_lines_of_each_source_and_no_more(demo_home: Path) -> None:
    report = _built_and_checked(demo_home, "5")
    assert report.ok, report.findings
    assert (report.gate.canary_chunks, report.gate.canary_lines) == (SOURCES, 5 * SOURCES)
    assert report.gate.set_difference == 0


def test_whole_chunks_when_the_bound_is_null(demo_home: Path) -> None:
    report = _built_and_checked(demo_home, "null")
    assert report.ok, report.findings
    assert report.gate.canary_lines > 5 * SOURCES  # the demo's first chunks hold 21-122 lines


def test_a_replayed_row_that_differs_is_named_by_line(demo_home: Path) -> None:
    """Code or config that canonicalises the canary rows differently rejects the snapshot,
    the finding naming the chunk, the bound and the first differing line."""
    _with_policies(demo_home, "validation: {canary_lines: 5}")
    with open_workspace() as ws:
        sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
    _with_policies(demo_home, "quality: {min_chars: 100000}")  # now every row is quarantined
    with open_workspace() as ws:
        report = validate_snapshot(ws, sid)
    canary = [f for f in report.findings if f.startswith("canary replay of")]
    assert len(canary) == SOURCES, report.findings
    assert all("(source lines 1-5)" in f for f in canary), canary
    assert all("the replay excluded line 1 (quality.too_short)" in f for f in canary), canary
    assert all("the snapshot kept line 1 as " in f for f in canary), canary
    assert report.gate.set_difference == SOURCES


def test_a_changed_text_is_caught_through_its_digests(demo_home: Path) -> None:
    """The stored text and payload are compared through ``record_digest`` and ``text_digest``
    (never read): turning PII redaction off changes the first chat's text, and the finding
    names the line and those columns."""
    _with_policies(demo_home, "validation: {canary_lines: 5}")
    with open_workspace() as ws:
        sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
    _with_policies(demo_home, "pii: {redact: false}")  # chats line 1 holds an e-mail address
    with open_workspace() as ws:
        report = validate_snapshot(ws, sid)
    chats = [f for f in report.findings if f.startswith("canary replay of chats/")]
    assert len(chats) == 1, report.findings
    assert ": line 1: " in chats[0] and "record_digest" in chats[0], chats
    assert "text_digest" in chats[0], chats
