"""A removed benchmark item through a build: ``excluded`` shows the exclusion it caused (where and
why, never the text), the snapshot built before the removal cannot activate, and the next build
keeps the record. On SQLite and PostgreSQL."""

import json

import pytest

from corpus_assets.cli.main import main
from corpus_assets.core.governance import alias_gate, benchmarks
from corpus_assets.core.publication.publish import activate, approve
from corpus_assets.core.records.normalize import dedup_key
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets_tests.core.governance.test_fence_heads import BENCHMARKED, _built, _demo_text


def _excluded(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict]:
    assert main(["excluded", *args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_excluded_rows_and_a_removed_item_no_longer_excludes(
    workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _demo_text(BENCHMARKED)
    digest = workspace.cas.put_bytes(text.encode())
    item = benchmarks.BenchmarkItem("quiz/1", digest, dedup_key(text))
    assert benchmarks.register(workspace.catalog, "quiz", [item]).seq == 1
    first, _manifest, members = _built(workspace, "p1")
    assert BENCHMARKED not in members

    every = _excluded(capsys, first)
    (hit,) = _excluded(capsys, first, "--reason", "contamination")
    assert hit in every and len(every) > 1  # the demo quarantines a few rows too
    assert (hit["source"], hit["reason"]) == ("essays", "contamination.benchmark")
    assert hit["object"].startswith("sha256:") and hit["line"] >= 1
    assert hit["detail"].startswith("item quiz/1 containment")
    columns = {"source", "name", "object", "line", "reason", "detail"}
    assert all(set(row) == columns for row in every)
    assert text[:40] not in json.dumps(every)  # the removed text never comes out
    assert _excluded(capsys, first, "--reason", "contamination.benchmark") == [hit]
    assert _excluded(capsys, first, "--source", "nosuch") == []
    by_source = _excluded(capsys, first, "--source", "essays")
    assert hit in by_source and all(row["source"] == "essays" for row in by_source)

    approve(workspace, first, by="reviewer")
    change = benchmarks.remove(workspace.catalog, "quiz", actor="test")
    assert (change.seq, change.written) == (2, 1)
    assert alias_gate.read_alias_gate(workspace.catalog, "demo").benchmark_fence == 2
    with pytest.raises(alias_gate.AliasGateError, match="benchmark fence 2"):
        activate(workspace, first, actor="test")  # built before the removal: must rebuild

    second, manifest, members = _built(workspace, "p2")
    assert manifest["benchmarkFence"] == "2" and BENCHMARKED in members
    assert _excluded(capsys, second, "--reason", "contamination") == []
    approve(workspace, second, by="reviewer")
    activate(workspace, second, actor="test")
    assert alias_gate.read_alias_gate(workspace.catalog, "demo").active_snapshot == second
