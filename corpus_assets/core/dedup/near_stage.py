"""Near-dedup over the exact representatives of a partition, one run per class.

A class is (record kind x content kind): prose is never compared with code, nor documents with
chats. Each run bands the cached signatures, verifies candidates with the exact Jaccard of
spilled fingerprints (see :mod:`corpus_assets.core.dedup.near_dedup`) and reports what it did.
With ``minhash.v3`` each record's shingle mode (from the signature files) picks its threshold
(:mod:`.near_rule`), and the report counts records and removals per script class.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path

import numpy as np

from corpus_assets.core.dedup.band_index import Banding
from corpus_assets.core.dedup.band_runner import BandRunner
from corpus_assets.core.dedup.class_rows import ClassOrder, RankLookup
from corpus_assets.core.dedup.coding import Classes
from corpus_assets.core.dedup.fingerprint_store import SpilledFingerprints, TextLookup
from corpus_assets.core.dedup.jaccard import jaccard_sorted
from corpus_assets.core.dedup.minhash import spec_payload, stores_modes
from corpus_assets.core.dedup.near_dedup import (
    BAND_KEY,
    LshParams,
    NearResult,
    SignatureBlock,
    near_dedup,
    s_curve,
)
from corpus_assets.core.dedup.near_rule import CHAR, WORD, ScriptThresholds
from corpus_assets.core.dedup.pair_cache import PairLookup
from corpus_assets.core.dedup.report import (
    BandTotals,
    BucketStats,
    ClassReport,
    LshSettings,
    NearReport,
    ScriptRow,
    SCurvePoint,
    size_histogram,
)
from corpus_assets.core.dedup.signature_cache import signature_spec
from corpus_assets.core.runtime.config import NearDedupPolicy


class NearStage:
    """Near-dedup over exact representatives; collects verified edges and direct matches."""

    def __init__(
        self,
        policy: NearDedupPolicy,
        signature_chunks: Sequence[SignatureBlock],
        texts: TextLookup,
        content_of: dict[str, str],
        tmp: Path,
        modes: np.ndarray | None = None,
        pairs: PairLookup | None = None,
        fresh: np.ndarray | None = None,
        band_runner: BandRunner | None = None,
        banding: Banding | None = None,
    ) -> None:
        """``modes``: each record's char-mode flag (bool, by row), for a v3 spec; ``pairs``:
        a parent's verified pairs, looked up before any pair is verified; ``fresh``: with
        them, whether each row is new since the parent (only its pairs are prefetched);
        ``band_runner``: banding and verification on the task runner's workers instead;
        ``banding``: where bands come from and go (the band index: a class its parent's index
        holds is banded here from it, whatever the runner)."""
        self.policy = policy
        self.spec = signature_spec(policy)
        if stores_modes(self.spec) and modes is None:
            raise ValueError(f"{policy.signature} needs each record's shingle mode")
        self.modes = modes
        self.thresholds = ScriptThresholds.for_version(
            policy.signature, policy.threshold, policy.char_threshold
        )
        self.chunks = signature_chunks
        self.texts = texts
        self.content_of = content_of
        self.tmp = tmp
        self.params = LshParams.of(policy)
        self.pairs = pairs
        self.fresh = fresh
        self.band_runner = band_runner
        self.banding = banding
        self._edges: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._matches: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._verified: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.work = {"pairs_verified": 0, "pairs_computed": 0, "records_fingerprinted": 0}

    def edge_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Verified near edges as rows (x later than y in the total order) and Jaccards."""
        return _joined(self._edges)

    def match_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Near duplicates: their rows, the rows of their direct matches and the Jaccards."""
        return _joined(self._matches)

    def verified_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every pair the scans verified (computed or known) as rows, and its Jaccard."""
        return _joined(self._verified)

    def run(self, handed: Classes) -> NearReport:
        """Every class's run over the exact representatives (each class's rows in total
        order, read when its run starts), ``handed`` over and taken from: a class's rows are
        freed once its run is done, not held by the caller through the other classes' runs
        (4 bytes a representative)."""
        classes, buckets, scripts = {}, [], []
        for name in list(handed):
            order = handed.pop(name)
            result = self._run_class(name, order)
            classes[name] = _class_report(result, order.n)
            buckets += [BucketStats(class_name=name, **asdict(b)) for b in result.bands]
            scripts += self._script_rows(name, result, order)
            self._collect(result, order)
        params = self.params
        return NearReport(
            signature=spec_payload(self.spec),
            band_key=BAND_KEY,
            lsh=LshSettings(
                bands=params.bands,
                rows=params.rows,
                bucket_heads=params.bucket_heads,
                threshold=str(self.policy.threshold),
            ),
            s_curve=[
                SCurvePoint(s=f"{p['s']:.2f}", p=f"{p['p']:.6f}")
                for p in s_curve(params.bands, params.rows)
            ],
            classes=classes,
            bucket_stats=buckets,
            near_dedup_by_script=scripts,
        )

    def band_work(self) -> dict[str, int]:
        """What the task runner's band tasks did (nothing when the classes ran here)."""
        return dict(self.band_runner.work) if self.band_runner is not None else {}

    def _run_class(self, name: str, order: ClassOrder) -> NearResult:
        """On the runner (the class's rows read by the tasks), or here over its rows."""
        taus = self._thresholds(order)
        banding = self.banding
        from_parent = banding is not None and banding.incremental(name)
        runner = self.band_runner
        if not from_parent and runner is not None and runner.wants(order.n):
            index = banding.runner_index(name, order.n) if banding is not None else None
            return runner.run_class(order, self.params, taus, index)
        rows = order.rows()
        bands = banding.bands(name, rows) if banding is not None else None
        prints = SpilledFingerprints(self.texts, self.spec, rows, self.tmp)
        known = None if self.pairs is None else partial(self.pairs.known, rows)
        fresh = None if known is None or self.fresh is None else self.fresh[rows]
        try:
            return near_dedup(
                self.chunks,
                rows,
                self.params,
                prints,
                jaccard_sorted,
                prints.prefetch,
                taus,
                known,
                fresh,
                bands,
            )
        finally:
            prints.close()

    def _thresholds(self, order: ClassOrder) -> RankLookup | None:
        """Each rank's threshold by its shingle mode, looked up for the ranks a scan touches;
        None: one threshold for the class (the scan's plain, faster comparison)."""
        t, modes = self.thresholds, self.modes
        if modes is None or t.char == t.word or not any(modes[p].any() for p in order.pieces()):
            return None
        return _Thresholds(t, modes, order)

    def _script_rows(self, name: str, result: NearResult, order: ClassOrder) -> list[ScriptRow]:
        """Records, removals and threshold per script class of one class run."""
        removed = len(result.dropped)
        if self.modes is None:
            split = [("all", order.n, removed, self.thresholds.word)]
        else:
            char = sum(int(self.modes[piece].sum()) for piece in order.pieces())
            char_removed = int(self.modes[order[result.dropped]].sum())
            split = [
                (WORD, order.n - char, removed - char_removed, self.thresholds.word),
                (CHAR, char, char_removed, self.thresholds.char),
            ]
        return [
            ScriptRow(
                class_name=name,
                script=script,
                records=records,
                removed=dropped,
                threshold=str(threshold),
            )
            for script, records, dropped, threshold in split
            if records
        ]

    def _collect(self, result: NearResult, order: ClassOrder) -> None:
        """Map a class run's ranks back to partition rows."""
        x, y, jaccards = result.edges.arrays()
        self._edges.append((order[x], order[y], jaccards))
        self._matches.append(
            (order[result.dropped], order[result.dropped_match], result.dropped_jaccard)
        )
        done = ~np.isnan(result.verified)
        self._verified.append(
            (order[result.pair_x[done]], order[result.pair_y[done]], result.verified[done])
        )
        self.work["pairs_verified"] += result.verified_pairs
        self.work["pairs_computed"] += result.computed_pairs
        self.work["records_fingerprinted"] += result.fingerprinted_now


class _Thresholds:
    """Each rank's threshold, from its row's shingle mode (read for the ranks asked)."""

    def __init__(self, thresholds: ScriptThresholds, modes: np.ndarray, order: ClassOrder):
        self.thresholds, self.modes, self.order = thresholds, modes, order

    def __getitem__(self, ranks: np.ndarray) -> np.ndarray:
        return self.thresholds.by_rank(self.modes[self.order[ranks]])


def _joined(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not parts:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, np.empty(0, dtype=np.float64)
    x, y, j = zip(*parts, strict=True)
    return np.concatenate(x), np.concatenate(y), np.concatenate(j).astype(np.float64)


def _class_report(result: NearResult, participants: int) -> ClassReport:
    clusters = Counter(result.dropped_match.tolist())
    sizes = Counter(1 + n for n in clusters.values())
    return ClassReport(
        participants=participants,
        near_duplicates=len(result.dropped),
        candidate_pairs=result.candidate_pairs,
        verified_pairs=result.verified_pairs,
        verified_edges=len(result.edges),
        skipped_same_group=result.skipped_same_group,
        fingerprinted=result.fingerprinted,
        cluster_sizes=size_histogram(sizes),
        bands=BandTotals(
            buckets=sum(b.buckets for b in result.bands),
            largest_bucket=max((b.largest for b in result.bands), default=0),
            capped_buckets=sum(b.capped_buckets for b in result.bands),
            pairs=sum(b.pairs for b in result.bands),
            pairs_skipped_by_cap=sum(b.pairs_skipped_by_cap for b in result.bands),
        ),
    )
