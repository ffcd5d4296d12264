"""One opened data home: validated config, content store and catalog, shared by every layer."""

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from corpus_assets.core.runtime.config import CorpusConfig, LoadedConfig, default_home, load_config
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, default_catalog_url
from corpus_assets.core.storage.tasks import ChunkOutcome

J = TypeVar("J")


@dataclass
class Workspace:
    loaded: LoadedConfig
    home: Path
    cas: ContentStore
    catalog: Catalog

    @property
    def config(self) -> CorpusConfig:
        return self.loaded.config

    def close(self) -> None:
        self.catalog.dispose()

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def open_home(
    home: Path | None = None, catalog_url: str | None = None
) -> tuple[Path, ContentStore, Catalog]:
    """Open storage only (CAS + catalog): enough for verify/status/show without a config file."""
    home = Path(home) if home else default_home()
    return home, ContentStore(home / "cas"), Catalog(catalog_url or default_catalog_url(home))


def open_workspace(config: str | Path | None = None) -> Workspace:
    loaded = load_config(config)
    storage = loaded.config.storage
    home = (loaded.path.parent / storage.home).resolve() if storage.home else default_home()
    url = os.environ.get("CORPUS_CATALOG_URL") or storage.catalog_url
    home, cas, catalog = open_home(home, url)
    return Workspace(loaded=loaded, home=home, cas=cas, catalog=catalog)


def worker_pool(
    ws: Workspace, workers: int, initializer: Callable[..., None], *initargs: Any
) -> ProcessPoolExecutor:
    """A spawn pool whose workers get ``initializer(config_path, corpus_env, *initargs)``: they
    reopen this workspace from its config with the same ``CORPUS_*`` environment."""
    environ = {k: v for k, v in os.environ.items() if k.startswith("CORPUS_")}
    return ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=initializer,
        initargs=(str(ws.loaded.path), environ, *initargs),
    )


def cached_then_pooled(
    ws: Workspace,
    jobs: Sequence[J],
    cached: Callable[[J], bool],
    compute: Callable[[J], ChunkOutcome],
    pool_init: Callable[..., None],
    pool_run: Callable[[J], ChunkOutcome],
    workers: int,
) -> list[ChunkOutcome]:
    """Outcomes of per-chunk jobs in job order: ``cached`` ones read here (a dict hit and a
    stat), the missing ones computed here or, with ``workers > 1``, in a spawn pool (only when
    there is work for it). A job's bytes never depend on where it ran."""
    outcomes: list[ChunkOutcome | None] = [None] * len(jobs)
    missing = []
    for n, job in enumerate(jobs):
        if cached(job):
            outcomes[n] = compute(job)
        else:
            missing.append(n)
    workers = min(workers, len(missing))
    if workers > 1:
        with worker_pool(ws, workers, pool_init) as pool:
            done = pool.map(pool_run, [jobs[n] for n in missing])
            for n, outcome in zip(missing, done, strict=True):
                outcomes[n] = outcome
    else:
        for n in missing:
            outcomes[n] = compute(jobs[n])
    return [o for o in outcomes if o is not None]
