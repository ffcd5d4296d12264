"""The two Dagster instance files load as real instances, and the CLI lifecycle runs on PostgreSQL.

the root ``dagster.yaml`` is the one-machine SQLite default; ``deploy/dagster.yaml`` is the
docker-compose instance (PostgreSQL, credentials from ``DAGSTER_PG_*``). The last test runs
``build``, ``approve`` and ``activate`` as processes with the Dagster instance and the catalog
each in its own database on the local server, as the compose deployment does.
"""

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus

from corpus_assets.core.governance import alias_gate
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.demo import write_demo
from corpus_assets_tests.conftest import PG_URL
from corpus_assets_tests.paths import REPO

DEPLOY_YAML = REPO / "deploy" / "dagster.yaml"
CLI = str(Path(sys.executable).parent / "corpus-assets")


def pg_env(db_name: str) -> dict[str, str]:
    """The ``DAGSTER_PG_*`` variables deploy/dagster.yaml reads, for the local test server."""
    url = urlsplit(PG_URL)
    return {
        "DAGSTER_PG_HOST": url.hostname or "127.0.0.1",
        "DAGSTER_PG_PORT": str(url.port or 5432),
        "DAGSTER_PG_USERNAME": url.username or "postgres",
        "DAGSTER_PG_PASSWORD": url.password or "",  # trust auth on the local server
        "DAGSTER_PG_DB": db_name,
    }


def deploy_home(path: Path) -> Path:
    """A DAGSTER_HOME holding deploy/dagster.yaml unchanged, as the image's Dockerfile copies it."""
    path.mkdir(parents=True)
    shutil.copyfile(DEPLOY_YAML, path / "dagster.yaml")
    return path


@contextmanager
def loaded(home: Path) -> Iterator[DagsterInstance]:
    instance = DagsterInstance.from_config(str(home))
    try:
        yield instance
    finally:
        instance.dispose()


def test_root_dagster_yaml_is_the_sqlite_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repository root's dagster.yaml, loaded as `make ui` does: DAGSTER_HOME is the folder
    Dagster runs in, and all storage is in its .dagster/."""
    home = tmp_path / "checkout"
    home.mkdir()
    shutil.copyfile(REPO / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.chdir(home)
    with loaded(home) as instance:
        storages = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
        assert [type(s).__name__ for s in storages] == [
            "SqliteRunStorage",
            "SharedEngineSqliteEventLogStorage",  # Dagster's, one engine a file (assets.event_log)
            "SqliteScheduleStorage",
        ]
        assert instance.get_runs() == []
        assert instance.telemetry_enabled is False
    assert (home / ".dagster" / "history" / "runs.db").exists()  # in .dagster, nowhere else
    assert sorted(p.name for p in home.iterdir()) == [".dagster", "dagster.yaml"]


def test_deploy_dagster_yaml_is_postgres_from_env(
    tmp_path: Path, make_postgres_db: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials come only from the environment; the three storages, the queue and the
    launcher the compose services rely on all load on a real server."""
    raw = yaml.safe_load(DEPLOY_YAML.read_text())
    connection = raw["storage"]["postgres"]["postgres_db"]
    assert connection["scheme"] == "postgresql+psycopg2"  # SQLAlchemy 2.1 needs the driver
    fields = ("username", "password", "hostname", "db_name", "port")
    assert {name: connection[name] for name in fields} == {
        "username": {"env": "DAGSTER_PG_USERNAME"},
        "password": {"env": "DAGSTER_PG_PASSWORD"},
        "hostname": {"env": "DAGSTER_PG_HOST"},
        "db_name": {"env": "DAGSTER_PG_DB"},
        "port": {"env": "DAGSTER_PG_PORT"},
    }
    db_name = make_postgres_db()
    for name, value in pg_env(db_name).items():
        monkeypatch.setenv(name, value)
    with loaded(deploy_home(tmp_path / "dagster")) as instance:
        storages = (instance.run_storage, instance.event_log_storage, instance.schedule_storage)
        assert [type(s).__name__ for s in storages] == [
            "PostgresRunStorage",
            "PostgresEventLogStorage",
            "PostgresScheduleStorage",
        ]
        assert all(f"/{db_name}" in s.postgres_url for s in storages)
        assert instance.get_runs() == []  # the tables exist on the server
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        assert type(instance.run_launcher).__name__ == "DefaultRunLauncher"
        assert instance.telemetry_enabled is False
        # the root config's launch and build-limit settings hold in the deployment too
        assert type(instance).__name__ == "CorpusInstance"
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
        assert limits == [{"key": "corpus/build", "limit": 1}]
    monkeypatch.delenv("DAGSTER_PG_DB")
    with pytest.raises(Exception, match="DAGSTER_PG_DB"):  # no silent default database
        DagsterInstance.from_config(str(tmp_path / "dagster"))


def _cli(cwd: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [CLI, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"corpus-assets {' '.join(args)}:\n{done.stdout}{done.stderr}"
    return done.stdout


def _line(output: str, first_word: str) -> list[str]:
    return next(line.split() for line in output.splitlines() if line.startswith(first_word))


def test_cli_lifecycle_with_instance_and_catalog_on_postgres(
    tmp_path: Path, make_postgres_db: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """build, approve, activate: runs land in the PostgreSQL instance, the alias in the
    PostgreSQL catalog named by corpus.yaml, and nothing falls back to SQLite."""
    dagster_db, catalog_db = make_postgres_db(), make_postgres_db()
    catalog_url = f"{PG_URL}/{catalog_db}"
    corpus_home = tmp_path / "corpus"
    config = write_demo(corpus_home)
    config.write_text(config.read_text() + f"storage: {{catalog_url: {json.dumps(catalog_url)}}}\n")
    home = deploy_home(tmp_path / "dagster")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    env.update(pg_env(dagster_db), DAGSTER_HOME=str(home), CORPUS_HOME=str(corpus_home))

    built = _cli(tmp_path, env, "build")
    sid = _line(built, "snapshotId")[1]
    assert _line(built, "snapshotId")[3] == "VALIDATED"
    assert sid in _cli(tmp_path, env, "approve", sid, "--by", "deploy-test")
    activated = _cli(tmp_path, env, "activate", sid)
    assert activated.split()[-2:] == ["generation", "1"]

    assert (home / "dagster.yaml").read_bytes() == DEPLOY_YAML.read_bytes()  # CLI kept it
    assert not list(tmp_path.rglob("*.sqlite")) and not list(tmp_path.rglob("*.db"))
    for name, value in pg_env(dagster_db).items():
        monkeypatch.setenv(name, value)
    with loaded(home) as instance:
        runs = instance.get_runs()
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    assert sorted((r.job_name, r.status) for r in runs) == [
        ("activate_snapshot", DagsterRunStatus.SUCCESS),
        ("build_snapshot", DagsterRunStatus.SUCCESS),
    ]
    catalog = Catalog(catalog_url)
    try:
        row = alias_gate.read_alias_gate(catalog, "demo")
    finally:
        catalog.dispose()
    assert (row.active_snapshot, row.generation) == (sid, 1)
