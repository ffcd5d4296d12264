"""Where chunk tasks run: a local spawn pool (default) or a Ray cluster, behind one interface.

A chunk task's output is keyed and stored by content (``storage.tasks.run_chunk``), and callers
assemble results in job order, so the bytes never depend on the engine or the worker count. Both
runners hand each worker ``setup(config_path, corpus_env, *args)`` once, so it reopens the
workspace from the same config file with the same ``CORPUS_*`` environment. With Ray this means
the data home (CAS + catalog) and the config file must be reachable at the same paths from every
Ray worker: a shared filesystem (here: one machine's local disk), and ``corpus_assets`` installed
in the workers' Python (the same image or virtualenv).
"""

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from corpus_assets.core.runtime.execution import Execution
from corpus_assets.core.runtime.pool import Setup, WorkerSetup, pool_map, pool_running, run_job

__all__ = [
    "LocalRunner",
    "RayRunner",
    "RayUnavailable",
    "Setup",
    "WorkerSetup",
    "task_runner",
]


class TaskRunner(Protocol):
    """Maps a module-level function over jobs on worker processes, results in job order."""

    def wants(self, jobs: int, input_bytes: int | None = None) -> bool:
        """True if ``jobs`` jobs should go to workers (False: the caller runs them in-process).
        ``input_bytes``: what the jobs read as stored, when the caller knows it."""
        ...

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any], setup: WorkerSetup) -> list[Any]:
        """``[fn(job) for job in jobs]``, each run in a worker after ``setup``."""
        ...


@dataclass(frozen=True)
class LocalRunner:
    """``workers`` spawned processes on this machine (1 = in-process): the build's pool when a
    ``pool.shared_pool`` session is open (a Dagster run), else one for this map."""

    workers: int = 1
    in_process_bytes: int = 0

    def wants(self, jobs: int, input_bytes: int | None = None) -> bool:
        """More than one worker's worth of jobs, unless they read at most ``in_process_bytes``
        and the build's pool has not started: a child's few new chunks cost less here than
        the ~1 CPU-s of imports each spawn worker pays first."""
        if min(self.workers, jobs) <= 1:
            return False
        small = input_bytes is not None and input_bytes <= self.in_process_bytes
        return not small or pool_running(self.workers)

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any], setup: WorkerSetup) -> list[Any]:
        return pool_map(fn, jobs, setup, self.workers)


class RayUnavailable(RuntimeError):
    """The Ray cluster did not run a task within its bound: a failed build, never a hung one."""


@dataclass(frozen=True)
class RayRunner:
    """One Ray task per job on the cluster at ``address`` (``auto``: the one this machine has
    joined; ``local``: start one in this process). Every job goes to the cluster.

    Bounded: a trivial probe task must come back within ``startup_timeout_s`` before any job is
    sent (Ray queues tasks forever when no worker can start), and the map fails when no job has
    finished for ``task_timeout_s``; both raise ``RayUnavailable`` and cancel what is pending,
    as does a failed job (its error is raised as soon as it is seen). Each task (the probe too)
    asks for ``memory_mb`` of a node's memory: Ray starts no more tasks on a node than fit."""

    address: str
    task_timeout_s: float = Execution().task_timeout_s  # the config's defaults: one source
    startup_timeout_s: float = Execution().startup_timeout_s
    memory_mb: int = Execution().worker_memory_mb

    def wants(self, jobs: int, input_bytes: int | None = None) -> bool:
        return jobs > 0  # the cluster's workers are up; the driver may not hold the data

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any], setup: WorkerSetup) -> list[Any]:
        ray = _connected(self.address, self.startup_timeout_s)
        _probe(ray, self.address, self.startup_timeout_s, self.memory_mb)
        remote = ray.remote(run_job).options(memory=self.memory_mb << 20)
        refs = [remote.remote(fn, job, setup) for job in jobs]
        return _gather(ray, refs, self.address, self.task_timeout_s)


def _connected(address: str, timeout_s: float) -> Any:
    """The ``ray`` module, connected once per process (imported lazily: it is an optional
    extra, ``corpus-assets[ray]``). A ``host:port`` nobody listens on fails here: ``ray.init``
    itself would retry it for minutes."""
    try:
        import ray
    except ImportError:  # pragma: no cover - depends on the installed extras
        raise RuntimeError(
            "execution.engine is 'ray' but ray is not installed: pip install 'corpus-assets[ray]'"
        ) from None
    if not ray.is_initialized():
        if address not in ("auto", "local"):
            _reachable(address, timeout_s)
        if address.startswith("ray://"):
            _client_connect(ray, address, timeout_s)
        else:
            ray.init(address=None if address == "local" else address, log_to_driver=False)
    return ray


def _client_connect(ray: Any, address: str, timeout_s: float) -> None:
    """Ray Client gives up after three tries (5, 10, 15 s), which a busy head can need just to
    start this client's server process: retry until ``timeout_s``, then ``RayUnavailable``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.init(address=address, log_to_driver=False)
            return
        except ConnectionError as error:
            ray.shutdown()
            if time.monotonic() >= deadline:
                raise RayUnavailable(
                    f"execution.address {address}: the Ray Client server answers but no session "
                    f"opened within execution.startup_timeout_s={timeout_s:g}s ({error}). Check "
                    "the head's logs (ray_client_server*.err) and that its ray version matches."
                ) from None


def _reachable(address: str, timeout_s: float) -> None:
    """Raise ``RayUnavailable`` unless a TCP connection to ``address`` opens within the bound."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=min(timeout_s, 30.0)).close()
    except OSError as error:
        raise RayUnavailable(
            f"execution.address {address}: no Ray cluster answers there ({error}). Check that "
            "the head is running (`ray status --address` on a node) and that this machine can "
            "reach that host and port (GCS port 6379, Ray Client port 10001 for ray://)."
        ) from None


def _probe(ray: Any, address: str, timeout_s: float, memory_mb: int) -> None:
    """Run one trivial task (same resources as a job) and raise a clear ``RayUnavailable`` if
    it does not come back within ``timeout_s`` or cannot run ``corpus_assets``."""
    ref = ray.remote(_ping).options(memory=memory_mb << 20).remote()
    ready, _ = ray.wait([ref], timeout=timeout_s)
    if not ready:
        ray.cancel(ref, force=True)
        raise RayUnavailable(
            f"execution.address {address}: the Ray cluster accepted the connection but ran no "
            f"task within execution.startup_timeout_s={timeout_s:g}s. Probable cause: its "
            "workers cannot start (the workers' Python environment or the job's runtime_env "
            f"{_runtime_env(ray)} is broken; under `uv run`, Ray re-creates the driver's uv "
            "environment on every node unless RAY_ENABLE_UV_RUN_RUNTIME_ENV=0, here "
            f"{os.environ.get('RAY_ENABLE_UV_RUN_RUNTIME_ENV', 'unset')}), or no node offers a "
            f"free CPU and execution.worker_memory_mb={memory_mb} MB of memory. Check "
            "`ray status` (CPUs, memory, pending tasks) and the workers' logs "
            "(/tmp/ray/session_latest/logs/worker-*.err and raylet.out on each node)."
        )
    try:
        ray.get(ref)
    except Exception as error:
        raise RayUnavailable(
            f"execution.address {address}: Ray workers start but cannot run corpus_assets: "
            f"{type(error).__name__}: {str(error)[-800:]}. Install corpus_assets (the same "
            "version) in the workers' Python: the same image or virtualenv on every node."
        ) from None


def _ping() -> int:
    """The probe task: importing this module is what a worker needs for every job."""
    return os.getpid()


def _runtime_env(ray: Any) -> str:
    """The connected job's runtime_env (``py_executable`` shows a ``uv run`` worker command)."""
    try:
        return str(dict(ray.get_runtime_context().runtime_env)) or "{}"
    except Exception:  # pragma: no cover - diagnostics only
        return "(unknown)"


def _gather(ray: Any, refs: list[Any], address: str, timeout_s: float) -> list[Any]:
    """The results of ``refs`` in order, fetched as tasks finish (a failed task raises at once).
    Once none has finished for ``timeout_s``, raise ``RayUnavailable``; either way what is still
    pending is cancelled. Each ``ray.wait`` lasts at most 10 s, so polling stays cheap."""
    results: dict[Any, Any] = {}
    pending, last_progress = list(refs), time.monotonic()
    try:
        while pending:
            left = timeout_s - (time.monotonic() - last_progress)
            if left <= 0:
                raise RayUnavailable(
                    f"execution.address {address}: no chunk task finished within "
                    f"execution.task_timeout_s={timeout_s:g}s ({len(pending)} of {len(refs)} "
                    "still pending, cancelled). A task hangs or the cluster lost its workers: "
                    "check `ray status` and the workers' logs, or raise execution.task_timeout_s."
                )
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=min(left, 10.0))
            if ready:
                results.update(zip(ready, ray.get(ready), strict=True))
                last_progress = time.monotonic()
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
    return [results[ref] for ref in refs]


def task_runner(execution: Execution, workers: int | None = None) -> TaskRunner:
    """The runner ``execution`` selects: ``engine: local`` (default; ``workers`` overrides
    ``execution.workers``) or ``engine: ray``."""
    if execution.engine == "ray":
        assert execution.address is not None  # the config validator requires it
        return RayRunner(
            execution.address,
            execution.task_timeout_s,
            execution.startup_timeout_s,
            execution.worker_memory_mb,
        )
    chosen = execution.workers if workers is None else workers
    return LocalRunner(chosen, execution.in_process_bytes)
