"""``BenchmarkIndex``: the matching engine (:mod:`.index`) plus each item's benchmark name.

The name is used only by the report and the per-benchmark counts (it decides no match, so it is
not in the index digest). Use :meth:`BenchmarkIndex.match_many` for a chunk of records:
:meth:`~BenchmarkIndex.match` pays the fixed cost of a few dozen numpy calls per record.
"""

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from corpus_assets.core.records.contamination.index import TokenIndex
from corpus_assets.core.records.contamination.rules import (
    NGRAM,
    UNCHECKED,
    WHOLE,
    Match,
    TokenPolicy,
)

_HOWS = {UNCHECKED: "unchecked", NGRAM: "ngram", WHOLE: "whole"}


class BenchmarkIndex:
    """The matching engine and the items' benchmarks; build with :meth:`build`."""

    def __init__(self, engine: TokenIndex, benchmarks: tuple[str, ...]) -> None:
        self.engine = engine
        self.policy = engine.policy
        self._benchmarks = benchmarks
        self._ids, self._hows = engine.ids, engine.hows
        self._short = engine.hows != NGRAM

    @classmethod
    def build(
        cls,
        items: Iterable[tuple[str, str]],
        policy: TokenPolicy,
        benchmarks: Mapping[str, str] | None = None,
    ) -> "BenchmarkIndex":
        """Index ``(item_id, text)`` pairs under ``policy``; ``benchmarks`` maps item ids to
        their benchmark names (the report's rows; ``""`` when not given)."""
        engine = TokenIndex.build(items, policy)
        names = benchmarks or {}
        return cls(engine, tuple(names.get(i, "") for i in engine.ids))

    def __len__(self) -> int:
        """Registered items, including unchecked ones."""
        return len(self._ids)

    @property
    def digest(self) -> str:
        """The engine's digest: policy, Unicode version, item ids and normalised text digests."""
        return self.engine.digest

    @property
    def unchecked(self) -> tuple[str, ...]:
        """Items this policy cannot match (too short for any check)."""
        return tuple(i for i, h in zip(self._ids, self._hows.tolist(), strict=True) if h == 0)

    @property
    def nbytes(self) -> int:
        """Approximate memory of the screening tables plus the normalised item texts."""
        tables = sum(t.nbytes for t in self.engine.tables.values())
        return tables + sum(len(t) for t in self.engine.texts) + 64 * len(self._ids)

    def mode(self, item_id: str) -> str:
        """``ngram`` / ``whole`` / ``unchecked``: how this item is matched."""
        index = bisect.bisect_left(self._ids, item_id)
        if index == len(self._ids) or self._ids[index] != item_id:
            raise KeyError(item_id)
        return _HOWS[int(self._hows[index])]

    def match(self, text: str) -> Match | None:
        return self.match_many([text])[0]

    def match_many(self, texts: Sequence[str]) -> list[Match | None]:
        """Per text, its match (named with the item's benchmark) or None."""
        found = self.engine.match_many(texts)
        if not any(self._benchmarks):
            return found
        return [
            m if m is None else replace(m, benchmark=self.benchmark_of(m.item_id)) for m in found
        ]

    def benchmark_of(self, item_id: str) -> str:
        return self._benchmarks[bisect.bisect_left(self._ids, item_id)]

    def report(self, flagged: Mapping[str, int]) -> list[dict[str, int | str]]:
        """Per benchmark: items, short items (fewer than n tokens), checked whole, unchecked,
        and records flagged (``flagged``: records per item id)."""
        rows: dict[str, Counter[str]] = {}
        for name, how, short in zip(
            self._benchmarks, self._hows.tolist(), self._short.tolist(), strict=True
        ):
            row = rows.setdefault(name, Counter())
            row["items"] += 1
            row["short_items"] += short
            row["checked_whole"] += how == WHOLE
            row["unchecked"] += how == UNCHECKED
        for item_id, records in flagged.items():
            rows.setdefault(self.benchmark_of(item_id), Counter())["flagged"] += records
        columns = ("items", "short_items", "checked_whole", "unchecked", "flagged")
        return [
            {"benchmark": name, **{c: int(row[c]) for c in columns}}
            for name, row in sorted(rows.items())
        ]


def contamination_report(
    version: str, index: BenchmarkIndex | None, flagged: Mapping[str, Mapping[str, int]]
) -> dict[str, Any]:
    """The layer's report: per benchmark items, short items, checked whole, unchecked and
    records flagged; and records flagged per (benchmark, source) from ``flagged`` (source ->
    item id -> records). What the manifest and the UI show."""
    if index is None:
        return {"policy": version, "benchmarks": [], "flagged": []}
    total: Counter[str] = Counter()
    by_source: Counter[tuple[str, str]] = Counter()
    for source, items in sorted(flagged.items()):
        for item_id, records in items.items():
            total[item_id] += records
            by_source[index.benchmark_of(item_id), source] += records
    rows = [
        {"benchmark": benchmark, "source": source, "records": records}
        for (benchmark, source), records in sorted(by_source.items())
    ]
    return {"policy": version, "benchmarks": index.report(total), "flagged": rows}
