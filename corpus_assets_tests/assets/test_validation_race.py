"""Two validations of one BUILDING snapshot at once (two Dagster runs of the same build, which
the CLI's partition lock does not cover): the one that loses the race to move it keeps the
winner's verdict instead of failing ``StateError: ... is VALIDATED, not BUILDING``."""

import os
import subprocess
import sys
import time
from pathlib import Path

from corpus_assets.core.governance import states
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.failpoints import DIR_ENV, ENV

VALIDATE = """
import sys
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.runtime.workspace import open_workspace
with open_workspace() as ws:
    validate_snapshot(ws, sys.argv[1])
"""


def _wait_for(path: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_validation_that_lost_the_race_keeps_the_winners_verdict(
    workspace: Workspace, tmp_path: Path
) -> None:
    sid = build_all(workspace, "p1")["manifest"].digests["snapshotId"]
    assert states.get(workspace.catalog, sid).state == states.BUILDING
    faults = tmp_path / "failpoints"
    faults.mkdir()
    env = {**os.environ, ENV: "validate/state-read=pause@1", DIR_ENV: str(faults)}
    loser = subprocess.Popen(
        [sys.executable, "-c", VALIDATE, sid], env=env, stderr=subprocess.PIPE, text=True
    )
    _wait_for(faults / "validate_state-read.paused")  # it read BUILDING and stopped there
    validate_snapshot(workspace, sid)  # the winner moves it first
    assert states.get(workspace.catalog, sid).state == states.VALIDATED
    (faults / "validate_state-read.go").touch()
    err = loser.communicate(timeout=300)[1]
    assert loser.returncode == 0, err[-800:]
    assert states.get(workspace.catalog, sid).state == states.VALIDATED
