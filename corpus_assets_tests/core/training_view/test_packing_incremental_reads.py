"""A child's packing reads (and re-hashes) in proportion to what it adds.

A child that keeps its parent's shards builds only its new ones, so it verifies only the
token-cache chunks those read, and of those, as of every table it reads, re-hashes only the ones
changed on disk since they last hashed right (its parent's build check hashed the rest): the
same layer.
"""

import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from corpus_assets.core.governance import states
from corpus_assets.core.governance.tombstones import add_tombstone
from corpus_assets.core.pipeline import BUILDERS, DIRECT_BUILDERS, build_all
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime import runners
from corpus_assets.core.runtime.layer_index import LAYERS, read_layer_index
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_json, get_table
from corpus_assets.core.training_view.packing import build as pack_build
from corpus_assets.core.training_view.packing import shards as pack_shards
from corpus_assets.core.training_view.packing.locate import PartitionWriter
from corpus_assets_tests.cas_hashing import hashed_digests
from corpus_assets_tests.core.training_view.test_packing_incremental import (  # noqa: F401 - autouse fixture
    _active,
    _add_essays,
    _home,
    _no_env_catalog,
)


def _token_ids(ws: Workspace, key: str) -> list[str]:
    """The digest of each token-cache chunk's ids the partition's packed layer lists."""
    _ref, index = read_layer_index(ws, key, "packed_blocks")
    return [
        get_json(ws.cas, c["tokens"]["digest"])["ids"]["digest"]
        for c in index.outputs["token_cache"]
    ]


def _parent_tables(ws: Workspace, key: str, sid: str) -> list[str]:
    """The parent's tables a child's packing reads: canonical chunks, mixed samples, members
    and packed spans."""
    _ref, canonical = CanonicalIndex.read(ws, key)
    _ref, mixed = read_layer_index(ws, key, "mixed_samples")
    _ref, packed = read_layer_index(ws, key, "packed_blocks")
    manifest = get_json(ws.cas, states.get(ws.catalog, sid).manifest_digest)
    own = [mixed.output("samples"), packed.output("spans"), manifest["members"]]
    return [chunk.records["digest"] for chunk in canonical.chunks()] + [r["digest"] for r in own]


def test_a_child_re_hashes_only_token_chunks_changed_since_they_hashed_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "home"
    with open_workspace(_home(folder)) as ws:
        sid = _active(ws, "p1")
        assert validate_snapshot(ws, sid, trust_unchanged=True).ok  # the build's check
        parent = _token_ids(ws, "p1")
        tables = _parent_tables(ws, "p1", sid)
        _add_essays(folder)
        for layer in LAYERS[: LAYERS.index("packed_blocks")]:
            BUILDERS[layer](ws, "p2")
        verified = hashed_digests(monkeypatch)
        built = BUILDERS["packed_blocks"](ws, "p2")
        assert built.details["packing"]["mode"] == "incremental"
        child = _token_ids(ws, "p2")
        hashed = [digest for digest in child if digest in verified]
        assert hashed == [digest for digest in child if digest not in parent]  # the new chunk
        assert not set(tables) & set(verified)  # the parent's tables its check hashed
        verified.clear()
        # a chunk the rebuild reads (the new one: the parent's blocks it keeps, whole shards or
        # the start of its last one, read no token chunk), touched since it hashed right
        touched = ws.cas.path(hashed[0])
        os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns))
        again = DIRECT_BUILDERS["packed_blocks"](ws, "p2")  # no memo: a real rebuild
    assert [digest for digest in child if digest in verified] == hashed  # its ctime moved
    assert again.digest == built.digest


def test_chunks_read_are_those_of_the_samples_of_the_shards_built() -> None:
    from corpus_assets.core.training_view.packing.plan import PackPlan

    block = np.array([0, 0, 1, 2, 3, 3], np.int64)
    sample = np.array([0, 1, 2, 3, 4, 5], np.int64)
    zeros = np.zeros(6, np.int64)
    plan = PackPlan("atomic", 8, 4, block, zeros, sample, zeros, zeros + 1, zeros[:0], 6, 0)
    chunk = np.array([0, 1, 2, 3, 4, 4], np.int64)
    bounds = plan.block_bounds()
    assert pack_shards.chunks_read(plan, bounds, [2], 2, chunk) == [3, 4]
    assert pack_shards.chunks_read(plan, bounds, [0, 2], 2, chunk) == [0, 1, 2, 3, 4]
    assert pack_shards.chunks_read(plan, bounds, [], 2, chunk) == []


def test_a_child_locates_plans_and_builds_only_in_its_join_and_its_new_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At two workers, a +1% child partitions no sample for the lookup's join (its sample
    map's join located them), plans no full repack (the padding bound is met whatever a full
    plan would pack), and starts no pool for its few new shards (a tombstoned record of block
    0 makes them two: its first shard and the last): the same layer."""
    folder = tmp_path / "home"
    with open_workspace(_home(folder)) as ws:
        _active(ws, "p1")
        spans = get_table(ws.cas, read_layer_index(ws, "p1", "packed_blocks")[1].output("spans"))
        add_tombstone(ws.catalog, "record", spans["record_id"][0].as_py(), "erasure")
        _add_essays(folder)
        first = build_all(ws, "p2")["packed_blocks"]
    partitioned: Counter[str] = Counter()
    planned: list[int] = []
    maps: list[int] = []
    write, plan, pool_map = PartitionWriter.write, pack_build.plan_packing, runners.pool_map

    def partition(writer: PartitionWriter, side: str, table: pa.Table) -> None:
        partitioned[side] += table.num_rows
        write(writer, side, table)

    def planning(lengths: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        planned.append(len(lengths))
        return plan(lengths, *args, **kwargs)

    def pooled(fn: Any, jobs: list, *args: Any) -> list:
        maps.append(len(jobs))
        return pool_map(fn, jobs, *args)

    monkeypatch.setattr(PartitionWriter, "write", partition)
    monkeypatch.setattr(pack_build, "plan_packing", planning)
    monkeypatch.setattr(runners, "pool_map", pooled)
    with open_workspace(_home(folder, workers=2)) as ws:
        again = DIRECT_BUILDERS["packed_blocks"](ws, "p2")  # no memo: a real rebuild
    assert again.details["packing"]["mode"] == "incremental"
    assert again.run_stats["shards_reused"] > 0
    assert (partitioned, planned, maps) == (Counter(), [], [])
    assert again.digest == first.digest


def test_the_padding_bound_is_never_below_a_full_repacks_extra_padding() -> None:
    """``padding_bound`` stands in for the full plan only when it is an upper bound."""
    from corpus_assets.core.training_view.packing.incremental import extra_padding, padding_bound
    from corpus_assets.core.training_view.packing.plan import plan_packing

    rng = np.random.default_rng(7)
    for _ in range(20):
        lengths = rng.integers(1, 200, rng.integers(1, 60))
        full = plan_packing(lengths, 64, overlong="split")
        worse = plan_packing(lengths, 64, "next_fit", overlong="split")
        assert padding_bound(worse) >= extra_padding(worse, full)
        assert padding_bound(full) >= extra_padding(full, full) == 0


def test_piece_rows_gathers_what_a_binary_search_of_the_pieces_finds() -> None:
    """``piece_rows`` by each sample's first row (one pass, no search per span) finds the rows
    a binary search of the stream-ordered pieces finds: a split sample's later pieces, and -1
    for a sample with no piece, an offset off a cut or past the sample's last piece."""
    from corpus_assets.core.training_view.packing.incremental import first_pieces, piece_rows
    from corpus_assets.core.training_view.packing.plan import apply_overlong

    rng = np.random.default_rng(32)
    for _ in range(20):
        lengths = rng.integers(1, 300, rng.integers(1, 80))
        lengths[rng.random(lengths.size) < 0.2] = 0  # samples with no piece
        pieces = apply_overlong(lengths, 64, "split")
        count = int(rng.integers(1, 200))
        sample = rng.integers(0, lengths.size, count)
        offset = rng.integers(0, 6, count) * 64 + np.where(rng.random(count) < 0.1, 5, 0)
        at = np.searchsorted(pieces.sample, sample) + offset // 64
        safe = np.minimum(at, max(pieces.sample.size - 1, 0))
        hit = (at < pieces.sample.size) & (pieces.sample[safe] == sample)
        expected = np.where(hit & (pieces.offset[safe] == offset), at, -1)
        first = first_pieces(pieces, lengths.size)
        assert np.array_equal(piece_rows(pieces, first, sample, offset, 64), expected)


def test_the_block_start_order_is_the_two_key_sort() -> None:
    """One stable key sort gives ``np.lexsort((start, block))``'s order: ties kept in place,
    sorted runs and random rows, and the two-key sort where a key could overflow."""
    from corpus_assets.core.training_view.packing.incremental import block_start_order

    rng = np.random.default_rng(32)
    for _ in range(20):
        n = int(rng.integers(0, 300))
        block = rng.integers(0, 40, n).astype(np.int64)
        start = rng.integers(0, 8, n).astype(np.int64)
        cut = int(rng.integers(0, n + 1))
        block[:cut] = np.sort(block[:cut])  # the kept rows: in order already
        expected = np.lexsort((start, block))
        assert np.array_equal(block_start_order(block, start), expected)
    huge = np.array([1 << 62, 0, 1 << 62], np.int64)
    starts = np.array([2, 1, 0], np.int64)
    assert np.array_equal(block_start_order(huge, starts), [1, 2, 0])
