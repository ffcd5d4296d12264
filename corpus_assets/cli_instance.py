"""The Dagster instance that CLI runs use, apart from the jobs: ``status`` and ``partition``
read it without importing what a build runs (the verifier, the gates)."""

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from corpus_assets.cli_common import CliError

if TYPE_CHECKING:
    from dagster import DagsterInstance

# The repository root's dagster.yaml for a DAGSTER_HOME elsewhere (a test keeps the two equal):
# the same settings, with storage in $DAGSTER_HOME instead of ./.dagster.
DAGSTER_YAML = """\
instance_class: {module: corpus_assets.assets.instance, class: CorpusInstance}
storage: {sqlite: {base_dir: {env: DAGSTER_HOME}}}
run_launcher: {module: corpus_assets.assets.run_workers, class: WorkerCheckingRunLauncher}
run_monitoring:
  {enabled: true, poll_interval_seconds: 30, start_timeout_seconds: 300, max_resume_run_attempts: 0}
concurrency: {runs: {tag_concurrency_limits: [{key: corpus/build, limit: 1}]}}
telemetry: {enabled: false}
"""
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def dagster_home() -> Path:
    """``$DAGSTER_HOME``; else the folder the CLI runs in if it holds a ``dagster.yaml`` (the
    repository root: the instance ``make ui`` shows); else ``./.dagster``."""
    if os.environ.get("DAGSTER_HOME"):
        return Path(os.environ["DAGSTER_HOME"]).expanduser().resolve()
    if Path("dagster.yaml").is_file():
        return Path.cwd()
    return Path(".dagster").resolve()


def relative_storage(home: Path) -> list[str]:
    """The storage folders ``home/dagster.yaml`` names relative to the working folder."""
    config = yaml.safe_load((home / "dagster.yaml").read_text()) or {}
    found = []
    for section in config.values():
        for part in (section or {}).values() if isinstance(section, dict) else ():
            holder = part.get("config", part) if isinstance(part, dict) else {}
            base = holder.get("base_dir") if isinstance(holder, dict) else None
            if isinstance(base, str) and not Path(base).is_absolute():
                found.append(base)
    return found


def dagster_instance() -> "DagsterInstance":
    """The Dagster instance in ``dagster_home()`` (so CLI runs show in the UI), created on first
    use; dagster is imported only by the commands that run jobs."""
    from dagster import DagsterInstance

    home = dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        (home / "dagster.yaml").write_text(DAGSTER_YAML)
    elif home != Path.cwd() and (relative := relative_storage(home)):
        raise CliError(
            f"DAGSTER_HOME={home}: its dagster.yaml keeps storage in {relative[0]} relative to "
            f"the folder Dagster runs in; run corpus-assets from {home}"
        )
    os.environ["DAGSTER_HOME"] = str(home)
    return DagsterInstance.get()


def run_config() -> dict[str, Any]:
    """Dagster's console logs only with ``CORPUS_VERBOSE``: the CLI prints its own lines."""
    return {} if os.environ.get("CORPUS_VERBOSE") else QUIET
