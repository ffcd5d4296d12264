"""Every fault case, from the modules that register them (one per fault area)."""

import re

from corpus_assets.selftest import (  # noqa: F401  (each registers its cases)
    attack,
    cases_build,
    cases_download,
    cases_ingest,
    cases_race,
    cases_release,
    cases_sweep,
)
from corpus_assets.selftest.case import CASES, FaultCase


def selected(*, full: bool, pattern: re.Pattern[str] | None = None) -> list[FaultCase]:
    """The quick cases (all with ``full``), those matching ``pattern`` if given."""
    return [
        case
        for case in CASES
        if (full or case.quick) and (pattern is None or pattern.search(case.name))
    ]
