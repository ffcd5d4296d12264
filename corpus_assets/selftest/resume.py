"""Kill a build at one failpoint hit and resume it: the one helper of the power-loss and sweep
cases. A traced undisturbed build lists the points a build passes (``CORPUS_FAILPOINT_TRACE``);
a kill run SIGKILLs its whole process group at hit ``k`` of ``*`` (a CLI build, or a
``dagster job execute`` run of ``build_snapshot`` as the daemon would launch it); a plain
``build --partition`` resumes, traced, so the chunk tasks it re-ran are counted, not guessed."""

import json
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from corpus_assets.core.runtime.layer_index import LAYERS
from corpus_assets.core.storage.failpoints import DIR_ENV, ENV, TRACE_ENV
from corpus_assets.selftest.evidence import started_runs, stray_temps, stuck_tasks, workspace
from corpus_assets.selftest.lab import PARTITION, Home, Lab, SelftestError, error_line, parse_built

CLI, DAGSTER = "cli", "dagster"
_TRACES: "weakref.WeakKeyDictionary[Lab, Trace]" = weakref.WeakKeyDictionary()


# chunk-task stages run inside a layer's step: MinHash signatures in dedup, tokens in splits
STAGE_LAYER = {"dedup_signatures": "dedup_clusters", "tokens": "splits"}


def layer_of(point: str) -> str:
    """The layer a point belongs to (``pin/...`` is the raw snapshot's listing, ``validate/...``
    the manifest's check)."""
    kind, _, rest = point.partition("/")
    name = {"pin": "raw_snapshot", "validate": "manifest"}.get(kind, rest.split("/")[0])
    return STAGE_LAYER.get(name, name)


@dataclass(frozen=True)
class Trace:
    """The points an undisturbed build passed, in order, and the snapshotId it built."""

    points: tuple[str, ...]
    snapshot_id: str

    @property
    def tasks(self) -> int:
        return count_tasks(self.points)

    def layers(self) -> list[str]:
        seen = {layer_of(p) for p in self.points}
        return [layer for layer in LAYERS if layer in seen]


def count_tasks(points: tuple[str, ...] | list[str]) -> int:
    """Chunk tasks that ran to SUCCESS (``task/<layer>`` is hit only after real work)."""
    return sum(point.startswith("task/") for point in points)


def count_rules(points: tuple[str, ...] | list[str]) -> int:
    """Validity rules the build's check started (``validate/<rule>``, hit as each one starts)."""
    return sum(p.startswith("validate/") and p != "validate/state-read" for p in points)


def _read(path: Path) -> tuple[str, ...]:
    return tuple(path.read_text().split()) if path.exists() else ()


def reference_trace(lab: Lab) -> Trace:
    """A traced undisturbed build of the standard corpus at ``PARTITION`` (once per lab)."""
    if lab not in _TRACES:
        home = lab.standard_home("traced")
        trace = home.dir / "trace.txt"
        code, out, err = _finish(home.start("build", "--partition", PARTITION, env=_env(trace)))
        if code != 0:
            raise SelftestError(f"traced reference build failed: {err.strip()[-300:]}")
        _TRACES[lab] = Trace(_read(trace), parse_built(out).snapshot_id)
    return _TRACES[lab]


@dataclass(frozen=True)
class Resumed:
    """One kill point, killed and resumed: what the two runs and the home showed."""

    nth: int
    kind: str
    reached: str  # the point the kill fired at ("" if it never fired)
    kill_code: int
    tasks_before: int  # chunk tasks finished before the kill
    tasks_rerun: int  # chunk tasks the resume ran (the rest it skipped)
    rules_rerun: int  # validity rules the resume's check ran (the rest it reused or never had)
    resume_code: int
    resume_error: str
    snapshot_id: str | None
    resume_seconds: float
    stuck: int
    strays: int
    started: int  # Dagster runs left STARTED (the killed one must be marked failed)
    announced: bool  # the resume said it resumes after a run that died

    @property
    def killed(self) -> bool:
        return self.kill_code == -9 and bool(self.reached)

    def good(self, trace: Trace) -> bool:
        """Killed, resumed to the reference snapshotId, nothing finished re-run, clean."""
        return (
            self.killed
            and self.resume_code == 0
            and self.snapshot_id == trace.snapshot_id
            and self.tasks_rerun == trace.tasks - self.tasks_before
            and self.stuck == 0
            and self.strays == 0
            and self.started == 0
            and self.announced
        )

    def line(self) -> str:
        return (
            f"#{self.nth} {self.kind} {self.reached or 'not reached'}: "
            f"resume {self.resume_seconds:.1f} s, reused {self.tasks_before} reran "
            f"{self.tasks_rerun} tasks"
        )


def kill_and_resume(lab: Lab, nth: int, kind: str = CLI, name: str = "kill") -> Resumed:
    """A fresh standard home; a build (``kind``) SIGKILLed at hit ``nth``; then resumed."""
    home = lab.standard_home(f"{name}-{kind}-{nth}")
    faults = Path(tempfile.mkdtemp(prefix="fp-", dir=home.dir))
    killed_trace, resume_trace = home.dir / "killed.trace", home.dir / "resume.trace"
    env = {**_env(killed_trace), ENV: f"*=kill@{nth}", DIR_ENV: str(faults)}
    kill_code = _finish(_start_dagster(home, env) if kind == DAGSTER else _start_cli(home, env))[0]
    reached = faults / "ANY.reached"
    started = time.perf_counter()
    code, out, err = _finish(home.start("build", "--partition", PARTITION, env=_env(resume_trace)))
    seconds = time.perf_counter() - started
    with workspace(home) as ws:
        stuck = stuck_tasks(ws)
    return Resumed(
        nth=nth,
        kind=kind,
        reached=reached.read_text() if reached.exists() else "",
        kill_code=kill_code,
        tasks_before=count_tasks(_read(killed_trace)),
        tasks_rerun=count_tasks(_read(resume_trace)),
        rules_rerun=count_rules(_read(resume_trace)),
        resume_code=code,
        resume_error=error_line(err),
        snapshot_id=parse_built(out).snapshot_id if code == 0 else None,
        resume_seconds=seconds,
        stuck=stuck,
        strays=len(stray_temps(home)),
        started=started_runs(home),
        announced="resuming after run" in err,
    )


def _env(trace: Path) -> dict[str, str]:
    return {TRACE_ENV: str(trace)}


def _finish(process: "subprocess.Popen[str]", timeout: float = 600) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def _start_cli(home: Home, env: dict[str, str]) -> "subprocess.Popen[str]":
    return home.start("build", "--partition", PARTITION, env=env)


def _start_dagster(home: Home, env: dict[str, str]) -> "subprocess.Popen[str]":
    """``dagster job execute`` of ``build_snapshot`` for ``PARTITION`` in its own process group
    (the way a run launcher starts a run), after adding the partition as ``build`` would."""
    add = "from corpus_assets.cli.instance import dagster_instance; dagster_instance()"
    add += f".add_dynamic_partitions('snapshots', [{PARTITION!r}])"
    subprocess.run([sys.executable, "-c", add], env=home.env(), cwd=home.dir, check=True)
    dagster = Path(sys.executable).with_name("dagster")
    tags = json.dumps({"dagster/partition": PARTITION})
    command = [str(dagster), "job", "execute", "-m", "corpus_assets.definitions"]
    return subprocess.Popen(
        [*command, "-j", "build_snapshot", "--tags", tags],
        env={**home.env(), **env},
        cwd=home.dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
