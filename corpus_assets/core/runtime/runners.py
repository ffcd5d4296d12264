"""Where chunk tasks run: a local spawn pool (default) or a Ray cluster, behind one interface.

A chunk task's output is keyed and stored by content (``storage.tasks.run_chunk``), and callers
assemble results in job order, so the bytes never depend on the engine or the worker count. Both
runners hand each worker ``setup(config_path, corpus_env, *args)`` once, so it reopens the
workspace from the same config file with the same ``CORPUS_*`` environment. With Ray this means
the data home (CAS + catalog) and the config file must be reachable at the same paths from every
Ray worker: a shared filesystem (here: one machine's local disk), and ``corpus_assets`` installed
in the workers' Python (the same image or virtualenv).
"""

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from corpus_assets.core.runtime.execution import Execution

Setup = Callable[..., None]  # setup(config_path, corpus_env, *args): opens a worker's workspace


@dataclass(frozen=True)
class WorkerSetup:
    """What each worker process runs once before its first job: picklable, module-level."""

    setup: Setup
    config_path: str
    args: tuple[Any, ...] = ()
    environ: dict[str, str] = field(
        default_factory=lambda: {k: v for k, v in os.environ.items() if k.startswith("CORPUS_")}
    )


class TaskRunner(Protocol):
    """Maps a module-level function over jobs on worker processes, results in job order."""

    def wants(self, jobs: int) -> bool:
        """True if ``jobs`` jobs should go to workers (False: the caller runs them in-process)."""
        ...

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any], setup: WorkerSetup) -> list[Any]:
        """``[fn(job) for job in jobs]``, each run in a worker after ``setup``."""
        ...


@dataclass(frozen=True)
class LocalRunner:
    """Today's process pool: ``workers`` spawned processes on this machine (1 = in-process)."""

    workers: int = 1

    def wants(self, jobs: int) -> bool:
        return min(self.workers, jobs) > 1

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any], setup: WorkerSetup) -> list[Any]:
        with ProcessPoolExecutor(
            min(self.workers, len(jobs)),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=setup.setup,
            initargs=(setup.config_path, setup.environ, *setup.args),
        ) as pool:
            return list(pool.map(fn, jobs))


@dataclass(frozen=True)
class RayRunner:
    """One Ray task per job on the cluster at ``address`` (``auto``: the one this machine has
    joined; ``local``: start one in this process). Every job goes to the cluster."""

    address: str

    def wants(self, jobs: int) -> bool:
        return jobs > 0

    def map(self, fn: Callable[[Any], Any], jobs: Sequence[Any], setup: WorkerSetup) -> list[Any]:
        ray = _connected(self.address)
        remote = ray.remote(_ray_job)
        return list(ray.get([remote.remote(fn, job, setup) for job in jobs]))


def _connected(address: str) -> Any:
    """The ``ray`` module, connected once per process (imported lazily: it is an optional
    extra, ``corpus-assets[ray]``)."""
    try:
        import ray
    except ImportError:  # pragma: no cover - depends on the installed extras
        raise RuntimeError(
            "execution.engine is 'ray' but ray is not installed: pip install 'corpus-assets[ray]'"
        ) from None
    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address, log_to_driver=False)
    return ray


_READY: dict[str, WorkerSetup] = {}  # per Ray worker process: the setup each function last ran


def _ray_job(fn: Callable[[Any], Any], job: Any, setup: WorkerSetup) -> Any:
    """Runs in a Ray worker: a reused process runs ``setup`` again only when it changed."""
    name = f"{setup.setup.__module__}.{setup.setup.__qualname__}"
    if _READY.get(name) != setup:
        setup.setup(setup.config_path, setup.environ, *setup.args)
        _READY[name] = setup
    return fn(job)


def task_runner(execution: Execution, workers: int | None = None) -> TaskRunner:
    """The runner ``execution`` selects: ``engine: local`` (default; ``workers`` overrides
    ``execution.workers``) or ``engine: ray``."""
    if execution.engine == "ray":
        assert execution.address is not None  # the config validator requires it
        return RayRunner(execution.address)
    return LocalRunner(execution.workers if workers is None else workers)
