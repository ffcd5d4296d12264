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
