"""What a case reads back from a home after its fault: intact objects, stuck tasks, stray temps,
runs left STARTED.

These read the home in this process (the catalog and CAS as the build left them), never
through the code under test's own verdicts alone.
"""

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import func, select

from corpus_assets.core.publication.trust_root import TRUST_ENV
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.catalog import chunk_tasks
from corpus_assets.core.storage.tasks import RUNNING
from corpus_assets.selftest.lab import Home


@contextmanager
def workspace(home: Home) -> Iterator[Workspace]:
    """The home opened in this process, trusting what its CLI processes trust (the lab's trust
    file, not this process's own)."""
    before = os.environ.get(TRUST_ENV)
    os.environ[TRUST_ENV] = str(home.trust_file)
    ws = open_workspace(home.config)
    try:
        yield ws
    finally:
        ws.catalog.engine.dispose()
        if before is None:
            os.environ.pop(TRUST_ENV, None)
        else:
            os.environ[TRUST_ENV] = before


def intact(ws: Workspace, digest: str) -> bool:
    """The CAS object is there and its bytes hash to its name."""
    path = ws.cas.path(digest)
    if not path.is_file():
        return False
    hasher = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            hasher.update(block)
    return f"sha256:{hasher.hexdigest()}" == digest


def stuck_tasks(ws: Workspace) -> int:
    """Chunk tasks still RUNNING (after every build process has ended, none should be)."""
    with ws.catalog.begin() as conn:
        return conn.execute(
            select(func.count()).select_from(chunk_tasks).where(chunk_tasks.c.status == RUNNING)
        ).scalar_one()


def stray_temps(home: Home) -> list[Path]:
    """Temp files left in the data home (``.tmp-*`` of atomic writes, ``*.partial`` downloads)."""
    data = home.dir / "data"
    return sorted([*data.rglob(".tmp-*"), *data.rglob("*.partial")]) if data.is_dir() else []


_STARTED = (
    "from dagster import DagsterInstance, DagsterRunStatus, RunsFilter; "
    "print(len(DagsterInstance.get().get_run_ids(RunsFilter(statuses=[DagsterRunStatus.STARTED]))))"
)


def started_runs(home: Home) -> int:
    """Runs the home's Dagster instance still shows STARTED once every process has ended: a run
    killed without reporting must not stay "in progress" in the UI's history."""
    done = subprocess.run(
        [sys.executable, "-c", _STARTED],
        env=home.env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return int(done.stdout.split()[-1])
