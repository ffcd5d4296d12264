"""Shared fixtures: throwaway data homes and real catalogs (SQLite file, PostgreSQL database)."""

import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import pytest
import yaml
from sqlalchemy import func, select

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.catalog import Catalog, metadata
from corpus_assets.demo import write_demo
from corpus_assets.selftest.lab import Lab


def pytest_configure(config: pytest.Config) -> None:
    """A hermetic trust root for the session (each xdist worker its own): the default trust file
    is under ``$XDG_CONFIG_HOME``, which every CLI process a test starts inherits, so no test
    writes the user's real ``~/.config/corpus-assets/trust.json``."""
    os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="corpus-test-config-")
    os.environ.pop("CORPUS_TRUST_FILE", None)
    _default_stop_signals()


HEAVY_TESTS = Path(__file__).with_name("heavy_tests.txt")


def heavy_test_ids() -> set[str]:
    """The node ids ``heavy_tests.txt`` puts in the slow tier (comments and blanks skipped)."""
    lines = HEAVY_TESTS.read_text().splitlines()
    return {line for line in lines if line.strip() and not line.startswith("#")}


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests listed in ``heavy_tests.txt`` (measured costly) are marked ``heavy``: the fast
    tier (``make test``) leaves them to ``make test-slow``, which CI runs too."""
    heavy = heavy_test_ids()
    for item in items:
        if item.nodeid in heavy:
            item.add_marker(pytest.mark.heavy)


def _default_stop_signals() -> None:
    """SIGINT and SIGTERM as in a foreground process, whatever the suite was started from.

    A shell starts a background job (``make test &``, many CI runners) with SIGINT ignored, and
    a Dagster job run in-process maps SIGTERM to SIGINT's handler, so from then on the worker
    ignored SIGTERM and so did every compute-log ``tail`` a later in-process CLI command
    started: Dagster stops those with SIGTERM and waited on each until its timeout (about a
    minute per activation)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


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


# For a test whose PostgreSQL run repeats a full build (CLI processes, Dagster jobs) its SQLite
# run already covers: the PostgreSQL run is in the slow tier (``make test-slow``).
POSTGRES_IN_SLOW_TIER = pytest.mark.parametrize(
    "catalog_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.heavy)], indirect=True
)


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


TABLES = list(metadata.sorted_tables)


@dataclass(frozen=True)
class BuiltDemo:
    """The demo built once (all seven layers of partition ``p1``) on one catalog backend."""

    backend: str
    home: Path
    config: Path
    catalog_url: str
    snapshot_id: str
    partition: str = "p1"


def all_train_packing(config: Path, packing: dict, name: str) -> Path:
    """``name``.yaml beside ``config``: the demo with its packing policy updated and every record
    in train (so all pack)."""
    document = yaml.safe_load(config.read_text())
    document["policies"]["packing"].update(packing)
    document["policies"]["splits"].update(
        {"train_percent": 100, "validation_percent": 0, "test_percent": 0}
    )
    edited = config.with_name(f"{name}.yaml")
    edited.write_text(yaml.safe_dump(document))
    return edited


# The shared builds: the demo as written, and the demo packed into 64-token blocks with every
# record in train (the packing tests read its blocks).
FLAVOURS: dict[str, Callable[[Path], Path]] = {
    "demo": lambda config: config,
    "packed64": lambda config: all_train_packing(config, {"block_tokens": 64}, "packed64"),
}


def _build_demo(root: Path, backend: str, catalog_url: str, flavour: str) -> BuiltDemo:
    home = root / "corpus"
    config = FLAVOURS[flavour](write_demo(home))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CORPUS_HOME", str(home))
        env.setenv("CORPUS_CONFIG", str(config))
        env.setenv("CORPUS_CATALOG_URL", catalog_url)
        with open_workspace(config) as ws:
            sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
    return BuiltDemo(backend, home, config, catalog_url, sid)


def _fingerprint(built: BuiltDemo) -> tuple[int, ...]:
    """What a read-only test must leave as it found it: the CAS objects, and the rows of every
    catalog table."""
    objects = sum(1 for p in (built.home / "cas").rglob("*") if p.is_file())
    catalog = Catalog(built.catalog_url)
    try:
        with catalog.begin() as conn:
            rows = [conn.execute(select(func.count()).select_from(t)).scalar() for t in TABLES]
    finally:
        catalog.dispose()
    return objects, *rows


@pytest.fixture(scope="session")
def built_demos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, BuiltDemo]]:
    """One build per flavour and backend for the whole session (each xdist worker its own),
    made on first use: most tests that read a built snapshot need not pay a seven-layer build
    each."""
    made: dict[str, BuiltDemo] = {}
    yield made
    for built in made.values():
        if built.backend == "postgres":
            _admin(f'DROP DATABASE IF EXISTS "{built.catalog_url.rsplit("/", 1)[1]}" WITH (FORCE)')


def _shared_build(
    request: pytest.FixtureRequest, flavour: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[BuiltDemo]:
    """The session's build of ``flavour`` on the requested backend, with the environment
    pointing at it; fails the test at teardown if it added a CAS object or a catalog row."""
    backend = request.param
    built_demos: dict[str, BuiltDemo] = request.getfixturevalue("built_demos")
    key = f"{flavour}-{backend}"
    if key not in built_demos:
        root = request.getfixturevalue("tmp_path_factory").mktemp(f"built-{key}")
        url = f"sqlite:///{root / 'catalog.sqlite'}"  # outside the home: its CAS is all there is
        if backend == "postgres":
            name = f"corpus_test_built_{uuid.uuid4().hex[:12]}"
            _admin(f'CREATE DATABASE "{name}"')
            url = f"{PG_URL}/{name}"
        built_demos[key] = _build_demo(root, backend, url, flavour)
    built = built_demos[key]
    monkeypatch.setenv("CORPUS_HOME", str(built.home))
    monkeypatch.setenv("CORPUS_CONFIG", str(built.config))
    monkeypatch.setenv("CORPUS_CATALOG_URL", built.catalog_url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    before = _fingerprint(built)
    yield built
    assert _fingerprint(built) == before, "a test sharing the built demo changed it"


@pytest.fixture(params=["sqlite", "postgres"])
def built_demo(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[BuiltDemo]:
    """The shared demo build on each backend, with the environment pointing at it. Shared by
    every test of the worker, so a test using it must only read: a new CAS object or a catalog
    write fails the test at teardown (a test that changes state builds its own)."""
    yield from _shared_build(request, "demo", tmp_path, monkeypatch)


@pytest.fixture(params=["sqlite", "postgres"])
def built_packed_demo(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[BuiltDemo]:
    """The shared build of the demo with every record in train, packed into 64-token blocks
    (``all_train_packing``); read only, as ``built_demo``."""
    yield from _shared_build(request, "packed64", tmp_path, monkeypatch)


@pytest.fixture
def built_workspace(built_demo: BuiltDemo) -> Iterator[Workspace]:
    """The shared demo build opened (read only: see ``built_demo``)."""
    with open_workspace(built_demo.config) as ws:
        yield ws


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


@pytest.fixture(scope="session")
def selftest_labs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Lab]]:
    """One selftest lab per backend for the whole session (each xdist worker its own), made on
    first use: a lab's Dagster template and reference build are what its cases start from, and
    a lab per module made both again for every module."""
    made: dict[str, Lab] = {}
    yield made
    for each in made.values():
        each.close()


def shared_lab(request: pytest.FixtureRequest, backend: str) -> Lab:
    """The session's selftest lab on ``backend`` (``sqlite`` or ``postgres``)."""
    labs: dict[str, Lab] = request.getfixturevalue("selftest_labs")
    if backend not in labs:
        root = request.getfixturevalue("tmp_path_factory").mktemp(f"lab-{backend}")
        labs[backend] = Lab(root, PG_URL if backend == "postgres" else None)
    return labs[backend]


@pytest.fixture
def selftest_lab(request: pytest.FixtureRequest) -> Lab:
    """The session's SQLite selftest lab: a test takes a fresh home or a copy of the reference
    build (``copy_of_reference``), never changes the reference itself, and shares the lab's
    trust root as the cases of ``corpus-assets selftest`` do."""
    return shared_lab(request, "sqlite")
