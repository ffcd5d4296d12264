"""The ``corpus-assets`` command as a user runs it: a separate process in a folder of its own,
with nothing of the caller's environment that names a data home or a Dagster instance."""

import os
import re
import subprocess
import sys
from pathlib import Path

CLI = str(Path(sys.executable).parent / "corpus-assets")


def run(
    home: Path, *args: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``corpus-assets ARGS`` in ``home``, its data home and Dagster instance inside it."""
    env = cli_env(home) | (extra_env or {})
    return subprocess.run(
        [CLI, *args], cwd=home, env=env, capture_output=True, text=True, timeout=300
    )


def cli_env(home: Path) -> dict[str, str]:
    """The environment ``run`` gives a command: ``home``'s data home and Dagster instance."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    return env | {"CORPUS_HOME": str(home / ".corpus"), "DAGSTER_HOME": str(home / ".dagster")}


def output_field(output: str, name: str) -> str:
    """The value of the ``name VALUE`` line the CLI printed."""
    match = re.search(rf"^{name} (\S+)", output, re.MULTILINE)
    assert match, f"no {name!r} line in:\n{output}"
    return match.group(1)
