"""The Dagster instance in ``$DAGSTER_HOME`` that CLI runs use, apart from the jobs: ``status``
and ``partition`` read it without importing what a build runs (the verifier, the gates)."""

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagster import DagsterInstance

# The repository's instance/dagster.yaml, as data (a test keeps the two equal): SQLite storage,
# and run monitoring with the launcher that checks each run's worker (``assets.run_workers``).
DAGSTER_YAML = """\
storage: {sqlite: {base_dir: {env: DAGSTER_HOME}}}
run_launcher: {module: corpus_assets.assets.run_workers, class: WorkerCheckingRunLauncher}
run_monitoring:
  {enabled: true, poll_interval_seconds: 30, start_timeout_seconds: 300, max_resume_run_attempts: 0}
telemetry: {enabled: false}
"""
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def dagster_instance() -> "DagsterInstance":
    """The Dagster instance in ``$DAGSTER_HOME`` (so CLI runs show in the UI), created on first
    use; dagster is imported only by the commands that run jobs."""
    from dagster import DagsterInstance

    home = Path(os.environ.setdefault("DAGSTER_HOME", str(Path(".dagster").resolve())))
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        (home / "dagster.yaml").write_text(DAGSTER_YAML)
    return DagsterInstance.get()


def run_config() -> dict[str, Any]:
    """Dagster's console logs only with ``CORPUS_VERBOSE``: the CLI prints its own lines."""
    return {} if os.environ.get("CORPUS_VERBOSE") else QUIET


def existing_instance() -> "DagsterInstance | None":
    """The instance the CLI's runs use, if one was ever made (``dagster_instance``, ``make ui``),
    else None: a command that moves a state writes its observations there without creating a
    Dagster home for someone who never uses Dagster."""
    home = Path(os.environ.get("DAGSTER_HOME") or Path(".dagster").resolve())
    return dagster_instance() if (home / "dagster.yaml").is_file() else None
