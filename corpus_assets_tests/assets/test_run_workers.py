"""A build killed without reporting (SIGKILL of its process group) must not stay "started" in the
Dagster run history: Dagster's run monitoring, run by the real ``dagster-daemon`` with
the shipped instance config, marks it failed; ``status`` names the partition killed before its
manifest; the next ``build --partition`` says it resumes after the run that died."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corpus_assets.cli.instance import DAGSTER_YAML
from corpus_assets.core.runtime.liveness import Liveness, Worker, liveness, this_worker
from corpus_assets.core.storage.failpoints import DIR_ENV, ENV
from corpus_assets.selftest.lab import PARTITION, Home, Lab, parse_built
from corpus_assets_tests.paths import REPO


def _killed_build(home: Home, at: str) -> tuple[int, str]:
    """``build --partition p1`` SIGKILLed (whole process group) at failpoint ``at``."""
    faults = home.dir / f"faults-{len(list(home.dir.glob('faults-*')))}"
    faults.mkdir()
    env = {ENV: at, DIR_ENV: str(faults)}
    process = home.start("build", "--partition", PARTITION, env=env)
    _out, err = process.communicate(timeout=600)
    return process.returncode, err


def _runs(home: Home) -> list[tuple[str, str]]:
    """(run id, status) of every run in the home's instance, read in a fresh process."""
    code = (
        "import json; from dagster import DagsterInstance; "
        "print(json.dumps([[r.run_id, r.status.value] for r in DagsterInstance.get().get_runs()]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=home.env(), capture_output=True, text=True, check=True
    )
    return [tuple(pair) for pair in json.loads(done.stdout)]


def _failure(home: Home, run_id: str) -> str:
    """The run-failure message the run history shows for ``run_id``."""
    code = (
        "from dagster import DagsterInstance; "
        "from corpus_assets.assets.run_workers import failure_message; "
        f"i = DagsterInstance.get(); print(failure_message(i, i.get_run_by_id({run_id!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=home.env(), capture_output=True, text=True, check=True
    )
    return done.stdout


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Lab(tmp_path).standard_home("killed")


@pytest.mark.heavy  # a crash test: a build killed mid-run
def test_status_and_the_next_build_name_a_run_killed_before_its_manifest(home: Home) -> None:
    code, _err = _killed_build(home, "task/*=kill@7")
    assert code == -signal.SIGKILL
    [(first, status)] = _runs(home)
    assert status == "STARTED"  # what nothing but a worker check can change

    ran = home.cli("status")
    line = next(x for x in ran.out.splitlines() if x.startswith(f"partition {PARTITION}:"))
    assert "no snapshot yet" in line and f"last run {first} FAILURE" in line, ran.out
    assert "is gone: killed before it could report" in line
    assert f"`corpus-assets build --partition {PARTITION}` resumes it" in line
    assert _runs(home) == [(first, "FAILURE")]

    code, err = _killed_build(home, "layer/splits/*=kill@1")  # again, further on
    assert code == -signal.SIGKILL, err[-500:]
    assert f"resuming after run {first} died" not in err  # status already marked that one
    second = next(run for run, status in _runs(home) if run != first)

    resumed = home.cli("build", "--partition", PARTITION)
    assert resumed.code == 0, resumed.err[-800:]
    assert f"partition {PARTITION}: resuming after run {second} died (pid " in resumed.err
    assert parse_built(resumed.out).state == "VALIDATED"
    assert sorted(status for _run, status in _runs(home)) == ["FAILURE", "FAILURE", "SUCCESS"]
    assert "no snapshot yet" not in home.cli("status").out


@pytest.mark.heavy  # a crash test under the real dagster-daemon
def test_the_daemons_run_monitoring_marks_a_killed_run_failed(home: Home) -> None:
    code, _err = _killed_build(home, "task/*=kill@3")
    assert code == -signal.SIGKILL
    [(killed, _status)] = _runs(home)
    # what `make ui` runs with (the root config, its storage in this DAGSTER_HOME)
    (home.dir / "dagster" / "dagster.yaml").write_text(DAGSTER_YAML)
    daemon = subprocess.Popen(
        [str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w", "workspace.yaml"],
        env=home.env(),
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while dict(_runs(home))[killed] == "STARTED" and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()
    assert dict(_runs(home))[killed] == "FAILURE"  # the daemon's sensors may have added runs
    assert "is gone: killed before it could report" in _failure(home, killed)


def test_a_worker_is_alive_until_killed_and_reaped_and_a_reused_pid_is_not_it() -> None:
    assert liveness(this_worker()) is Liveness.ALIVE
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    me = this_worker()
    worker = Worker(me.host, child.pid, _start(child.pid))
    assert liveness(worker) is Liveness.ALIVE
    assert liveness(Worker(me.host, child.pid, worker.start + 1)) is Liveness.DEAD  # reused pid
    child.kill()
    _until_a_zombie(child.pid)
    assert liveness(worker) is Liveness.DEAD  # a zombie: killed, not yet reaped
    child.wait()
    assert liveness(worker) is Liveness.DEAD
    assert liveness(Worker("another-host", os.getpid(), 0)) is Liveness.UNKNOWN
    assert Worker.parse(worker.tag()) == worker and Worker.parse("nonsense") is None


def _until_a_zombie(pid: int, timeout: float = 60) -> None:
    """Until the killed child is a zombie (state Z: dead, not yet reaped by its parent)."""
    deadline = time.monotonic() + timeout
    while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        assert time.monotonic() < deadline, f"{pid} was never a zombie"
        time.sleep(0.01)


def _start(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
