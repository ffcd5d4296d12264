"""Benchmark decontamination: records sharing a token n-gram with a benchmark item are excluded.

The front of the family: other packages import from here only. The rules are in
:mod:`.rules` (the reference definition), the engine in :mod:`.index` (screening by hashed
n-gram tables, :mod:`.tables`, over token streams, :mod:`.stream` and :mod:`.tokens`; a long
record in bounded windows, :mod:`.windows`), and :mod:`.benchmark_index` adds each item's
benchmark name and the layer's report.
"""

from corpus_assets.core.records.contamination.benchmark_index import (
    BenchmarkIndex,
    contamination_report,
)
from corpus_assets.core.records.contamination.rules import VERSION, Match, TokenPolicy

__all__ = ["VERSION", "BenchmarkIndex", "Match", "TokenPolicy", "contamination_report"]
