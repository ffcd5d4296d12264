"""``corpus-assets selftest --faults`` cases, run by pytest on SQLite and on PostgreSQL.

Each case is the one the CLI runs (``corpus_assets.selftest``): a real build through the
``build_snapshot`` job in CLI processes, one injected fault, and the seed's expected outcome.
Every case runs on SQLite; those whose outcome goes through the catalog's transactions
(``FaultCase.catalog``) run on PostgreSQL too. ``-m faults`` selects them; the slow cases
(the full kill sweep, 200 race trials) run with ``-m slow``.
"""

import pytest

from corpus_assets.selftest.case import FaultCase
from corpus_assets.selftest.cases import selected
from corpus_assets.selftest.lab import Lab
from corpus_assets.selftest.report import run_case, table
from corpus_assets_tests.conftest import shared_lab


def _pairs(cases: list[FaultCase]) -> list[object]:
    """(backend, case) for every case on SQLite and every catalog case on PostgreSQL."""
    pairs: list[object] = [pytest.param("sqlite", c, id=f"sqlite-{c.name}") for c in cases]
    pairs += [
        pytest.param("postgres", c, id=f"postgres-{c.name}", marks=pytest.mark.postgres)
        for c in cases
        if c.catalog
    ]
    return pairs


QUICK = _pairs(selected(full=False))
SLOW = _pairs([case for case in selected(full=True) if not case.quick])


@pytest.fixture
def lab(request: pytest.FixtureRequest) -> Lab:
    """The session's lab on the case's backend (``selftest_labs``): a lab's Dagster template,
    reference build and traced build are what most cases start from."""
    return shared_lab(request, request.param)


def _check(lab: Lab, case: FaultCase) -> None:
    result = run_case(lab, case)
    assert result.outcome.ok, "\n" + table([result])


@pytest.mark.faults
@pytest.mark.parametrize(("lab", "case"), QUICK, indirect=["lab"])
def test_fault_case(lab: Lab, case: FaultCase) -> None:
    _check(lab, case)


@pytest.mark.faults
@pytest.mark.slow
@pytest.mark.parametrize(("lab", "case"), SLOW, indirect=["lab"])
def test_slow_fault_case(lab: Lab, case: FaultCase) -> None:
    _check(lab, case)
