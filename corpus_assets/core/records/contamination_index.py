"""``BenchmarkIndex`` (either policy version) and the v1 engine, ``ContainmentIndex``.

``BenchmarkIndex`` is what the layer holds: the engine of the policy's version (v1 here, v2 in
:mod:`.contamination_v2_index`) plus each item's benchmark name, which only the report and the
per-benchmark counts use (it decides no match, so it is not in the index digest).

The v1 engine: screening records against indexed benchmark items, then confirming.

Split from the indexing (:mod:`.contamination_tables`) because this is the per-record hot path
and its correctness argument is separate: records are hashed (:mod:`.contamination_stream`) in
a mode only when some item uses it, and each window's hash is probed in the item tables. Per
(record, item) the number of item n-gram hashes seen is an upper bound of ``|A & B|`` (plus the
item's own intra-item collision count, almost always 0); only items whose bound reaches the
threshold are confirmed with the real n-gram strings, so hash collisions cost time, never a
false match or a missed one.

Use :meth:`ContainmentIndex.match_many` for a chunk of records: :meth:`~ContainmentIndex.match`
pays the fixed cost of a few dozen numpy calls per record.
"""

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from corpus_assets.core.records.contamination import (
    PPM,
    ContaminationPolicy,
    Match,
    ngram_size,
    ngrams,
)
from corpus_assets.core.records.contamination_stream import (
    Stream,
    batches,
    normalise_stream,
)
from corpus_assets.core.records.contamination_tables import NgramTable, index_items
from corpus_assets.core.records.contamination_v2 import NGRAM, UNCHECKED, WHOLE, TokenPolicy
from corpus_assets.core.records.contamination_v2_index import TokenIndex

_SINGLE_CHARS = 1 << 12  # a lone record shorter than this skips the batch normalisation


class ContainmentIndex:
    """The ``contamination.v1`` engine: items indexed for containment matching."""

    def __init__(
        self,
        policy: ContaminationPolicy,
        ids: tuple[str, ...],
        texts: tuple[str, ...],
        modes: np.ndarray,
        sizes: np.ndarray,
        deficits: np.ndarray,
        tables: dict[str, NgramTable],
        digest: str,
        unchecked: tuple[str, ...],
    ) -> None:
        self.policy = policy
        self._ids = ids
        self._texts = texts
        self._modes = modes
        self._sizes = sizes
        self._deficits = deficits
        self._tables = tables
        self._digest = digest
        self._unchecked = unchecked

    @classmethod
    def build(
        cls, items: Iterable[tuple[str, str]], policy: ContaminationPolicy
    ) -> "ContainmentIndex":
        """Index ``(item_id, text)`` pairs; the result does not depend on their order."""
        built = index_items(items, policy)
        return cls(
            policy,
            built.ids,
            built.texts,
            built.modes,
            built.sizes,
            built.deficits,
            built.tables,
            built.digest,
            built.unchecked,
        )

    def __len__(self) -> int:
        """Registered items, including :attr:`unchecked` ones."""
        return len(self._ids)

    @property
    def digest(self) -> str:
        """sha256 over policy, Unicode version and (id, normalised text digest) of every item.

        Texts enter only as digests, so the digest can go into task keys and logs without
        copying benchmark content (the reference set's access boundary is kept).
        """
        return self._digest

    @property
    def unchecked(self) -> tuple[str, ...]:
        """Items too short for any n-gram of this policy: this method cannot match them."""
        return self._unchecked

    @property
    def nbytes(self) -> int:
        """Approximate memory of the screening structures plus the normalised item texts."""
        tables = sum(t.nbytes for t in self._tables.values())
        return tables + sum(len(t) for t in self._texts) + 64 * len(self._ids)

    def mode(self, item_id: str) -> str:
        """``"word"``, ``"char"`` or ``"unchecked"``: how this item is matched."""
        index = bisect.bisect_left(self._ids, item_id)
        if index == len(self._ids) or self._ids[index] != item_id:
            raise KeyError(item_id)
        return ("unchecked", "word", "char")[int(self._modes[index])]

    def match(self, text: str) -> Match | None:
        """The best match at or above the threshold (ties: smallest item id), confirmed exactly."""
        return self.match_many([text])[0]

    def match_many(self, texts: Sequence[str]) -> list[Match | None]:
        """:meth:`match` for each text, batched so short records do not pay numpy call overhead."""
        results: list[Match | None] = []
        for lo, hi in batches(texts):
            results.extend(self._match_batch(texts[lo:hi]))
        return results

    def _match_batch(self, texts: Sequence[str]) -> list[Match | None]:
        """Screen one batch per mode (bitmap, keys, bound), then confirm the few candidates."""
        results: list[Match | None] = [None] * len(texts)
        if not self._ids:
            return results
        if len(texts) == 1 and len(texts[0]) < _SINGLE_CHARS:
            stream = Stream.single(texts[0])
        else:
            stream = normalise_stream(texts)
        policy = self.policy
        best: dict[int, tuple[int, int]] = {}  # record -> (-ppm, item index)
        for mode, table in self._tables.items():
            if not table.keys.size:
                continue
            h, spans = stream.windows(mode, ngram_size(mode, policy))
            windows, keys = table.probe(h)
            if not windows.size:
                continue
            start, end = spans(windows)
            ok, rec = stream.valid(start, end)
            if not ok.any():
                continue
            start, end, rec, keys = start[ok], end[ok], rec[ok], keys[ok]
            for r, item in self._candidates(table, rec, keys):
                ppm = self._confirm(stream, r, item, mode, start[rec == r], end[rec == r])
                if ppm >= policy.threshold_ppm:
                    key = (-ppm, item)
                    if r not in best or key < best[r]:
                        best[r] = key
        for r, (neg_ppm, item) in best.items():
            results[r] = Match(self._ids[item], -neg_ppm)
        return results

    def _candidates(
        self, table: NgramTable, rec: np.ndarray, keys: np.ndarray
    ) -> list[tuple[int, int]]:
        """(record, item) pairs whose hash-hit upper bound reaches the threshold."""
        nkeys = np.int64(table.keys.size)
        pairs = np.unique(rec.astype(np.int64) * nkeys + keys)
        rec_u, key_u = pairs // nkeys, pairs % nkeys
        lo, hi = table.ptr[key_u], table.ptr[key_u + 1]
        lengths = hi - lo
        total = int(lengths.sum())
        offsets = np.repeat(lo - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
        items = table.post[offsets + np.arange(total)].astype(np.int64)
        nitems = np.int64(len(self._ids))
        combined, counts = np.unique(np.repeat(rec_u, lengths) * nitems + items, return_counts=True)
        rec_c, item_c = combined // nitems, combined % nitems
        bound = counts + self._deficits[item_c]
        enough = bound * PPM >= self.policy.threshold_ppm * self._sizes[item_c]
        return [(int(r), int(i)) for r, i in zip(rec_c[enough], item_c[enough], strict=True)]

    def _confirm(
        self, stream: Stream, r: int, item: int, mode: str, start: np.ndarray, end: np.ndarray
    ) -> int:
        """Exact containment in ppm from the real n-gram strings.

        Only the record's windows whose hash hit the index are materialised: every record n-gram
        equal to an item n-gram has the item n-gram's hash, so none is missed.
        """
        text = stream.text(r)
        base = int(stream.off[r]) + 1
        spans = zip(start.tolist(), end.tolist(), strict=True)
        seen = {text[a - base : b - base] for a, b in spans}
        exact = ngrams(self._texts[item], mode, self.policy)
        return len(exact & seen) * PPM // len(exact)


Policy = ContaminationPolicy | TokenPolicy
_HOWS = {UNCHECKED: "unchecked", NGRAM: "ngram", WHOLE: "whole"}


class BenchmarkIndex:
    """The policy version's engine and the items' benchmarks; build with :meth:`build`."""

    def __init__(self, engine: ContainmentIndex | TokenIndex, benchmarks: tuple[str, ...]) -> None:
        self.engine = engine
        self.policy: Policy = engine.policy
        self._benchmarks = benchmarks
        if isinstance(engine, TokenIndex):
            self._ids, self._hows = engine.ids, engine.hows
            self._short = engine.hows != NGRAM
        else:
            self._ids = engine._ids
            self._hows = np.where(engine._modes > 0, NGRAM, UNCHECKED)
            words = engine.policy.ngram_words
            self._short = np.array([t.count(" ") + 1 < words for t in engine._texts], dtype=bool)

    @classmethod
    def build(
        cls,
        items: Iterable[tuple[str, str]],
        policy: Policy,
        benchmarks: Mapping[str, str] | None = None,
    ) -> "BenchmarkIndex":
        """Index ``(item_id, text)`` pairs under ``policy``; ``benchmarks`` maps item ids to
        their benchmark names (the report's rows; ``""`` when not given)."""
        if isinstance(policy, TokenPolicy):
            engine: ContainmentIndex | TokenIndex = TokenIndex.build(items, policy)
            ids = engine.ids
        else:
            engine = ContainmentIndex.build(items, policy)
            ids = engine._ids
        names = benchmarks or {}
        return cls(engine, tuple(names.get(i, "") for i in ids))

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
        if isinstance(self.engine, ContainmentIndex):
            return self.engine.nbytes
        tables = sum(t.nbytes for t in self.engine.tables.values())
        return tables + sum(len(t) for t in self.engine.texts) + 64 * len(self._ids)

    def mode(self, item_id: str) -> str:
        """v1: ``word`` / ``char`` / ``unchecked``; v2: ``ngram`` / ``whole`` / ``unchecked``."""
        if isinstance(self.engine, ContainmentIndex):
            return self.engine.mode(item_id)
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
