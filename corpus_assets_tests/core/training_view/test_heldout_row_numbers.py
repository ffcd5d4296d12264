"""The held-out search's sort-free row numbering and one-key pair order give exactly what
``np.unique`` (with its inverse) and ``np.lexsort`` give: the stored pairs, verified table and
state depend on both (ties included: a pair found twice keeps its first Jaccard)."""

import numpy as np
import pytest

from corpus_assets.core.training_view.splits.heldout_known import distinct_rows
from corpus_assets.core.training_view.splits.heldout_state import state_table
from corpus_assets.core.training_view.splits.heldout_tasks import pair_order


@pytest.mark.parametrize("n", [0, 1, 7, 5000])
def test_distinct_rows_are_numpys_unique_with_its_inverse(n: int) -> None:
    rng = np.random.default_rng(n)
    x, y = rng.integers(0, max(n // 3, 1), (2, n))  # rows repeated, some never named
    rows, at_x, at_y = distinct_rows(x, y)
    unique, inverse = np.unique(np.concatenate([x, y]), return_inverse=True)
    assert rows.tolist() == unique.tolist()
    assert at_x.tolist() == inverse[:n].tolist() and at_y.tolist() == inverse[n:].tolist()


@pytest.mark.parametrize("n", [0, 1, 9, 5000])
def test_pair_order_is_the_stable_two_key_sort(n: int) -> None:
    rng = np.random.default_rng(n)
    a, b = rng.integers(0, 40, (2, n))  # many equal pairs: their order must stay as listed
    assert pair_order(a, b).tolist() == np.lexsort((b, a)).tolist()


def test_the_state_lists_each_rows_partners_once_with_the_first_jaccard() -> None:
    a = np.array([3, 0, 3, 0, 5, 3])
    b = np.array([4, 2, 4, 1, 6, 5])
    jaccard = np.array([0.5, 0.6, 0.7, 0.8, 0.9, 0.95])
    state = state_table(np.zeros(8, np.int8), a, b, jaccard)
    assert state["partners"].to_pylist() == [[1, 2], [], [], [4, 5], [], [6], [], []]
    assert state["jaccards"].to_pylist() == [[0.8, 0.6], [], [], [0.5, 0.95], [], [0.9], [], []]


def test_the_state_of_many_repeated_pairs_keeps_each_pairs_first_jaccard() -> None:
    rng = np.random.default_rng(3)
    a = rng.integers(0, 30, 4000)
    b = a + rng.integers(1, 20, 4000)
    jaccard = rng.uniform(0.5, 1.0, 4000)
    first: dict[tuple[int, int], float] = {}
    for x, y, j in zip(a.tolist(), b.tolist(), jaccard.tolist(), strict=True):
        first.setdefault((x, y), j)
    state = state_table(np.zeros(50, np.int8), a, b, jaccard)
    got = {
        (row, partner): j
        for row, (partners, js) in enumerate(
            zip(state["partners"].to_pylist(), state["jaccards"].to_pylist(), strict=True)
        )
        for partner, j in zip(partners, js, strict=True)
    }
    assert got == first
    assert all(p == sorted(p) for p in state["partners"].to_pylist())
