"""The Dagster instance that CLI runs use, apart from the jobs: ``status`` and ``partition``
read it without importing what a build runs (the verifier, the gates)."""

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

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
nux: {enabled: false}
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


def _anchor(value: Any, home: Path) -> Any:
    """``value`` with every relative ``base_dir`` inside it made absolute against ``home``."""
    if not isinstance(value, dict):
        return value
    return {
        key: str(home / item)
        if key == "base_dir" and isinstance(item, str) and not Path(item).is_absolute()
        else _anchor(item, home)
        for key, item in value.items()
    }


def anchored_storage(home: Path) -> dict[str, Any]:
    """The sections of ``home/dagster.yaml`` naming a relative ``base_dir`` (the repository's
    ``.dagster``), made absolute: Dagster reads them against the working folder, and the CLI
    may run anywhere."""
    config = yaml.safe_load((home / "dagster.yaml").read_text()) or {}
    return {
        name: fixed
        for name, section in config.items()
        if (fixed := _anchor(section, home)) != section
    }


def dagster_instance() -> "DagsterInstance":
    """The Dagster instance in ``dagster_home()`` (so CLI runs show in the UI), created on first
    use; dagster is imported only by the commands that run jobs."""
    from dagster import DagsterInstance
    from dagster._core.instance.ref import InstanceRef

    home = dagster_home()
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        (home / "dagster.yaml").write_text(DAGSTER_YAML)
    os.environ["DAGSTER_HOME"] = str(home)
    ref = InstanceRef.from_dir(str(home), overrides=anchored_storage(home))
    return DagsterInstance.from_ref(ref)


def run_config() -> dict[str, Any]:
    """Dagster's console logs only with ``CORPUS_VERBOSE``: the CLI prints its own lines."""
    return {} if os.environ.get("CORPUS_VERBOSE") else QUIET


def existing_instance() -> "DagsterInstance | None":
    """The instance the CLI's runs use, if one was ever made (``dagster_instance``, ``make ui``),
    else None: a command that moves a state writes its observations there without creating a
    Dagster home for someone who never uses Dagster."""
    return dagster_instance() if (dagster_home() / "dagster.yaml").is_file() else None
