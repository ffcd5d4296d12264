"""Leakage groups from the edges' groups only equal the components over every group."""

import numpy as np
import pytest

from corpus_assets.core.dedup import leakage
from corpus_assets.core.dedup.leakage import components, edge_group_roots


def _over_every_group(groups: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The reference: hook-and-jump over a label per group code."""
    roots = components(
        int(max(groups.max(initial=-1), a.max(initial=-1), b.max(initial=-1))) + 1, a, b
    )
    return roots[groups]


@pytest.mark.parametrize("seed", range(12))
def test_edge_group_roots_equal_the_components_of_every_group(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    groups = rng.integers(0, max(1, n // int(rng.integers(1, 5))), n)  # groups of many rows too
    groups = groups.astype(np.int32 if seed % 2 else np.int64)  # as the codes come
    edges = int(rng.integers(0, n))  # none, few or many: chains, stars and cycles by chance
    a, b = rng.integers(0, groups.max() + 1, (2, edges))
    if seed % 3:  # the groups mapped in several slices, the last one short
        monkeypatch.setattr(leakage, "ROOT_SLICE", int(rng.integers(1, 50)))
    got = edge_group_roots(groups, a, b)
    assert got.dtype == groups.dtype
    assert got.tolist() == _over_every_group(groups, a, b).tolist()


def test_a_chain_through_untouched_groups_names_its_smallest_group() -> None:
    groups = np.array([7, 3, 9, 5, 3, 1])
    a, b = np.array([9, 5]), np.array([5, 3])  # 9-5-3 joined; 7 and 1 untouched
    assert edge_group_roots(groups, a, b).tolist() == [7, 3, 3, 3, 3, 1]
