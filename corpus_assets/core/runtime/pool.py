"""The local engine's process pool: one per build, whose workers import only what tasks need.

Starting a spawn worker costs its imports. Two things made that cost seconds per worker, paid
by every layer: each ``map`` started a pool of its own, and multiprocessing's spawn runs the
parent's ``__main__`` again in every worker (so that functions defined there unpickle) - the
CLI, pytest or Dagster's code server, with everything they import. Here:

- ``shared_pool()`` opens a session (a build: the Dagster run's ``CorpusResource`` holds one
  from its first step to its last); every local map inside it runs on one pool per worker count,
  started at the first map and shut down when the session ends, on success or error.
  Outside a session a map starts and stops its own pool, as before.
- workers start with an empty ``__main__``: every task function is a module-level function of
  ``corpus_assets.core``, which the worker imports by name when it unpickles the first job.
- a worker runs a job's ``WorkerSetup`` before it, only when it differs from the last one it
  ran (one process serves every layer, each with its own setup), as Ray workers do.
- workers never import pandas (``absent_imports``: pyarrow would at a worker's first array,
  ~0.25 CPU-s a worker, two or more workers a build; no task takes or returns one).
"""

import multiprocessing.context
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from corpus_assets.core.runtime.absent_imports import go_without
from corpus_assets.core.runtime.code_identity import (
    ParsedImports,
    parsed_imports,
    seed_parsed_imports,
)

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


_READY: dict[str, Any] = {}  # per worker process: the setup each setup function last ran


def run_job(fn: Callable[[Any], Any], job: Any, setup: WorkerSetup) -> Any:
    """Runs in a worker (local or Ray): ``setup`` first when it changed, then ``fn(job)``. The
    ``CORPUS_*`` variables become exactly the parent's at the time of the map."""
    name = f"{setup.setup.__module__}.{setup.setup.__qualname__}"
    if _READY.get(name) != setup:
        for key in [k for k in os.environ if k.startswith("CORPUS_")]:
            if key not in setup.environ:
                del os.environ[key]
        setup.setup(setup.config_path, setup.environ, *setup.args)
        _READY[name] = setup
    return fn(job)


_NO_MAIN = types.ModuleType("__main__")  # no __spec__ nor __file__: spawn imports nothing for it
_MAIN_SWAP = threading.Lock()


class _CoreProcess(multiprocessing.context.SpawnProcess):
    """A spawn worker that does not run the parent's ``__main__`` again: while it starts (the
    preparation data is taken and sent in ``start``), ``__main__`` reads as an empty module."""

    def start(self) -> None:
        with _MAIN_SWAP:
            main = sys.modules["__main__"]
            sys.modules["__main__"] = _NO_MAIN
            try:
                super().start()
            finally:
                sys.modules["__main__"] = main


class _CoreSpawn(multiprocessing.context.SpawnContext):
    Process = _CoreProcess


def _start_worker(parsed: ParsedImports) -> None:
    """A worker's start: the driver's parses taken, pandas absent (see the module doc)."""
    go_without("pandas")
    seed_parsed_imports(parsed)


def _new_pool(workers: int) -> ProcessPoolExecutor:
    """Workers start on demand (spawn), at most ``workers``, with this process's parses of the
    package's imports (code identities: no worker parses a file the driver has) and no pandas;
    they keep SIGINT blocked if the parent does (``cli.interrupt``): a Ctrl-C kills them with
    the parent."""
    return ProcessPoolExecutor(
        workers,
        mp_context=_CoreSpawn(),
        initializer=_start_worker,
        initargs=(parsed_imports(),),
    )


class _Sessions:
    """The process's open sessions (a count: nested or concurrent ones share) and their pools."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = 0
        self.pools: dict[int, ProcessPoolExecutor] = {}

    def enter(self) -> None:
        with self.lock:
            self.open += 1

    def leave(self) -> None:
        with self.lock:
            self.open -= 1
            closing = list(self.pools.values()) if self.open == 0 else []
            if self.open == 0:
                self.pools.clear()
        for pool in closing:
            pool.shutdown(wait=True, cancel_futures=True)

    def pool(self, workers: int) -> ProcessPoolExecutor | None:
        """The session's pool of ``workers`` (started now if new); None outside a session."""
        with self.lock:
            if self.open == 0:
                return None
            if workers not in self.pools:
                self.pools[workers] = _new_pool(workers)
            return self.pools[workers]

    def discard(self, workers: int, pool: ProcessPoolExecutor) -> None:
        """A broken pool (a worker was killed) is replaced at the next map, not reused."""
        with self.lock:
            if self.pools.get(workers) is pool:
                del self.pools[workers]
        pool.shutdown(wait=False, cancel_futures=True)


_SESSIONS = _Sessions()


@contextmanager
def shared_pool() -> Iterator[None]:
    """Every local map until the end of this block shares one pool (per worker count)."""
    open_session()
    try:
        yield
    finally:
        close_session()


def open_session() -> None:
    """``shared_pool`` in two calls, for an owner with setup/teardown hooks (a resource)."""
    _SESSIONS.enter()


def pool_running(workers: int) -> bool:
    """Whether the open session's pool of ``workers`` has started (its start-up is paid)."""
    with _SESSIONS.lock:
        return workers in _SESSIONS.pools


def close_session() -> None:
    """The end of a session: the last one to close shuts its pools down (workers joined)."""
    _SESSIONS.leave()


def pool_map(
    fn: Callable[[Any], Any], jobs: Sequence[Any], setup: WorkerSetup, workers: int
) -> list[Any]:
    """``[fn(job) for job in jobs]`` on at most ``workers`` spawn workers, in job order: on the
    session's pool when one is open, else on a pool of its own for this map."""
    fns, setups = [fn] * len(jobs), [setup] * len(jobs)
    pool = _SESSIONS.pool(workers)
    if pool is None:
        with _new_pool(min(workers, len(jobs))) as own:
            return list(own.map(run_job, fns, jobs, setups))
    try:
        return list(pool.map(run_job, fns, jobs, setups))
    except BrokenProcessPool:
        _SESSIONS.discard(workers, pool)
        raise
