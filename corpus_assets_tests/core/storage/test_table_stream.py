"""A table streamed a row group at a time has the bytes of the same table written at once."""

import io
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.storage.artifacts import PINNED_PARQUET, put_table, table_bytes
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.parquet_sink import put_table_batches, write_table_batches

PARQUET_OPTIONS = {k: v for k, v in PINNED_PARQUET.items() if k != "row_group_size"}

SCHEMA = pa.schema(
    [("id", pa.string()), ("n", pa.int64()), ("j", pa.float64()), ("flag", pa.bool_())]
)


def _table(rows: int, seed: int = 1) -> pa.Table:
    rng = random.Random(seed)
    return pa.table(
        {
            "id": [f"src/{rng.randrange(10**12):x}" * rng.randrange(1, 4) for _ in range(rows)],
            "n": [rng.randrange(50) for _ in range(rows)],
            "j": [None if rng.random() < 0.5 else rng.random() for _ in range(rows)],
            "flag": [rng.random() < 0.3 for _ in range(rows)],
        },
        schema=SCHEMA,
    )


def _ragged(table: pa.Table, seed: int = 2) -> list[pa.RecordBatch]:
    """The table cut into batches of irregular sizes (one of them empty)."""
    rng, out, at = random.Random(seed), [], 0
    while at < table.num_rows:
        size = rng.choice([0, 1, 333, 1000, 2500])
        out += table.slice(at, size).to_batches() or [pa.RecordBatch.from_pylist([], SCHEMA)]
        at += size
    return out


def test_streamed_table_has_put_tables_digest(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "cas")
    table = _table(9000)
    streamed = put_table_batches(cas, SCHEMA, _ragged(table), tmp_path / "tmp")
    assert streamed == put_table(cas, table)
    empty = put_table_batches(cas, SCHEMA, [], tmp_path / "tmp")
    assert empty == put_table(cas, SCHEMA.empty_table())


def test_several_row_groups_of_several_chunks_match_one_write(tmp_path: Path) -> None:
    table = _table(11000, seed=3)
    path = tmp_path / "t.parquet"
    write_table_batches(path, SCHEMA, _ragged(table, seed=4), row_group_rows=4096, step=1024)
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=4096, **PARQUET_OPTIONS)
    assert path.read_bytes() == sink.getvalue()
    assert pq.ParquetFile(path).metadata.num_row_groups == 3


def test_the_options_are_table_bytes_options() -> None:
    table = _table(500, seed=5)
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=1 << 20, **PARQUET_OPTIONS)
    assert sink.getvalue() == table_bytes(table)
