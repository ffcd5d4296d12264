"""Processes opening one fresh catalog (PostgreSQL or SQLite) at once (two builds started
together on a new data home) all get the schema: none fails creating a table the other is
creating."""

import subprocess
import sys
from pathlib import Path

import pytest

OPEN = "import sys; from corpus_assets.core.storage.catalog import Catalog; Catalog(sys.argv[1])"


@pytest.mark.postgres
def test_concurrent_first_opens_of_a_postgres_catalog_all_succeed(postgres_url: str) -> None:
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN, postgres_url], stderr=subprocess.PIPE, text=True
        )
        for _ in range(6)
    ]
    errors = [run.communicate(timeout=120)[1] for run in runs]
    assert [run.returncode for run in runs] == [0] * 6, [e[-400:] for e in errors if e]


def test_concurrent_first_opens_of_a_sqlite_catalog_all_succeed(tmp_path: Path) -> None:
    """The same on SQLite, whose DDL is not transactional here (found by selftest
    004.duplicate-trigger: 'table freezes already exists')."""
    for trial in range(3):
        url = f"sqlite:///{tmp_path / f'catalog-{trial}.sqlite'}"
        runs = [
            subprocess.Popen([sys.executable, "-c", OPEN, url], stderr=subprocess.PIPE, text=True)
            for _ in range(6)
        ]
        errors = [run.communicate(timeout=120)[1] for run in runs]
        assert [run.returncode for run in runs] == [0] * 6, [e[-400:] for e in errors if e]


def test_a_catalog_reopened_skips_the_schema_check_until_its_schema_or_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build reopens its catalog ~15 times: a file this process brought up to date is not
    checked again (~60 PRAGMA queries each time) while SQLite's schema version is unchanged;
    a DDL statement since, or another file at the path, is checked (and fixed) again."""
    import sqlite3

    from corpus_assets.core.storage import catalog as catalog_module

    checks: list[str] = []
    real = catalog_module._add_missing_columns  # the check a reopen skips
    monkeypatch.setattr(
        catalog_module, "_add_missing_columns", lambda conn: (checks.append("x"), real(conn))
    )
    path = tmp_path / "catalog.sqlite"
    url = f"sqlite:///{path}"
    for _ in range(3):
        catalog_module.Catalog(url).dispose()
    assert len(checks) == 1
    with sqlite3.connect(path) as conn:  # another process's DDL: an older build's table
        conn.execute("DROP TABLE freezes")
    catalog_module.Catalog(url).dispose()
    assert len(checks) == 2
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM freezes").fetchone() == (0,)
    path.unlink()
    catalog_module.Catalog(url).dispose()  # a new file: its tables are created
    assert len(checks) == 3
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM freezes").fetchone() == (0,)
