"""Run fault cases and print the table: fault, expected, observed, data lost, digests equal."""

import re
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass

from corpus_assets.selftest.case import FaultCase, Outcome
from corpus_assets.selftest.lab import Lab


@dataclass(frozen=True)
class Result:
    case: FaultCase
    outcome: Outcome
    seconds: float


def run_case(lab: Lab, case: FaultCase) -> Result:
    """One case; an exception in it is a failed row naming the error, never a crash."""
    started = time.perf_counter()
    try:
        outcome = case.run(lab)
    except Exception as error:  # the row reports it; the other cases still run
        where = traceback.extract_tb(error.__traceback__)[-1]
        outcome = Outcome(
            observed=f"error: {type(error).__name__}: {error} ({where.name}:{where.lineno})",
            matched=False,
            lost="unknown",
        )
    return Result(case, outcome, time.perf_counter() - started)


def run_cases(lab: Lab, cases: Iterable[FaultCase], echo: bool = True) -> list[Result]:
    results = []
    for case in cases:
        result = run_case(lab, case)
        results.append(result)
        if echo:
            mark = "ok" if result.outcome.ok else "MISMATCH"
            print(f"[{mark}] {case.name} ({result.seconds:.1f} s)", flush=True)
    return results


_DIGEST = re.compile(r"(sha256:[0-9a-f]{12})[0-9a-f]{52}")


def _cell(text: str) -> str:
    """A table cell: digests shortened to 12 hex digits, no pipes or newlines."""
    return _DIGEST.sub(r"\1…", text).replace("|", "\\|").replace("\n", " ")


def table(results: list[Result]) -> str:
    """A Markdown table, one row per case."""
    head = "| fault | seed | expected | observed | data lost | digests equal | result | s |"
    rows = [head, "|---|---|---|---|---|---|---|---:|"]
    for r in results:
        equal = {True: "yes", False: "no", None: "n/a"}[r.outcome.digests_equal]
        rows.append(
            f"| {_cell(r.case.fault)} | {r.case.seed} | {_cell(r.case.expected)} | "
            f"{_cell(r.outcome.observed)} | {_cell(r.outcome.lost)} | {equal} | "
            f"{'ok' if r.outcome.ok else 'MISMATCH'} | {r.seconds:.1f} |"
        )
    return "\n".join(rows)
