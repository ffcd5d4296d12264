"""Each row's match Jaccard, held sparse: 1.0 for exact copies, the near ones', NaN otherwise."""

import numpy as np

from corpus_assets.core.dedup.clusters import VERDICTS, Jaccards


def test_jaccards_read_by_rows_as_the_dense_array() -> None:
    code = {name: k for k, name in enumerate(VERDICTS)}
    names = ["keep", "exact_duplicate", "near_duplicate", "excluded", "near_duplicate", "keep"]
    verdict = np.array([code[v] for v in names], dtype=np.int8)
    jaccards = Jaccards(verdict)
    jaccards.set_near(np.array([4, 2]), np.array([0.91, 0.87]))  # not in row order
    dense = [np.nan, 1.0, 0.87, np.nan, 0.91, np.nan]
    rows = np.array([5, 4, 0, 2, 1, 3, 4])  # any order, repeats
    np.testing.assert_array_equal(jaccards[rows], np.array(dense)[rows])
    np.testing.assert_array_equal(jaccards[np.arange(6, dtype=np.int32)], dense)
    assert jaccards[np.empty(0, dtype=np.int64)].shape == (0,)
