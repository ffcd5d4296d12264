"""Task functions for the pool tests: module-level, so a spawned worker imports them by name,
and light (this module imports nothing of the project), so what a worker holds is its pool's."""

import os
import sys
from typing import Any

# What a chunk worker must never load: the CLI, Dagster, the Dagster wrappers.
FORBIDDEN = ("dagster", "corpus_assets.cli", "corpus_assets.assets", "corpus_assets.definitions")


def no_setup(_config_path: str, _environ: dict[str, str], *_args: Any) -> None:
    """A worker setup that opens nothing."""


def forbidden_loaded(_job: Any) -> list[str]:
    """The modules in this worker that no chunk worker should have imported."""
    return sorted(name for name in sys.modules if name.startswith(FORBIDDEN))


def worker_pid(_job: Any) -> int:
    return os.getpid()
