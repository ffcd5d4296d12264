"""Verdicts held for the rows not kept only, read by rows as the dense arrays: the verdict code,
the direct match and its Jaccard (1.0 for exact copies, the near ones', NaN otherwise)."""

import numpy as np
import pytest

from corpus_assets.core.dedup.verdicts import VERDICTS, Looked, Verdicts

CODE = {name: k for k, name in enumerate(VERDICTS)}


def _verdicts() -> Verdicts:
    """Six rows: 0 and 5 kept, 1 an exact copy of 2, 2 and 4 near 0 and 5, 3 excluded."""
    verdicts = Verdicts(6)
    verdicts.set(np.array([3]), CODE["excluded"])
    verdicts.set(np.array([1]), CODE["exact_duplicate"], np.array([2]))
    verdicts.set(np.array([4, 2]), CODE["near_duplicate"], np.array([5, 0]))  # not in row order
    verdicts.jaccard.set_near(np.array([4, 2]), np.array([0.91, 0.87]))
    return verdicts


def test_verdicts_read_by_rows_as_the_dense_arrays() -> None:
    verdicts = _verdicts()
    names = ["keep", "exact_duplicate", "near_duplicate", "excluded", "near_duplicate", "keep"]
    dense = {
        "verdict": np.array([CODE[v] for v in names], dtype=np.int8),
        "match": np.array([-1, 2, 0, -1, 5, -1]),
        "jaccard": np.array([np.nan, 1.0, 0.87, np.nan, 0.91, np.nan]),
        # an exact copy of a near duplicate stands behind that one's match; excluded: none
        "representatives": np.array([0, 0, 0, -1, 5, 5]),
    }
    rows = np.array([5, 4, 0, 2, 1, 3, 4])  # any order, repeats
    for rows_of in (rows, np.arange(6, dtype=np.int32)):
        looked = verdicts.look(rows_of)
        np.testing.assert_array_equal(looked.verdict, dense["verdict"][rows_of])
        np.testing.assert_array_equal(verdicts.match(rows_of), dense["match"][rows_of])
        np.testing.assert_array_equal(verdicts.jaccard.of(looked), dense["jaccard"][rows_of])
        want = dense["representatives"][rows_of]
        np.testing.assert_array_equal(verdicts.representatives(looked), want)
    for lo, hi in ((0, 6), (2, 5), (4, 4)):  # a range of rows: the same arrays, no search
        spanned, looked = verdicts.span(lo, hi), verdicts.look(np.arange(lo, hi))
        for name in Looked._fields:
            np.testing.assert_array_equal(getattr(spanned, name), getattr(looked, name))
    assert verdicts.jaccard.of(verdicts.look(np.empty(0, dtype=np.int64))).shape == (0,)
    assert verdicts.rows.tolist() == [1, 2, 3, 4]  # the kept rows are not held


def test_counts_per_source_and_verdict() -> None:
    """From each row's source, or from the sources' totals and the held rows' sources only
    (the runner's coding): the same counts, a source without rows left out."""
    sources, names = np.array([1, 0, 1, 1, 0, 1]), ["a", "b", "c"]
    verdicts = _verdicts()
    want = {
        "a": dict(zip(VERDICTS, [0, 1, 1, 0], strict=True)),
        "b": dict(zip(VERDICTS, [2, 0, 1, 1], strict=True)),
    }
    assert verdicts.per_source(sources, names) == want
    totals = np.array([2, 4, 0])
    assert verdicts.per_source_held(totals, sources[verdicts.rows], names) == want


def test_a_verdict_set_twice_is_refused() -> None:
    verdicts = _verdicts()
    with pytest.raises(ValueError, match="set twice"):
        verdicts.set(np.array([0, 4]), CODE["exact_duplicate"], np.array([5, 5]))
