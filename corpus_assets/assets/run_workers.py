"""Runs whose worker died stay "started" in Dagster's history unless something looks: this module
names every run's worker process (a run tag) and tells Dagster's run monitoring whether it lives.

Dagster's ``DefaultRunLauncher`` cannot check a run worker's health, so its run monitoring never
fails a run whose process was SIGKILLed, and neither sees runs the CLI executes in its own process.
``WorkerCheckingRunLauncher`` (named in ``dagster.yaml``) is that launcher plus the check: the
daemon's run monitoring asks it about every started run and marks a run failed once its worker
is gone. ``build --partition KEY`` and ``status`` use the same check without waiting for a daemon.
"""

from dataclasses import dataclass

import dagster as dg
from dagster._core.launcher import CheckRunHealthResult, WorkerStatus

from corpus_assets.core.runtime.liveness import Liveness, Worker, liveness, this_worker

WORKER_TAG = "corpus/worker"
GONE = "run worker {} is gone: killed before it could report"


@dataclass(frozen=True)
class DeadRun:
    """A started run whose worker is gone, as reported to the run history."""

    run_id: str
    worker: Worker

    def describe(self) -> str:
        return f"run {self.run_id} died ({self.worker.describe()} is gone)"


def record_worker(instance: dg.DagsterInstance, run: dg.DagsterRun) -> None:
    """Name this process as ``run``'s worker (once: the first process to run a step of it)."""
    if WORKER_TAG not in run.tags:
        instance.add_run_tags(run.run_id, {WORKER_TAG: this_worker().tag()})


def run_worker(run: dg.DagsterRun) -> Worker | None:
    return Worker.parse(run.tags.get(WORKER_TAG, ""))


def worker_health(run: dg.DagsterRun) -> CheckRunHealthResult:
    """FAILED only for a worker known dead; a run without a named worker, or one on another
    host, reads as running (run monitoring fails any other answer)."""
    worker = run_worker(run)
    if worker is None:
        return CheckRunHealthResult(WorkerStatus.RUNNING, "no worker named yet")
    state = liveness(worker)
    if state is Liveness.DEAD:
        return CheckRunHealthResult(WorkerStatus.FAILED, GONE.format(worker.describe()))
    return CheckRunHealthResult(WorkerStatus.RUNNING, f"run worker {worker.describe()}: {state}")


class WorkerCheckingRunLauncher(dg.DefaultRunLauncher):
    """The default launcher, plus the worker health check Dagster's run monitoring calls."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        return worker_health(run)


def fail_dead_runs(instance: dg.DagsterInstance, partition: str | None = None) -> list[DeadRun]:
    """Mark failed every started run (of ``partition``, if given) whose worker is gone, as run
    monitoring would on its next poll, and say which."""
    tags = {"dagster/partition": partition} if partition else None
    filters = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED], tags=tags)
    dead = []
    for run in instance.get_runs(filters=filters):
        worker = run_worker(run)
        if worker is None or liveness(worker) is not Liveness.DEAD:
            continue
        found = DeadRun(run.run_id, worker)
        instance.report_run_failed(run, f"{GONE.format(worker.describe())}")
        dead.append(found)
    return dead


def last_runs(instance: dg.DagsterInstance, job_name: str) -> dict[str, dg.DagsterRun]:
    """The newest run of ``job_name`` for each partition (after dead ones are marked failed)."""
    fail_dead_runs(instance)
    latest: dict[str, dg.DagsterRun] = {}
    for run in instance.get_runs(filters=dg.RunsFilter(job_name=job_name), limit=1000):
        latest.setdefault(run.tags.get("dagster/partition", ""), run)  # newest first
    latest.pop("", None)
    return latest


def failure_message(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str | None:
    """The run-failure event's message: why the run history says it failed."""
    events = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    return events[-1].message if events else None
