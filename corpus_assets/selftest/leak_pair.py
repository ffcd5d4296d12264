"""Two near-duplicate essays that the near-dedup LSH misses and the split hash separates.

Found deterministically by searching generated variants against the project's own signatures,
band parameters and split hash: the pair's exact Jaccard (on the project's shingles) is at or
just above the threshold, no band of the dedup layer's ``bands x rows`` LSH puts them in one
bucket, and their dedup keys hash to two different splits. The test of the held-out search and
the ``attack.7`` selftest case both plant it in the demo's essays.
"""

import random
from dataclasses import dataclass

import numpy as np

from corpus_assets.core.dedup.jaccard import jaccard_sorted
from corpus_assets.core.dedup.minhash import sketch
from corpus_assets.core.dedup.near_dedup import band_keys
from corpus_assets.core.dedup.signature_cache import signature_spec
from corpus_assets.core.records.normalize import dedup_key
from corpus_assets.core.runtime.config import NearDedupPolicy, SplitPolicy
from corpus_assets.core.training_view.splits import split_of

_WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ru", "so", "ti") for b in "aeiou"]


@dataclass(frozen=True)
class LeakPair:
    texts: tuple[str, str]
    splits: tuple[str, str]
    jaccard: float


def _banded_apart(sigs: np.ndarray, near: NearDedupPolicy) -> bool:
    """No band of the dedup layer's LSH puts the two signatures in one bucket."""
    for band in range(near.bands):
        cols = sigs[:, band * near.rows : (band + 1) * near.rows].T
        keys = band_keys(np.ascontiguousarray(cols), band)
        if keys[0] == keys[1]:
            return False
    return True


def find_leak_pair(splits: SplitPolicy, near: NearDedupPolicy, words: int = 120) -> LeakPair:
    """The first generated pair (seeded, so always the same) that near-dedup misses at
    ``threshold <= J < threshold + 0.05`` and the split hash puts in two splits."""
    rng = random.Random(31)
    spec = signature_spec(near)
    tau = float(near.threshold)
    for _ in range(20000):
        base = [rng.choice(_WORDS) for _ in range(words)]
        variant = list(base)
        for at in rng.sample(range(words), 3):
            variant[at] = "zz" + rng.choice(_WORDS)
        texts = (" ".join(base), " ".join(variant))
        sigs, prints = sketch(list(texts), spec)
        j = jaccard_sorted(prints[0], prints[1])
        if not tau <= j < tau + 0.05 or not _banded_apart(sigs, near):
            continue
        where = (split_of(dedup_key(texts[0]), splits), split_of(dedup_key(texts[1]), splits))
        if where[0] != where[1]:
            return LeakPair(texts, where, j)
    raise AssertionError("no missed near-duplicate pair in 20000 tries")
