"""The DuckDB helpers of the training view: stored bytes equal ``put_table``'s, spills land under
the data home, the SQL split hash equals ``split_indices``, the stored graph equals the Arrow
one (the clusters table stored whole or as chunk parts)."""

import random
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.runtime.config import SplitPolicy
from corpus_assets.core.runtime.layer_index import LayerIndex
from corpus_assets.core.runtime.snapshot_manifest import (
    CLUSTER_PARTS_SCHEMA,
    ChunkPart,
    ChunkParts,
)
from corpus_assets.core.storage.artifacts import get_table, put_json, put_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import (
    VerifiedFiles,
    cas_parquet,
    put_query,
    tightened,
)
from corpus_assets.core.storage.parquet_sink import ROW_GROUP_ROWS, put_tables
from corpus_assets.core.training_view import view_queries
from corpus_assets.core.training_view.splits import SPLITS
from corpus_assets.core.training_view.splits.assign import hash_split_sql, split_indices
from corpus_assets.core.training_view.splits.bridges import (
    GRAPH_CLUSTER_COLUMNS,
    LeakageGraph,
    StoredGraph,
)

SCHEMA = pa.schema([("record_id", pa.string()), ("n", pa.int64()), ("split", pa.string())])


def _rows(count: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    ids = [f"src/{rng.getrandbits(64):016x}~{i % 7}" for i in range(count)]
    return pa.table(
        {
            "record_id": ids,
            "n": np.arange(count, dtype=np.int64) * 3,
            "split": [SPLITS[rng.randrange(3)] for _ in range(count)],
        },
        schema=SCHEMA,
    )


@pytest.mark.parametrize("count", [0, 7, 70_000, ROW_GROUP_ROWS + 5_000])
def test_put_tables_stores_put_table_bytes_from_uneven_batches(tmp_path: Path, count: int) -> None:
    cas = ContentStore(tmp_path / "cas")
    table = _rows(count, count)
    sizes = [1000, 77_777, 3, 65_536]
    parts, at = [], 0
    while at < count:
        parts.append(table.slice(at, sizes[len(parts) % len(sizes)]).to_batches()[0])
        at += parts[-1].num_rows
    ref, head = put_tables(cas, iter(parts), SCHEMA)
    assert ref == put_table(cas, table)
    assert head.to_pylist() == table.slice(0, 10).to_pylist()
    if count > ROW_GROUP_ROWS:
        assert pq.ParquetFile(cas.path(ref["digest"])).metadata.num_row_groups == 2


def test_put_query_is_sorted_and_spills_under_home(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "cas")
    table = _rows(200_000, 1)
    with view_queries.spilling(tmp_path, 2) as con:
        spill = list((tmp_path / "tmp").iterdir())
        assert len(spill) == 1 and spill[0].name.startswith("duckdb-")
        con.register("rows", table)
        ref, _ = put_query(cas, con, "SELECT * FROM rows ORDER BY record_id, n", SCHEMA)
    assert not any((tmp_path / "tmp").iterdir())  # the spill directory is removed
    expected = table.sort_by([("record_id", "ascending"), ("n", "ascending")])
    assert ref == put_table(cas, expected)
    assert get_table(cas, ref).equals(expected)


def test_a_tightened_sort_stores_the_same_bytes_and_gives_the_settings_back(
    tmp_path: Path,
) -> None:
    """``put_query(sort_limit=...)`` sorts on one thread under the lower cap (what keeps a
    driver's peak down) and stores the bytes the full cap stores; the connection's own cap and
    threads are back afterwards, also when the query fails."""
    cas = ContentStore(tmp_path / "cas")
    table = _rows(120_000, 3)
    sql = "SELECT * FROM rows ORDER BY record_id, n"
    settings = "SELECT current_setting('memory_limit'), current_setting('threads')"
    with view_queries.spilling(tmp_path, 2) as con:
        con.register("rows", table)
        before = con.execute(settings).fetchall()
        wide, _ = put_query(cas, con, sql, SCHEMA)
        narrow, _ = put_query(cas, con, sql, SCHEMA, sort_limit="16MB")
        assert con.execute(settings).fetchall() == before
        with pytest.raises(duckdb.Error), tightened(con, "16MB"):
            assert con.execute(settings).fetchall()[0][1] == 1
            con.execute("SELECT * FROM no_such_table")
        assert con.execute(settings).fetchall() == before
    assert narrow == wide


def test_sql_hash_equals_split_indices() -> None:
    policy = SplitPolicy(salt="s\u00e9", train_percent=70, validation_percent=20, test_percent=10)
    keys = pa.array([f"sha256:{i:064x}" for i in range(3000)] + ["", "k\u00fc", "a'b"])
    con = view_queries.connect()
    con.register("keys", pa.table({"key": keys}))
    for version in (0, 2):
        sql = f"SELECT key, {hash_split_sql(policy, version)} AS split FROM keys"
        got = dict(con.execute(sql).fetchall())
        expected = pa.array(SPLITS).take(pa.array(split_indices(keys, policy, version)))
        assert [got[k] for k in keys.to_pylist()] == expected.to_pylist()
        assert len(set(got.values())) == 3


def _graph_tables(n: int = 500) -> tuple[pa.Table, pa.Table]:
    """A clusters table in record order (with the object and line the order ends on) and its
    edges."""
    clusters = pa.table(
        {
            "record_id": [f"r{i:04d}" for i in range(n)],
            "object": ["o"] * n,
            "line": list(range(n)),
            "group_id": [f"g{i // 3}" for i in range(n)],
            "leakage_id": [f"c{(i * 7) % 40}" for i in range(n)],
            "verdict": ["keep"] * n,
            "representative_id": [f"r{i:04d}" for i in range(n)],
            "is_representative": [i % 5 != 0 for i in range(n)],
            "other": ["x"] * n,
        }
    )
    edges = pa.table(
        {"record_a": [f"r{i:04d}" for i in range(0, n, 2)]},
    ).append_column("record_b", pa.array([f"r{(i + 40) % n:04d}" for i in range(0, n, 2)]))
    return clusters, edges


def _assert_same_graph(stored: StoredGraph, clusters: pa.Table, edges: pa.Table) -> None:
    wanted = pa.array(["c3", "c17", "c39", "nothing"])
    arrow = LeakageGraph(clusters, edges).within(wanted)
    got = stored.within(wanted)
    assert got.clusters.to_pylist() == arrow.clusters.select(GRAPH_CLUSTER_COLUMNS).to_pylist()
    assert got.edges.to_pylist() == arrow.edges.to_pylist()
    assert len(got.clusters) == pc.sum(pc.is_in(clusters["leakage_id"], value_set=wanted)).as_py()


def test_stored_graph_reads_the_components_of_the_arrow_graph(tmp_path: Path) -> None:
    clusters, edges = _graph_tables()
    cas = ContentStore(tmp_path / "cas")
    refs = put_table(cas, clusters), put_table(cas, edges)
    con = view_queries.connect()
    stored = StoredGraph(
        con,
        cas_parquet(cas, refs[0], "clusters", numbered=True),
        cas_parquet(cas, refs[1], "edges", numbered=True),
    )
    _assert_same_graph(stored, clusters, edges)


def test_stored_graph_of_chunk_parts_is_in_record_order(tmp_path: Path) -> None:
    """Clusters parts whose record ids interleave (each part sorted, their concatenation not)
    give the graph of the table stored whole: rows in record order, not in part order."""
    clusters, edges = _graph_tables()
    cas = ContentStore(tmp_path / "cas")
    rows = [[i for i in range(clusters.num_rows) if i % 3 == k] for k in (2, 0, 1)]
    parts = [clusters.take(pa.array(part, pa.int64())) for part in rows]
    entries = [
        ChunkPart(chunk=f"c{n}", records=f"r{n}", count=part.num_rows, **put_table(cas, part))
        for n, part in enumerate(parts)
    ]
    document = ChunkParts(
        schema=CLUSTER_PARTS_SCHEMA, code="test", count=clusters.num_rows, parts=entries
    ).document()
    index = LayerIndex(
        layer="dedup_clusters",
        code="test",
        policy=None,
        inputs=[],
        outputs={"clusters": put_json(cas, document)},
        counts={},
    )
    files = VerifiedFiles(cas)
    relation = view_queries.dedup_clusters(files, index, numbered=True)
    con = view_queries.connect()
    positions = con.sql(f"SELECT line FROM {relation} ORDER BY file_row_number").fetchall()
    assert [line for (line,) in positions] == [i for part in rows for i in part]
    edges_ref = put_table(cas, edges)
    stored = StoredGraph(con, relation, cas_parquet(cas, edges_ref, "edges", numbered=True))
    _assert_same_graph(stored, clusters, edges)
