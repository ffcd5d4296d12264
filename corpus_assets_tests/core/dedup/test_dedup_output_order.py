"""The dedup table's order computed on integers equals DuckDB's sort of the strings."""

from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.dedup import clusters, coding, in_memory
from corpus_assets.core.dedup.clusters import CLUSTER_COLUMNS
from corpus_assets.core.dedup.edges import EdgeIds, edge_table
from corpus_assets.core.dedup.output_order import bucket, id_ranks, sorted_batches
from corpus_assets.core.dedup.partition_db import PartitionDb


def _records() -> pa.Table:
    """Repeated record ids whose objects and lines decide the order, non-ASCII ids and objects
    (byte order, not collation), and rows that tie on everything but their row."""
    ids = ["b", "a", "é", "b", "Z", "b", "a", "ü", "b", "a"]
    objects = ["o2", "x", "o", "o1", "o", "o10", "x", "o", "ö", "x"]
    lines = [1, 3, 0, 7, 0, 2, 3, 0, 0, 1]
    n = len(ids)
    return pa.table(
        {
            "record_id": ids,
            "source_id": ["s"] * n,
            "object": objects,
            "line": pa.array(lines, pa.int64()),
            "group_id": [f"g{i}" for i in range(n)],
            "dedup_key": [f"k{i}" for i in range(n)],
            "kind": ["document"] * n,
            "text": ["t"] * n,
        }
    )


def test_positions_equal_duckdbs_order_by_record_id_object_line_row() -> None:
    with PartitionDb.from_table(_records()) as db:
        expected = db.con.sql(
            "SELECT row FROM recs ORDER BY record_id, object, line, row"
        ).fetchnumpy()["row"]
        codes = db.codes()
        positions = id_ranks(db, codes.record_id.codes)
    assert np.array_equal(np.argsort(positions), expected)


def test_buckets_give_the_rows_in_position_order(tmp_path: Path) -> None:
    n = 50
    rng = np.random.default_rng(7)
    pos = rng.permutation(n)
    columns = {f.name: pa.nulls(n, f.type) for f in CLUSTER_COLUMNS}
    columns["line"] = pa.array(pos * 10, pa.int64())
    columns["record_id"] = pa.array([f"r{p:03d}" for p in pos])
    table = pa.table({**columns, "pos": pa.array(pos, pa.int64())})
    unsorted = tmp_path / "unsorted.parquet"
    pq.write_table(table, unsorted, row_group_size=7)
    buckets = bucket(unsorted, tmp_path, rows=8)
    assert len(buckets) == 7  # ceil(50 / 8)
    out = pa.Table.from_batches(list(sorted_batches(buckets, CLUSTER_COLUMNS)))
    assert out.schema == CLUSTER_COLUMNS
    assert out.column("line").to_pylist() == [10 * p for p in range(n)]
    assert out.column("record_id").to_pylist() == [f"r{p:03d}" for p in range(n)]
    assert not any(p.exists() for p in buckets)  # each bucket is deleted once read


def _duplicated_records(n: int = 3000) -> pa.Table:
    """Records with exact duplicates (every third text repeats), enough rows for DuckDB to need
    more than a few blocks in its joins."""
    keys = [f"k{i - i % 3}" for i in range(n)]
    return pa.table(
        {
            "record_id": [f"rec-{i:06d}-{'x' * 40}" for i in range(n)],
            "source_id": ["s"] * n,
            "object": ["obj"] * n,
            "line": pa.array(range(n), pa.int64()),
            "group_id": [f"g{i}" for i in range(n)],
            "dedup_key": keys,
            "kind": ["document"] * n,
            "length": pa.array([100] * n, pa.int64()),
        }
    )


def test_output_joins_retry_at_the_coding_limit_when_duckdb_runs_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    records = _duplicated_records()
    expected = in_memory.cluster(records, {"s": 0})
    monkeypatch.setattr(clusters, "OUTPUT_MEMORY_LIMIT", "256KB")
    retried = in_memory.cluster(records, {"s": 0})
    assert retried.table.equals(expected.table)
    assert retried.edges.equals(expected.edges)
    assert expected.edges.num_rows == 2000  # the exact copies
    monkeypatch.setattr(clusters, "MEMORY_LIMIT", "256KB")  # no room on the retry either
    with pytest.raises(duckdb.OutOfMemoryException):  # so the first try did run out
        in_memory.cluster(records, {"s": 0})


def _dense(values: list[str | None]) -> list[int]:
    """Dense ranks of ``values`` in byte order, None last."""
    ranked = sorted(set(values), key=lambda v: (v is None, (v or "").encode()))
    return [ranked.index(v) for v in values]


def _dense_codes(codes: np.ndarray) -> list[int]:
    return np.unique(codes, return_inverse=True)[1].tolist()


def test_record_and_group_id_codes_rank_each_column_in_byte_order() -> None:
    """Codes from one sort of both id columns: per column, equal values share a code and
    codes order as the values' bytes (None last); a group id that is its row's record id, one
    that is another row's record id, one that is no record's id, and nulls."""
    ids = ["b", "a", "é", "b", "Z", None, "a", "ü", "c", "aa"]
    groups = ["b", "g", "é", "ü", None, None, "a", "zz", "a", "Z"]
    n = len(ids)
    records = pa.table(
        {
            "record_id": pa.array(ids, pa.string()),
            "source_id": ["s"] * n,
            "object": ["o"] * n,
            "line": pa.array(range(n), pa.int64()),
            "group_id": pa.array(groups, pa.string()),
            "dedup_key": [f"k{i % 4}" for i in range(n)],
            "kind": ["document"] * n,
            "text": ["t"] * n,
        }
    )
    with PartitionDb.from_table(records) as db:
        codes = db.codes()
    for values, coded in ((ids, codes.record_id), (groups, codes.group_id)):
        assert _dense(values) == _dense_codes(coded.codes)
    assert codes.dedup_key.codes.tolist() == [i % 4 for i in range(n)]


@pytest.mark.parametrize("copies", [3, 1])  # every third text repeats; no copy at all
def test_edge_ids_from_the_written_table_give_the_scanned_edges(
    tmp_path: Path, copies: int
) -> None:
    """The edges by record id gathered from the clusters table's batches as they pass (ids
    not in row order, a repeated id, batches of 7 rows) equal those the records scan gives."""
    n = 60
    rng = np.random.default_rng(3)
    ids = [f"id-{p:03d}" for p in rng.permutation(n)]
    ids[5] = ids[40]  # excluded as a repeat: named by no edge
    records = _duplicated_records(n).set_column(0, "record_id", pa.array(ids))
    records = records.set_column(5, "dedup_key", pa.array([f"k{i - i % copies}" for i in range(n)]))
    with PartitionDb.from_table(records) as db:
        decided = clusters.decide(db, {"s": 0})
        expected = edge_table(db, decided.edges)
        path = clusters.join_clusters(db, clusters.write_decisions(decided, tmp_path), tmp_path)
    gathered = EdgeIds(decided.take_edges(), decided.positions)
    table = pa.Table.from_batches(list(clusters.cluster_batches(path)), CLUSTER_COLUMNS)
    passed = list(gathered.tap(iter(table.to_batches(max_chunksize=7))))
    assert pa.Table.from_batches(passed).equals(table)
    assert gathered.table().equals(expected)
    assert expected.num_rows == (39 if copies > 1 else 0)  # 40 copies, one excluded


def test_a_repeated_record_id_is_excluded_after_its_first_row() -> None:
    """Only ids that repeat are ordered: each later row names its id's first row, as a
    duplicate (same dedup key) or a conflict (another text); ids seen once stay."""
    ids = ["b", "a", "b", "c", "a", "b", "d"]
    records = _duplicated_records(len(ids)).set_column(0, "record_id", pa.array(ids))
    keys = ["k0", "k1", "k0", "k2", "kX", "k0", "k3"]
    records = records.set_column(5, "dedup_key", pa.array(keys))
    with PartitionDb.from_table(records) as db:
        decided = clusters.decide(db, {"s": 0})
    kinds = (coding.DUPLICATE_ID, coding.ID_CONFLICT)
    reasons = {r: next(k for k in kinds if v.startswith(k)) for r, v in decided.excluded.items()}
    assert reasons == {2: kinds[0], 4: kinds[1], 5: kinds[0]}
    assert "line 0)" in decided.excluded[5] and "line 1" in decided.excluded[4]


@pytest.mark.parametrize("seed", range(4))
def test_the_total_order_on_one_key_equals_the_lexsort(seed: int) -> None:
    """Source rank, longer first (missing lengths last), position: one int64 key, one sort."""
    from corpus_assets.core.dedup.order import sorted_by

    rng = np.random.default_rng(seed)
    n = 5000
    source_rank = rng.integers(0, 4, n).astype(np.int64)
    longer_first = -rng.integers(0 if seed else 3, 50, n).astype(np.int64)
    longer_first[rng.random(n) < 0.05] = np.iinfo(np.int64).max
    position = rng.permutation(n).astype(np.int64)
    expected = np.lexsort((position, longer_first, source_rank))
    assert np.array_equal(sorted_by(source_rank, longer_first, position), expected)
    huge = longer_first.copy()
    huge[0] = -(2**60)  # past the one key's range: the lexsort itself
    assert np.array_equal(
        sorted_by(source_rank, huge, position), np.lexsort((position, huge, source_rank))
    )


def test_ranks_are_placed_across_slices_for_a_permutation_and_a_class() -> None:
    """``place_ranks`` is ``into[order] = arange(len(order))`` over several slices: a whole
    permutation's inverse, and a class's rows ranked with the rows outside it untouched."""
    from corpus_assets.core.dedup.order import ORDER_SLICE, place_ranks

    rng = np.random.default_rng(7)
    n = 3 * ORDER_SLICE + 17
    order = rng.permutation(n)
    inverse = place_ranks(np.empty(n, dtype=np.int32), order)
    assert np.array_equal(inverse, np.argsort(order))
    some = order[: 2 * ORDER_SLICE + 5]
    ranks = place_ranks(np.full(n, -1, dtype=np.int32), some)
    expected = np.full(n, -1, dtype=np.int32)
    expected[some] = np.arange(len(some))
    assert np.array_equal(ranks, expected)


def test_positions_without_repeated_ids_are_a_stable_sort() -> None:
    records = _records().set_column(
        0, "record_id", pa.array([f"id{i}" for i in (3, 1, 2, 0, 9, 5, 4, 8, 7, 6)])
    )
    with PartitionDb.from_table(records) as db:
        expected = db.con.sql(
            "SELECT row FROM recs ORDER BY record_id, object, line, row"
        ).fetchnumpy()["row"]
        positions = id_ranks(db, db.codes().record_id.codes)
    assert np.array_equal(np.argsort(positions), expected)


def test_kind_and_source_codes_follow_duckdbs_order_of_their_values() -> None:
    """One scan codes both: values sorted by bytes (non-ASCII after ASCII), null last."""
    records = _records()
    sources = ["s", "é", None, "S", "s", "b", None, "é", "s", "a"]
    records = records.set_column(1, "source_id", pa.array(sources, pa.string()))
    with PartitionDb.from_table(records) as db:
        codes = db.codes()
        expected = [
            v
            for (v,) in db.con.execute("SELECT DISTINCT source_id FROM recs ORDER BY 1").fetchall()
        ]
    assert codes.source_id.values == expected == ["S", "a", "b", "s", "é", None]
    assert [expected[c] for c in codes.source_id.codes.tolist()] == sources
    assert codes.kind.values == ["document"] and not codes.kind.codes.any()
