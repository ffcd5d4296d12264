"""Rarer young-generation garbage collections, chosen when the package is first imported.

A process's start-up (the CLI, a Dagster step, a pool worker) allocates a few hundred thousand
long-lived objects - Dagster, pydantic, pyarrow - and Python's default collects the young
generation every 700 allocations, walking the survivors again and again: importing the
definitions took 1.35 CPU-s, 1.13 with a threshold of 10,000 (medians of 7, quiet machine).
Older generations keep their ratios, so a full collection still follows the same number of young
ones, and young garbage cycles are bounded by the threshold. A process that chose its own
threshold keeps it.
"""

import gc

PYTHON_DEFAULT_YOUNG = 700  # gc's generation-0 threshold when nobody changed it
YOUNG = 10_000


def use_rarer_young_collections() -> None:
    young, *older = gc.get_threshold()
    if young == PYTHON_DEFAULT_YOUNG:
        gc.set_threshold(YOUNG, *older)
