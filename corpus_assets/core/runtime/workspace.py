"""One opened data home: validated config, content store and catalog, shared by every layer."""

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corpus_assets.core.runtime.config import CorpusConfig, LoadedConfig, default_home, load_config
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, default_catalog_url


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
