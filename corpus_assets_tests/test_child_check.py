"""The check of a child snapshot (+ new objects after its parent's) reuses what its parent's
check proved of the inputs they share - the canary replay of the unchanged first chunks - and
still fails on a tampered shared table, a tampered new one, or a changed rule set."""

import os
from pathlib import Path

import pytest

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.release.gates import canary_chunks
from corpus_assets.core.release.validation import validate_snapshot
from corpus_assets.core.release.verify import Report, load_manifest, resolve
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.selftest.corpus import write_zstd_jsonl

SQLITE = pytest.mark.parametrize("catalog_url", ["sqlite"], indirect=True)
CANARY = ("canary_chunks", "canary_lines", "transform_replay_hash", "set_difference")


def _parent_and_child(ws: Workspace, demo_home: Path) -> tuple[Report, str]:
    """The parent's passing build check, and a child's manifest digest: the same sources plus
    an object that sorts after every first chunk."""
    parent = build_all(ws, "p1")["manifest"].digest
    passed = validate_snapshot(ws, parent, trust_unchanged=True)
    assert passed.ok and passed.rules_reused == [], passed.findings
    rows = [{"id": f"n{n:04d}", "text": f"a new essay number {n} " * 20} for n in range(30)]
    write_zstd_jsonl(demo_home / "demo-sources/essays/essays-00002.jsonl.zst", rows)
    return passed, build_all(ws, "p2")["manifest"].digest


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(0, 0))  # the mtime is no cover: the ctime moved


def _canary_records(ws: Workspace, digest: str) -> Path:
    """The records table of the snapshot's first canary chunk."""
    manifest = load_manifest(ws.cas, resolve(ws.catalog, digest))
    canonical = CanonicalIndex.load(ws.cas, manifest["layers"]["canonical_records"])
    entry = next(e for e in canonical.entries if e.chunk == canary_chunks(canonical)[0])
    return ws.cas.path(canonical.descriptor(entry).records["digest"])


@SQLITE
def test_a_child_reuses_its_parents_canary_and_runs_the_rules_its_new_objects_touch(
    workspace: Workspace, demo_home: Path
) -> None:
    parent, child = _parent_and_child(workspace, demo_home)
    report = validate_snapshot(workspace, child, trust_unchanged=True)
    assert report.ok, report.findings
    assert report.rules_reused == ["canary_reproduces"]  # every other rule reads the new rows
    shown, before = report.gate.serialized(), parent.gate.serialized()
    assert {k: shown[k] for k in CANARY} == {k: before[k] for k in CANARY}


@SQLITE
def test_a_child_whose_shared_canary_table_was_tampered_with_fails(
    workspace: Workspace, demo_home: Path
) -> None:
    _, child = _parent_and_child(workspace, demo_home)
    shared = _canary_records(workspace, child)  # the parent's table, named by the child too
    _flip_a_byte(shared)
    report = validate_snapshot(workspace, child, trust_unchanged=True)
    assert any(shared.name in f and "corrupt" in f for f in report.findings), report.findings
    assert report.rules_reused == []


@SQLITE
def test_a_child_whose_new_table_was_tampered_with_fails(
    workspace: Workspace, demo_home: Path
) -> None:
    _, child = _parent_and_child(workspace, demo_home)
    members = workspace.cas.path(
        load_manifest(workspace.cas, resolve(workspace.catalog, child))["members"]["digest"]
    )
    _flip_a_byte(members)
    report = validate_snapshot(workspace, child, trust_unchanged=True)
    assert any(members.name in f for f in report.findings), report.findings
    assert report.rules_reused == []


@SQLITE
def test_a_child_checked_under_another_rule_set_replays_its_canary(
    workspace: Workspace, demo_home: Path
) -> None:
    """The config the canary canonicalises with is in its key: a stricter quality policy must
    replay (and differ), not reuse the parent's pass."""
    _, child = _parent_and_child(workspace, demo_home)
    config = demo_home / "corpus.yaml"
    config.write_text(config.read_text() + "  quality: {min_chars: 200}\n")
    with open_workspace() as ws:
        report = validate_snapshot(ws, child, trust_unchanged=True)
    assert "canary_reproduces" not in report.rules_reused
    assert any(f.startswith("canary replay of") for f in report.findings), report.findings
