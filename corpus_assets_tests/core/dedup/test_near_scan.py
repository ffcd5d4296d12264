"""The deletion scan holds the records of its pairs, not the class: a class of millions with a
few candidate pairs costs a few kilobytes, and its verdicts are the scan's stated ones."""

import tracemalloc

import numpy as np

from corpus_assets.core.dedup.near_dedup import LshParams, scan_verified


def test_a_large_class_with_few_pairs_scans_in_memory_of_its_pairs() -> None:
    n = 3_000_000
    x = np.array([500_000, 2_999_999, 2_999_999], dtype=np.int64)
    y = np.array([10, 10, 500_000], dtype=np.int64)
    jaccards = np.array([0.9, 0.5, 0.95])
    tracemalloc.start()
    try:
        result = scan_verified(n, x * n + y, jaccards, [], LshParams(threshold=0.8))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # a union-find, flags or match arrays over the class were 100+ MB here
    assert peak < 64 * 1024, peak
    # 500,000 reaches the kept 10; 2,999,999 misses 10 and reaches only the dropped 500,000:
    # linked (an edge), kept
    assert result.dropped.tolist() == [500_000]
    assert result.dropped_match.tolist() == [10]
    assert result.dropped_jaccard.tolist() == [0.9]
    assert list(result.edges) == [(500_000, 10, 0.9), (2_999_999, 500_000, 0.95)]
    assert (result.verified_pairs, result.fingerprinted, result.skipped_same_group) == (3, 3, 0)
    assert result.verified.tolist() == [0.9, 0.5, 0.95]


def test_the_dense_views_follow_the_dropped_records() -> None:
    x, y = np.array([2, 3, 3]), np.array([0, 0, 2])
    result = scan_verified(5, x * 5 + y, np.array([0.9, 0.95, 0.99]), [], LshParams(threshold=0.8))
    # 2 reaches 0; 3 reaches 0 first (its direct match), then links to the dropped 2: skipped,
    # already in 0's component once its fate is known
    assert result.kept.tolist() == [True, True, False, False, True]
    assert result.match.tolist() == [-1, -1, 0, 0, -1]
    assert result.match_jaccard[[2, 3]].tolist() == [0.9, 0.95]
    assert np.isnan(result.match_jaccard[[0, 1, 4]]).all()
    assert result.skipped_same_group == 1
