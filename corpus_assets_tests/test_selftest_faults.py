"""``corpus-assets selftest --faults`` cases, run by pytest on SQLite and on PostgreSQL.

Each case is the one the CLI runs (``corpus_assets.selftest``): a real build through the
``build_snapshot`` job in CLI processes, one injected fault, and the seed's expected outcome.
``-m faults`` selects them; the slow cases and full sweeps run with ``-m slow``.
"""

from collections.abc import Iterator

import pytest

from corpus_assets.selftest.case import FaultCase
from corpus_assets.selftest.cases import selected
from corpus_assets.selftest.lab import Lab
from corpus_assets.selftest.report import run_case, table
from corpus_assets_tests.conftest import PG_URL

QUICK = selected(full=False)
SLOW = [case for case in selected(full=True) if not case.quick]


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    catalog = PG_URL if request.param == "postgres" else None
    made = Lab(tmp_path_factory.mktemp(f"faults-{request.param}"), catalog)
    yield made
    made.close()


def _check(lab: Lab, case: FaultCase) -> None:
    result = run_case(lab, case)
    assert result.outcome.ok, "\n" + table([result])


@pytest.mark.faults
@pytest.mark.parametrize("case", QUICK, ids=lambda case: case.name)
def test_fault_case(lab: Lab, case: FaultCase) -> None:
    _check(lab, case)


@pytest.mark.faults
@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW, ids=lambda case: case.name)
def test_slow_fault_case(lab: Lab, case: FaultCase) -> None:
    _check(lab, case)
