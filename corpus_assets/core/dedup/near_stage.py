"""Near-dedup over the exact representatives of a partition, one run per class.

A class is (record kind x content kind): prose is never compared with code, nor documents with
chats. Each run bands the cached signatures, verifies candidates with the exact Jaccard of
spilled fingerprints (see :mod:`corpus_assets.core.dedup.near_dedup`) and reports what it did.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa

from corpus_assets.core.dedup.fingerprint_store import SpilledFingerprints, TextLookup
from corpus_assets.core.dedup.jaccard import jaccard_sorted
from corpus_assets.core.dedup.near_dedup import (
    BAND_KEY,
    LshParams,
    NearResult,
    SignatureBlock,
    near_dedup,
    s_curve,
)
from corpus_assets.core.dedup.order import codes
from corpus_assets.core.dedup.report import (
    BandTotals,
    BucketStats,
    ClassReport,
    LshSettings,
    NearReport,
    SCurvePoint,
    size_histogram,
)
from corpus_assets.core.dedup.signature_cache import signature_spec
from corpus_assets.core.dedup.signature_spec import spec_payload
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
    ) -> None:
        self.policy = policy
        self.spec = signature_spec(policy)
        self.chunks = signature_chunks
        self.texts = texts
        self.content_of = content_of
        self.tmp = tmp
        self.params = LshParams(
            policy.bands, policy.rows, float(policy.threshold), policy.bucket_heads
        )
        self.edges: list[tuple[int, int, float]] = []
        self.matches: dict[int, tuple[int, float]] = {}

    def run(self, records: pa.Table, eligible: np.ndarray) -> NearReport:
        classes, buckets = {}, []
        for name, order in self._classes(records, eligible).items():
            result = self._run_class(order)
            classes[name] = _class_report(result, len(order))
            buckets += [BucketStats(class_name=name, **asdict(b)) for b in result.bands]
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
        )

    def _classes(self, records: pa.Table, eligible: np.ndarray) -> dict[str, np.ndarray]:
        """Class name -> its eligible rows, still in total order; classes sorted by name."""
        kind_codes, kinds = codes(records.column("kind"))
        source_codes, sources = codes(records.column("source_id"))
        kind_names, source_names = kinds.to_pylist(), sources.to_pylist()
        pair = kind_codes[eligible] * len(source_names) + source_codes[eligible]
        masks: dict[str, np.ndarray] = {}
        for code in np.unique(pair).tolist():
            kind, source = divmod(code, len(source_names))
            name = f"{kind_names[kind]}/{self.content_of[source_names[source]]}"
            masks[name] = masks.get(name, False) | (pair == code)
        return {name: eligible[mask] for name, mask in sorted(masks.items())}

    def _run_class(self, order: np.ndarray) -> NearResult:
        prints = SpilledFingerprints(self.texts, self.spec, order, self.tmp)
        try:
            return near_dedup(
                self.chunks, order, self.params, prints, jaccard_sorted, prints.prefetch
            )
        finally:
            prints.close()

    def _collect(self, result: NearResult, order: np.ndarray) -> None:
        """Map a class run's ranks back to partition rows."""
        for x, y, j in result.edges:
            self.edges.append((int(order[x]), int(order[y]), j))
        for x in np.flatnonzero(~result.kept).tolist():
            self.matches[int(order[x])] = (
                int(order[result.match[x]]),
                float(result.match_jaccard[x]),
            )


def _class_report(result: NearResult, participants: int) -> ClassReport:
    clusters = Counter(result.match[~result.kept].tolist())
    sizes = Counter(1 + n for n in clusters.values())
    return ClassReport(
        participants=participants,
        near_duplicates=int((~result.kept).sum()),
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
