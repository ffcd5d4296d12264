"""A table stored as chunk parts reads as the one table it replaces: rows in part order, their
positions dense from 0 across parts; a table stored whole still reads; a document that is not
a parts document, or whose counts do not add up, is refused by name."""

import duckdb
import pyarrow as pa
import pytest

from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import (
    CLUSTER_PARTS_SCHEMA,
    ChunkPart,
    ChunkParts,
    ManifestError,
)
from corpus_assets.core.storage.artifacts import put_json, put_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import VerifiedFiles, typical_first


def _parts(cas: ContentStore, tables: list[pa.Table], schema: str = CLUSTER_PARTS_SCHEMA) -> dict:
    parts = []
    for n, table in enumerate(tables):
        ref = put_table(cas, table)
        parts.append(ChunkPart(chunk=f"c{n}", records=f"r{n}", count=table.num_rows, **ref))
    count = sum(t.num_rows for t in tables)
    return ChunkParts(schema=schema, code="test", count=count, parts=parts).document()


def _rows(cas: ContentStore, ref: dict) -> list[tuple]:
    table = PartedTable.read(cas, ref, "clusters")
    relation = table.relation(VerifiedFiles(cas), "clusters", numbered=True)
    sql = f"SELECT k.file_row_number, k.id FROM {relation} k ORDER BY 1"
    return duckdb.connect().sql(sql).fetchall()


def test_parts_number_rows_densely_across_parts(tmp_path):
    cas = ContentStore(tmp_path / "cas")
    tables = [pa.table({"id": ["a", "b", "c"]}), pa.table({"id": pa.array([], pa.string())})]
    tables.append(pa.table({"id": ["d", "e"]}))
    ref = put_json(cas, _parts(cas, tables))
    assert _rows(cas, ref) == [(0, "a"), (1, "b"), (2, "c"), (3, "d"), (4, "e")]
    table = PartedTable.read(cas, ref, "clusters")
    assert table.starts() == [0, 3, 3]
    batches = list(table.batches(VerifiedFiles(cas), "clusters", ["id"]))
    assert [v for b in batches for v in b.column(0).to_pylist()] == ["a", "b", "c", "d", "e"]


def test_a_table_stored_whole_reads_as_before(tmp_path):
    cas = ContentStore(tmp_path / "cas")
    ref = put_table(cas, pa.table({"id": ["x", "y"]}))
    assert _rows(cas, ref) == [(0, "x"), (1, "y")]
    assert PartedTable.read(cas, ref, "clusters").counts is None


def test_counts_that_do_not_add_up_are_refused(tmp_path):
    cas = ContentStore(tmp_path / "cas")
    document = _parts(cas, [pa.table({"id": ["a"]})])
    document["count"] = 2
    with pytest.raises(ManifestError, match="parts hold 1 rows, it says 2"):
        PartedTable.read(cas, put_json(cas, document), "dedup clusters")


def test_another_kind_of_document_is_refused(tmp_path):
    cas = ContentStore(tmp_path / "cas")
    document = _parts(cas, [pa.table({"id": ["a"]})], schema="corpus.layer.v1")
    with pytest.raises(ManifestError, match="is not a parts kind"):
        PartedTable.read(cas, put_json(cas, document), "dedup clusters")


def test_the_typical_part_is_listed_first_for_duckdbs_estimate(tmp_path):
    """DuckDB estimates a multi-file scan as the first file's rows times the files: the part
    nearest the mean goes first (positions stay the table's, as the first test shows)."""
    sizes = (189, 6747, 211704, 68706, 0)  # 287k rows: 68706 x 5 is nearest by ratio
    assert typical_first(sizes) == [3, 0, 1, 2, 4]
    assert typical_first((5, 5, 5)) == [0, 1, 2]
    assert typical_first((0, 0)) == [0, 1]
