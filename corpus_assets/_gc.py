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


_DEFERRED = False  # defer_collections disabled the collector; resume_deferred re-enables it


def defer_collections() -> None:
    """No garbage collection until ``resume_deferred``: for a command whose start-up (the
    command's imports, Dagster's definitions and instance: ~200k objects, nearly all kept for
    the process's life) is followed by a run that freezes that heap anyway
    (``storage.memory.freeze_startup_heap``). The young collections start-up paid walked it
    again and again (~0.1 CPU-s of a CLI build). A collector already off is left so."""
    global _DEFERRED
    if gc.isenabled():
        gc.disable()
        _DEFERRED = True


def resume_deferred() -> bool:
    """Re-enable the collector ``defer_collections`` disabled; True if it had."""
    global _DEFERRED
    if not _DEFERRED:
        return False
    _DEFERRED = False
    gc.enable()
    return True
