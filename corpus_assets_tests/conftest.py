"""Shared fixtures: throwaway data homes and real catalogs (SQLite file, PostgreSQL database)."""

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg2
import pytest

from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.demo import write_demo


def pytest_configure(config: pytest.Config) -> None:
    """A hermetic trust root for the session (each xdist worker its own): the default trust file
    is under ``$XDG_CONFIG_HOME``, which every CLI process a test starts inherits, so no test
    writes the user's real ``~/.config/corpus-assets/trust.json``."""
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="corpus-test-config-")
    os.environ.pop("CORPUS_TRUST_FILE", None)


PG_ADMIN_DSN = os.environ.get(
    "CORPUS_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
)
PG_URL = os.environ.get("CORPUS_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432")


def _admin(sql: str) -> None:
    connection = psycopg2.connect(PG_ADMIN_DSN, connect_timeout=5)
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql)
    finally:
        connection.close()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database on the local server, dropped afterwards."""
    name = f"corpus_test_{uuid.uuid4().hex[:12]}"
    try:
        _admin(f'CREATE DATABASE "{name}"')
    except psycopg2.OperationalError as error:
        pytest.fail(f"PostgreSQL at 127.0.0.1:5432 is required for the catalog tests: {error}")
    yield f"{PG_URL}/{name}"
    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def make_postgres_db() -> Iterator[Callable[[], str]]:
    """Makes fresh, uniquely named databases on the local server (for a test that needs more
    than one, e.g. a Dagster instance and a catalog); each is dropped afterwards."""
    made: list[str] = []

    def make() -> str:
        name = f"corpus_test_{uuid.uuid4().hex[:12]}"
        try:
            _admin(f'CREATE DATABASE "{name}"')
        except psycopg2.OperationalError as error:
            pytest.fail(f"PostgreSQL at 127.0.0.1:5432 is required for this test: {error}")
        made.append(name)
        return name

    yield make
    for name in made:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgres"])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'catalog.sqlite'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def demo_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data home holding the demo sources and corpus.yaml, with the env pointing at it."""
    home = tmp_path / "corpus"
    config = write_demo(home)
    monkeypatch.setenv("CORPUS_HOME", str(home))
    monkeypatch.setenv("CORPUS_CONFIG", str(config))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.delenv("CORPUS_CATALOG_URL", raising=False)
    return home


@pytest.fixture
def workspace(
    demo_home: Path, catalog_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Workspace]:
    """The demo workspace on each catalog backend."""
    monkeypatch.setenv("CORPUS_CATALOG_URL", catalog_url)
    ws = open_workspace()
    yield ws
    ws.close()


def use_demo_copy(
    demo_home: Path, home: Path, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copy the demo sources and config to ``home`` with ``execution.workers`` set, and point
    the environment at the copy (for comparing builds with different worker counts)."""
    shutil.copytree(demo_home / "demo-sources", home / "demo-sources")
    execution = f"execution: {{workers: {workers}, in_process_bytes: 0}}\n"  # the pool, always
    config = (demo_home / "corpus.yaml").read_text() + execution
    (home / "corpus.yaml").write_text(config)
    monkeypatch.setenv("CORPUS_HOME", str(home))
    monkeypatch.setenv("CORPUS_CONFIG", str(home / "corpus.yaml"))
