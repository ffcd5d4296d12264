"""One opened data home: validated config, content store and catalog, shared by every layer."""

import os
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

from corpus_assets.core.runtime.config import (
    ConfigError,
    CorpusConfig,
    LoadedConfig,
    default_home,
    load_config,
)
from corpus_assets.core.runtime.runners import Setup, WorkerSetup, task_runner
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_lock import cas_lock
from corpus_assets.core.storage.cas_s3 import open_content_store, parse_cas_url
from corpus_assets.core.storage.catalog import Catalog, default_catalog_url
from corpus_assets.core.storage.tasks import ChunkTask
from corpus_assets.core.storage.url_secrets import masked


@dataclass
class Storage:
    """An opened data home without its config: the content store and the catalog. Closing it
    disposes the catalog's engine (its pooled connections and open files) and the store."""

    home: Path
    cas: ContentStore
    catalog: Catalog

    def close(self) -> None:
        self.catalog.dispose()
        self.cas.close()

    def cas_lock(
        self, exclusive: bool = False, on_wait: Callable[[str], None] | None = None
    ) -> AbstractContextManager[None]:
        """This home's CAS lock (``storage.cas_lock``): shared for a writer, exclusive for gc."""
        return cas_lock(self.home, self.cas, self.catalog.url, exclusive, on_wait)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@dataclass
class Workspace(Storage):
    """A data home opened through its validated config."""

    loaded: LoadedConfig

    @property
    def config(self) -> CorpusConfig:
        return self.loaded.config


def open_home(
    home: Path | None = None, catalog_url: str | None = None, cas_url: str | None = None
) -> Storage:
    """Open storage only (CAS + catalog): enough for verify/status/show without a config file.
    ``CORPUS_CAS_URL`` (else ``cas_url``) puts the CAS in an object store, ``<home>/cas`` its
    cache."""
    home = Path(home) if home else default_home()
    if os.environ.get("CORPUS_CAS_URL"):
        cas_url = os.environ["CORPUS_CAS_URL"]
        try:
            parse_cas_url(cas_url)
        except ValueError as error:
            raise ConfigError(f"CORPUS_CAS_URL: {error}") from None
    if home.exists() and not home.is_dir():
        raise ConfigError(f"storage.home {home}: not a folder (it is a file)")
    try:
        cas = open_content_store(home / "cas", cas_url)
        return Storage(home, cas, Catalog(catalog_url or default_catalog_url(home)))
    except OSError as error:
        where = masked(str(error.filename or home))
        raise ConfigError(
            f"storage.home {home}: not a writable folder ({error.strerror}: {where})"
        ) from None


def check_writable_home(home: Path) -> None:
    """Before a build starts anything: the home must take a new file (a read-only mount or a
    folder whose mode or attributes forbid it fail here, in one line, not mid-layer). A home
    not made yet is made, as the build would."""
    try:
        home.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=home, prefix=".writable-"):
            pass
    except OSError as error:
        raise ConfigError(
            f"storage.home {home}: not a writable folder ({error.strerror})"
        ) from None


def open_workspace(config: str | Path | None = None) -> Workspace:
    loaded = load_config(config)
    storage = loaded.config.storage
    home = loaded.data_home()
    url = os.environ.get("CORPUS_CATALOG_URL") or storage.catalog_url
    opened = open_home(home, url, storage.cas_url)
    return Workspace(home=opened.home, cas=opened.cas, catalog=opened.catalog, loaded=loaded)


def worker_setup(ws: Workspace, setup: Setup, *args: Any) -> WorkerSetup:
    """Each worker runs ``setup(config_path, corpus_env, *args)`` once: it reopens this
    workspace from its config file with the same ``CORPUS_*`` environment, whatever the engine."""
    return WorkerSetup(setup, str(ws.loaded.path), args)


_POOLED: dict[str, Any] = {}  # a pool worker's own workspace
Outcome = TypeVar("Outcome")


def _open_in_worker(config: str, environ: dict[str, str]) -> None:
    """A worker serves every layer of a build (``pool``): the workspace it opened for another
    config or environment is closed first."""
    os.environ.update(environ)
    previous = _POOLED.pop("ws", None)
    if previous is not None:
        previous.close()
    _POOLED["ws"] = open_workspace(config)


def _run_in_worker(job: tuple[Callable[..., Outcome], Any, Any]) -> Outcome:
    compute, chunk, spec = job
    return compute(_POOLED["ws"], chunk, spec, None)


def cached_then_pooled(
    ws: Workspace,
    chunks: Sequence[Any],
    spec: Any,
    task_of: Callable[[Any, Any], ChunkTask],
    compute: Callable[[Workspace, Any, Any, Any], Outcome],
    done: Any,
    workers: int | None,
    size_of: Callable[[Any], int] | None = None,
) -> list[Outcome]:
    """Outcomes of one chunk task per chunk, in chunk order: tasks already in ``done`` read here
    (a dict hit and a stat), the missing ones computed here or on the configured runner (a spawn
    pool with ``workers > 1``, or Ray; only when there is work for it - ``size_of`` gives the
    stored bytes a chunk's task reads, see ``TaskRunner.wants``; ``compute`` is a module-level
    function, so a worker imports it). A chunk's bytes never depend on where it ran."""
    outcomes: dict[int, Outcome] = {}
    missing = []
    for n, chunk in enumerate(chunks):
        task = task_of(chunk, spec)
        if (task.chunk_key, task.input_digest) in done:
            outcomes[n] = compute(ws, chunk, spec, done)
        else:
            missing.append(n)
    todo = [chunks[n] for n in missing]
    size = sum(size_of(chunk) for chunk in todo) if size_of is not None else None
    ran = pooled(ws, compute, todo, spec, done, workers, size)
    outcomes.update(zip(missing, ran, strict=True))
    return [outcomes[n] for n in range(len(chunks))]


def pooled(
    ws: Workspace,
    compute: Callable[[Workspace, Any, Any, Any], Outcome],
    jobs: Sequence[Any],
    spec: Any = None,
    done: Any = None,
    workers: int | None = None,
    input_bytes: int | None = None,
) -> list[Outcome]:
    """``[compute(ws, job, spec, done) for job in jobs]`` on the configured runner when there is
    work for more than one worker (a worker gets ``done`` as None), else here; in job order.
    ``input_bytes``: the stored bytes the jobs read, when known (small work stays here)."""
    runner = task_runner(ws.config.execution, workers)
    if runner.wants(len(jobs), input_bytes):
        work = [(compute, job, spec) for job in jobs]
        return runner.map(_run_in_worker, work, worker_setup(ws, _open_in_worker))
    return [compute(ws, job, spec, done) for job in jobs]
