"""The check of an unchanged snapshot runs once: content rules reused, live rules and every
changed input re-run, a build killed inside its check resumes with only the rules still to run,
and the build's stat-trusting verify still catches a flipped byte."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import insert

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.publication.verify import verify
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import PARQUET
from corpus_assets.core.storage.catalog import tombstones
from corpus_assets.core.storage.failpoints import DIR_ENV, ENV, TRACE_ENV

SQLITE = pytest.mark.parametrize("catalog_url", ["sqlite"], indirect=True)  # plain SQL besides
LIVE = {"pinned_versions_readable", "no_open_dead_letters", "no_tombstone_hits"}
CLI = str(Path(sys.executable).parent / "corpus-assets")


def _metrics(report: object) -> dict[str, object]:
    shown = dict(report.gate.serialized())  # type: ignore[attr-defined]
    shown.pop("build_latency_seconds", None)  # the clock: a live metric
    return shown


def test_a_resumed_check_reuses_the_content_rules_and_a_new_tombstone_is_checked(
    workspace: Workspace,
) -> None:
    sid = build_all(workspace, "p1")["manifest"].digests["snapshotId"]
    first = validate_snapshot(workspace, sid)
    assert first.ok and first.rules_reused == [], first.findings

    resumed = validate_snapshot(workspace, sid)  # a resume where only the check was left
    assert resumed.ok, resumed.findings
    assert "canary_reproduces" in resumed.rules_reused
    assert "dedup_invariants_hold" in resumed.rules_reused
    assert not LIVE & set(resumed.rules_reused)  # these read state that moves: always run
    assert _metrics(resumed) == _metrics(first)  # the check shows the same gate report

    with workspace.catalog.begin() as conn:  # a tombstone below the watermark, committed late
        conn.execute(
            insert(tombstones).values(seq=0, record_id="essays/e0001", reason="test", at=0.0)
        )
    again = validate_snapshot(workspace, sid)
    assert again.findings == ["tombstone 0 (record 'essays/e0001') hits this snapshot"]
    assert again.rules_reused == []  # the fence state is in the key: everything re-ran


@SQLITE
def test_a_changed_rule_set_reruns_the_rules(workspace: Workspace, demo_home: Path) -> None:
    """The config the rules read is in the key: a stricter quality policy makes the canary
    replay differ, and a recorded pass must not hide it."""
    sid = build_all(workspace, "p1")["manifest"].digests["snapshotId"]
    assert validate_snapshot(workspace, sid).ok
    config = demo_home / "corpus.yaml"
    config.write_text(config.read_text() + "  quality: {min_chars: 200}\n")
    with open_workspace() as ws:
        report = validate_snapshot(ws, sid)
    assert report.rules_reused == []
    assert any(f.startswith("canary replay of") for f in report.findings), report.findings


@SQLITE
def test_an_unchanged_snapshot_in_a_new_partition_reuses_the_check(
    workspace: Workspace,
) -> None:
    first = build_all(workspace, "p1")["manifest"]
    assert validate_snapshot(workspace, first.digest).rules_reused == []
    second = build_all(workspace, "p2")["manifest"]
    assert second.digests["snapshotId"] != first.digests["snapshotId"]
    report = validate_snapshot(workspace, second.digest)
    assert report.ok, report.findings
    assert "canary_reproduces" in report.rules_reused


def _parquet_objects(ws: Workspace, sid: str) -> list[str]:
    """The Parquet objects the snapshot names (as verify walks them)."""
    walked = verify(ws.cas, ws.catalog, sid)
    return sorted(
        d for d in walked.verified if ws.cas.path(d).read_bytes()[:4] == b"PAR1"
    ) or pytest.fail(f"no {PARQUET} object")


@SQLITE
def test_the_build_check_trusts_unchanged_files_and_still_catches_a_flipped_byte(
    workspace: Workspace,
) -> None:
    sid = build_all(workspace, "p1")["manifest"].digests["snapshotId"]
    first = validate_snapshot(workspace, sid, trust_unchanged=True)
    assert first.ok, first.findings  # only the raw objects hashed before (by raw_snapshot)
    second = validate_snapshot(workspace, sid, trust_unchanged=True)
    assert second.ok and second.objects_trusted > first.objects_trusted
    assert second.bytes_checked < first.bytes_checked
    assert verify(workspace.cas, workspace.catalog, sid).objects_trusted == 0  # the CLI's

    victim = _parquet_objects(workspace, sid)[0]
    path = workspace.cas.path(victim)
    original, stat = path.read_bytes(), path.stat()
    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0x01
    path.write_bytes(bytes(flipped))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # even with its mtime put back
    report = validate_snapshot(workspace, sid, trust_unchanged=True)
    assert any(victim in f and "corrupt" in f for f in report.findings), report.findings
    assert report.rules_reused == []  # a finding: nothing recorded is reused

    path.write_bytes(original)
    assert validate_snapshot(workspace, sid, trust_unchanged=True).ok


def _build(tmp_path: Path, trace: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``corpus-assets build --partition p1`` as its own process group, tracing its failpoints."""
    return subprocess.run(
        [CLI, "build", "--partition", "p1"],
        env={**os.environ, TRACE_ENV: str(tmp_path / trace), **env},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )


def _rules_run(tmp_path: Path, trace: str) -> list[str]:
    """The rules the build's check ran (``validate/<rule>`` is hit as each one starts)."""
    points = (tmp_path / trace).read_text().split()
    return [p.removeprefix("validate/") for p in points if p.startswith("validate/")]


def test_a_build_killed_inside_its_check_resumes_with_the_rules_still_to_run(
    demo_home: Path, tmp_path: Path
) -> None:
    """SIGKILL of a real build's process group as its canary replay starts: the resumed build
    re-runs the canary and the live rules, not the content rules that had passed."""
    faults = tmp_path / "faults"
    faults.mkdir()
    kill = {ENV: "validate/canary_reproduces=kill@1", DIR_ENV: str(faults)}
    killed = _build(tmp_path, "killed.trace", **kill)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    passed = _rules_run(tmp_path, "killed.trace")[:-1]  # those before the canary
    assert {"lineage_complete", "dedup_invariants_hold", "packing_invariants_hold"} <= set(passed)

    resumed = _build(tmp_path, "resumed.trace")
    assert resumed.returncode == 0 and " state VALIDATED" in resumed.stdout, resumed.stderr
    ran = _rules_run(tmp_path, "resumed.trace")
    assert "canary_reproduces" in ran and set(ran) >= LIVE, ran
    rerun = set(ran) & set(passed)  # of the rules that had passed: only the live ones
    assert rerun <= LIVE | {"no_benchmark_hits"}, rerun
    assert len(set(passed) - rerun) >= 10, (passed, ran)
