"""The clusters table as chunk parts: the joined rows cut at the chunks' row counts, a kept part
named as the parent's, the edges' ids read from kept parts, and a row count that does not line
up refused by name."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from corpus_assets.core.dedup.cluster_parts import put_cluster_parts
from corpus_assets.core.dedup.clusters import CLUSTER_COLUMNS
from corpus_assets.core.dedup.edges import EdgeIds
from corpus_assets.core.dedup.output_order import TablePositions
from corpus_assets.core.dedup.reuse import Reuse
from corpus_assets.core.dedup.row_values import HeldRows
from corpus_assets.core.dedup.verdicts import EdgeRows
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import ChunkPart
from corpus_assets.core.storage.artifacts import PARQUET, make_ref
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.storage.parquet_sink import put_table_batches


def test_positions_are_chunk_major_and_ranked_within_a_chunk() -> None:
    rank = np.array([4, 0, 3, 1, 2], dtype=np.int64)  # rows 0-1 in chunk 0, 2-4 in chunk 1
    positions = TablePositions(HeldRows(rank), np.array([0, 2]))
    assert positions.span(0, 5).tolist() == [1, 0, 4, 2, 3]
    assert positions.of(np.array([4, 0, 4, 2])).tolist() == [3, 1, 3, 4]
    assert TablePositions(HeldRows(rank), None).span(0, 5).tolist() == rank.tolist()


@pytest.mark.parametrize("seed", range(5))
def test_positions_worked_out_by_chunk_are_those_of_one_sort(seed: int) -> None:
    """Any span or any rows (repeats, empty chunks, ranges across chunks) get the positions
    an argsort of each whole chunk gives, whichever chunk was asked for before."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 9, size=12)
    n = int(sizes.sum())
    starts = np.cumsum([0, *sizes])[:-1]
    rank = rng.permutation(n).astype(np.int32)
    expected = np.empty(n, dtype=np.int64)
    for lo, size in zip(starts.tolist(), sizes.tolist(), strict=True):
        expected[lo + np.argsort(rank[lo : lo + size])] = np.arange(lo, lo + size)
    positions = TablePositions(HeldRows(rank), starts)
    for _ in range(20):
        lo, hi = sorted(rng.integers(0, n + 1, size=2).tolist())
        assert positions.span(lo, hi).tolist() == expected[lo:hi].tolist()
        rows = rng.integers(0, n, size=int(rng.integers(0, 30)))
        assert positions.of(rows).tolist() == expected[rows].tolist()


def _rows(ids: list[str]) -> pa.Table:
    columns = {f.name: pa.nulls(len(ids), f.type) for f in CLUSTER_COLUMNS}
    columns["record_id"] = pa.array(ids, pa.string())
    return pa.table(columns, schema=CLUSTER_COLUMNS)


def _chunk(key: str, count: int) -> ChunkRecords:
    return ChunkRecords(key, make_ref(f"sha256:{key}", PARQUET, 1), count)


def _edge_ids(n: int, a: list[int], b: list[int]) -> EdgeIds:
    rows = EdgeRows(np.array(a, np.int64), np.array(b, np.int64), 0, np.ones(len(a)))
    return EdgeIds(rows, TablePositions(HeldRows(np.arange(n, dtype=np.int64)), None))


def _ids(cas: ContentStore, ref: dict) -> list[str]:
    table = PartedTable.read(cas, ref, "clusters")
    batches = table.batches(VerifiedFiles(cas), "clusters", ["record_id"])
    return [v for batch in batches for v in batch.column(0).to_pylist()]


def test_joined_rows_are_cut_into_parts_and_a_kept_part_is_the_parents(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "cas")
    chunks = [_chunk("a", 2), _chunk("b", 0), _chunk("c", 3), _chunk("d", 1)]
    kept_ref = put_table_batches(
        cas, CLUSTER_COLUMNS, _rows(["c0", "c1", "c2"]).to_batches(), tmp_path
    )
    kept = ChunkPart(chunk="old-c", records="sha256:c", count=3, **kept_ref)
    joined = _rows(["a0", "a1", "d0"]).to_batches(max_chunksize=2)  # a batch spans two chunks
    edges = _edge_ids(6, [1, 4], [0, 3])  # a1-a0 joined; c2-c1 from the kept part
    reuse = Reuse({2: kept}, np.array([0, 1, 5]))
    ref = put_cluster_parts(cas, "code@1", chunks, iter(joined), reuse, edges, tmp_path)
    table = PartedTable.read(cas, ref, "clusters")
    assert [p.chunk for p in table.parts] == ["a", "b", "c", "d"]
    assert table.parts[2].digest == kept.digest and table.counts == (2, 0, 3, 1)
    assert _ids(cas, ref) == ["a0", "a1", "c0", "c1", "c2", "d0"]
    assert edges.table().column("record_a").to_pylist() == ["a1", "c2"]
    assert edges.table().column("record_b").to_pylist() == ["a0", "c1"]


@pytest.mark.parametrize("joined", [["a0"], ["a0", "a1", "x"]])
def test_joined_rows_that_do_not_fill_the_chunks_are_refused(tmp_path: Path, joined) -> None:
    cas = ContentStore(tmp_path / "cas")
    batches = iter(_rows(joined).to_batches())
    with pytest.raises(ValueError, match="dedup clusters"):
        put_cluster_parts(cas, "c", [_chunk("a", 2)], batches, None, _edge_ids(2, [], []), tmp_path)


def test_no_chunk_gives_one_empty_part(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "cas")
    ref = put_cluster_parts(cas, "c", [], iter([]), None, _edge_ids(0, [], []), tmp_path)
    assert PartedTable.read(cas, ref, "clusters").counts == (0,)
