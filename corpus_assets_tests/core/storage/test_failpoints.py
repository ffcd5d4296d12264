"""Fault-injection points: rules parse or are refused by name; ``kill@N`` SIGKILLs the process
group at the N-th hit counted across processes; ``pause@N`` waits for its go file; the trace
lists every point passed."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corpus_assets.core.storage.failpoints import Rule, parse

SCRIPT = """
import sys
from corpus_assets.core.storage import failpoints
for n in range(5):
    failpoints.hit(sys.argv[1])
    print(n, flush=True)
"""


def _run(tmp_path: Path, spec: str, point: str = "task/x") -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "CORPUS_FAILPOINTS": spec,
        "CORPUS_FAILPOINT_DIR": str(tmp_path),
        "CORPUS_FAILPOINT_TRACE": str(tmp_path / "trace"),
    }
    return subprocess.Popen(
        [sys.executable, "-c", SCRIPT, point],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def test_rules_parse_and_a_malformed_one_is_named() -> None:
    assert parse(" task/*=kill@3 , gate/x=pause@1") == [
        Rule("task/*", "kill", 3),
        Rule("gate/x", "pause", 1),
    ]
    assert Rule("task/*", "kill", 1).matches("task/dedup")
    assert not Rule("task/a", "kill", 1).matches("task/ab")
    for bad in ("x=kill", "x=stop@1", "=kill@1", "x=kill@0"):
        with pytest.raises(ValueError, match=f"{bad!r} is not POINT="):
            parse(bad)


def test_kill_at_the_nth_hit_ends_the_process_group(tmp_path: Path) -> None:
    process = _run(tmp_path, "task/*=kill@3")
    out, _ = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    assert out.split() == ["0", "1"]  # killed at the third hit, before printing it
    assert (tmp_path / "task_ANY.reached").read_text() == "task/x"
    assert (tmp_path / "trace").read_text().split() == ["task/x"] * 3


def test_pause_waits_for_the_go_file(tmp_path: Path) -> None:
    process = _run(tmp_path, "task/x=pause@2")
    paused = tmp_path / "task_x.paused"
    deadline = time.monotonic() + 60
    while not paused.exists():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.02)
    assert process.poll() is None  # paused, waiting for its go file
    (tmp_path / "task_x.go").touch()
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and out.split() == ["0", "1", "2", "3", "4"]
