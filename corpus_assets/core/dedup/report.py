"""The dedup report: what near-dedup did, per class and band, as one typed document.

It is an output of the dedup_clusters layer (hashed, so every number is an int or a decimal
string) and the Dagster metadata users read: the S-curve of the banding, bucket statistics
(including the pairs the ``bucket_heads`` cap skipped), cluster sizes and verdicts per source.
"""

from collections import Counter
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class LshSettings(_Document):
    bands: int
    rows: int
    bucket_heads: int
    threshold: str  # decimal text: a hashed payload holds no floats


class SCurvePoint(_Document):
    s: str
    p: str


class BandTotals(_Document):
    buckets: int
    largest_bucket: int
    capped_buckets: int
    pairs: int
    pairs_skipped_by_cap: int


class ClassReport(_Document):
    """One near-dedup class (record kind x content kind): prose is never compared with code."""

    participants: int
    near_duplicates: int
    candidate_pairs: int
    verified_pairs: int
    verified_edges: int
    skipped_same_group: int
    fingerprinted: int
    cluster_sizes: dict[str, int]
    bands: BandTotals


class BucketStats(_Document):
    """One band of one class: the buckets LSH formed there."""

    class_name: str = Field(alias="class")
    band: int
    buckets: int
    records: int
    largest: int
    capped_buckets: int
    pairs: int
    pairs_skipped_by_cap: int


class ScriptRow(_Document):
    """One script class (shingle mode) of one near-dedup class: its records, how many were
    removed and the threshold they needed. ``script`` is ``word`` or ``char`` (minhash.v3),
    ``all`` for versions whose signatures carry no modes (one threshold for both)."""

    class_name: str = Field(alias="class")
    script: str
    records: int
    removed: int
    threshold: str  # decimal text


class NearReport(_Document):
    signature: dict[str, Any]  # the signature spec payload, as hashed into the cache keys
    band_key: str
    lsh: LshSettings
    s_curve: list[SCurvePoint]
    classes: dict[str, ClassReport]
    bucket_stats: list[BucketStats]
    near_dedup_by_script: list[ScriptRow] = []


class DedupReport(_Document):
    """The layer's report; ``near`` is absent when near-dedup is switched off."""

    near: NearReport | None = None
    per_source: dict[str, dict[str, int]]

    def document(self) -> dict[str, Any]:
        """The stored form: the near-dedup fields flat beside ``per_source``."""
        near = self.near.model_dump(by_alias=True) if self.near is not None else {}
        return {**near, "per_source": self.per_source}

    @classmethod
    def parse(cls, document: dict[str, Any]) -> "DedupReport":
        near = {k: v for k, v in document.items() if k != "per_source"}
        return cls(
            near=NearReport.model_validate(near) if near else None,
            per_source=document["per_source"],
        )


def size_histogram(sizes: Counter[int]) -> dict[str, int]:
    """Cluster-size histogram with power-of-two bins: 2, 3-4, 5-8, ..."""
    bins: Counter[str] = Counter()
    for size, count in sizes.items():
        low = 2
        while low * 2 < size:
            low *= 2
        label = "2" if size == 2 else f"{low + 1}-{low * 2}"
        bins[label] += count
    return dict(sorted(bins.items(), key=lambda kv: int(kv[0].split("-")[0])))
