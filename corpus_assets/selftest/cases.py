"""Every fault case, from the modules that register them (one per seed area)."""

import re

from corpus_assets.selftest import cases_release  # noqa: F401  (registers its cases)
from corpus_assets.selftest.case import CASES, FaultCase


def selected(*, full: bool, pattern: re.Pattern[str] | None = None) -> list[FaultCase]:
    """The quick cases (all with ``full``), those matching ``pattern`` if given."""
    return [
        case
        for case in CASES
        if (full or case.quick) and (pattern is None or pattern.search(case.name))
    ]
