"""The band index: a child's bands from its parent's index equal a full sort's, byte for byte.

Signatures are drawn from a few values per component, so buckets are large and new records
land inside, before and after the parent's members of a bucket (and out of the class: gone
rows, rows that stop being class members).
"""

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from corpus_assets.core.dedup.band_index import Banding
from corpus_assets.core.dedup.band_tasks import key_partition
from corpus_assets.core.dedup.near_dedup import LshParams, RowMajor, candidate_pairs

PARAMS = LshParams(bands=6, rows=2, threshold=0.8, bucket_heads=3)


def _signatures(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 3, size=(n, PARAMS.bands * PARAMS.rows), dtype=np.uint32)


def _chunks(sigs: np.ndarray, sizes: list[int]) -> tuple[list[RowMajor], np.ndarray]:
    starts = np.cumsum([0, *sizes], dtype=np.int64)
    return [RowMajor(sigs[a:b]) for a, b in pairwise(starts)], starts


def _run(banding: Banding, order: np.ndarray) -> tuple[list, np.ndarray, list]:
    """The class's bands as they pass, its candidate pairs and band figures."""
    seen = []

    def watched():
        for keys, ranks in banding.bands("doc/prose", order):
            seen.append((keys.copy(), ranks.copy()))
            yield keys, ranks

    pairs, stats = candidate_pairs([], order, PARAMS, watched())
    return seen, pairs, stats


def _parent_index(
    tmp: Path, rng: np.random.Generator, sigs: np.ndarray, n: int
) -> tuple[Path, np.ndarray]:
    """The parent's index over rows 0..n-1 (a class of most of them, in a random order), and
    that order."""
    chunks, starts = _chunks(sigs[:n], [n // 2, n - n // 2])
    order = rng.permutation(n)[: n - 7]  # some rows are in another class
    parent = Banding(chunks, starts, PARAMS, tmp / "parent")
    (tmp / "parent").mkdir()
    _run(parent, order)
    return parent.written["doc/prose"], order


@pytest.mark.parametrize("seed", range(8))
def test_a_child_banded_from_its_parents_index_equals_a_full_sort(
    tmp_path: Path, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    n_parent, n_new = 300, 40
    sigs = _signatures(rng, n_parent + n_new)
    index, parent_order = _parent_index(tmp_path, rng, sigs, n_parent)
    # the child: parent rows 0..149 gone (a removed chunk), 150..299 kept, then new rows
    child_sigs = sigs[150:]
    parent_to_child = np.r_[np.full(150, -2), np.arange(150)].astype(np.int64)
    survivors = np.flatnonzero(rng.random(len(child_sigs)) < 0.9)  # some leave the class
    order = rng.permutation(survivors)  # a new total order: new rows anywhere
    chunks, starts = _chunks(child_sigs, [150, n_new])
    (tmp_path / "full").mkdir()
    (tmp_path / "child").mkdir()
    full = Banding(chunks, starts, PARAMS, tmp_path / "full")
    child = Banding(
        chunks, starts, PARAMS, tmp_path / "child", {"doc/prose": index}, parent_to_child
    )
    # survivors keep their relative order: the parent's order restricted to them
    order = _keep_parent_order(order, parent_order, parent_to_child)
    want, want_pairs, want_stats = _run(full, order)
    got, got_pairs, got_stats = _run(child, order)
    for (wk, wr), (gk, gr) in zip(want, got, strict=True):
        np.testing.assert_array_equal(gk, wk)
        np.testing.assert_array_equal(gr, wr)
    np.testing.assert_array_equal(got_pairs, want_pairs)
    assert got_stats == want_stats
    assert full.written["doc/prose"].read_bytes() == child.written["doc/prose"].read_bytes()
    assert child.work["band_classes_incremental"] == 1
    new_in_class = len(order) - _held(index, parent_to_child, order)
    assert child.work["band_keys_computed"] == new_in_class * PARAMS.bands
    assert full.work["band_keys_computed"] == len(order) * PARAMS.bands


def _keep_parent_order(
    order: np.ndarray, parent_order: np.ndarray, parent_to_child: np.ndarray
) -> np.ndarray:
    """``order`` with the rows the parent's class held put back in the parent's relative order
    (the total order is on the records' own fields: survivors never swap)."""
    parent_rank = np.full(len(order) + 1000, -1)
    child_rows = parent_to_child[parent_order]
    kept = child_rows >= 0
    parent_rank[child_rows[kept]] = np.flatnonzero(kept)
    slots = np.flatnonzero(parent_rank[order] >= 0)
    out = order.copy()
    out[slots] = order[slots][np.argsort(parent_rank[order[slots]])]
    return out


def _held(index: Path, parent_to_child: np.ndarray, order: np.ndarray) -> int:
    rows = parent_to_child[np.load(index)[0]["row"].astype(np.int64)]
    return int(np.isin(order, rows[rows >= 0]).sum())


def test_survivors_out_of_order_fall_back_to_a_full_sort(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    sigs = _signatures(rng, 200)
    chunks, starts = _chunks(sigs, [100, 100])
    (tmp_path / "parent").mkdir()
    parent = Banding(chunks, starts, PARAMS, tmp_path / "parent")
    _run(parent, np.arange(200))
    reversed_order = np.arange(200)[::-1].copy()  # every survivor swapped: a new total order
    (tmp_path / "child").mkdir()
    child = Banding(
        chunks,
        starts,
        PARAMS,
        tmp_path / "child",
        {"doc/prose": parent.written["doc/prose"]},
        np.arange(200, dtype=np.int64),
    )
    (tmp_path / "full").mkdir()
    want = _run(Banding(chunks, starts, PARAMS, tmp_path / "full"), reversed_order)
    got = _run(child, reversed_order)
    np.testing.assert_array_equal(got[1], want[1])
    assert got[2] == want[2]
    assert child.work["band_keys_computed"] == 200 * PARAMS.bands  # every band sorted again


def test_key_partitions_are_ranges_of_keys_in_order() -> None:
    """The map tasks' partitions are key ranges: a band's partitions, sorted one by one and
    put one after another, are sorted (the band index is their concatenation), and random
    keys spread over every partition."""
    rng = np.random.default_rng(7)
    keys = rng.integers(0, np.iinfo(np.uint64).max, 20_000, dtype=np.uint64, endpoint=True)
    keys = np.concatenate([keys, np.array([0, np.iinfo(np.uint64).max], dtype=np.uint64)])
    for partitions in (1, 3, 5, 64):
        parts = key_partition(keys, partitions)
        assert parts.min() == 0 and parts.max() == partitions - 1
        joined = np.concatenate([np.sort(keys[parts == p]) for p in range(partitions)])
        assert np.array_equal(joined, np.sort(keys)), partitions
        counts = np.bincount(parts, minlength=partitions)
        assert counts.min() > 0.8 * len(keys) / partitions, counts
