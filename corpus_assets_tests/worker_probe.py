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


def arrow_without_pandas(_job: Any) -> tuple[bool, int, bool]:
    """Build Arrow arrays and a table as tasks do: whether pandas was imported for it, the
    table's rows, and whether importing pandas is refused here."""
    import numpy as np
    import pyarrow as pa

    table = pa.table({"a": pa.array([1, 2]), "b": np.arange(2)})
    try:
        import pandas  # noqa: F401
    except ModuleNotFoundError:
        refused = True
    else:
        refused = False
    return "pandas" in sys.modules, table.num_rows, refused


def worker_pid(_job: Any) -> int:
    return os.getpid()


def identity_parses(module: str) -> tuple[str, int]:
    """``module``'s code identity in this worker, and how many source files it parsed for it."""
    from corpus_assets.core.runtime import code_identity

    parse, parsed = code_identity._parse_imports, []

    def counting(*args: Any) -> Any:
        parsed.append(args[0])
        return parse(*args)

    code_identity._parse_imports = counting
    try:
        return code_identity.code_identity(module), len(parsed)
    finally:
        code_identity._parse_imports = parse
