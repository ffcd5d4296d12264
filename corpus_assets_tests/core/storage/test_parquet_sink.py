"""parquet_sink writes ``artifacts.put_table``'s exact bytes, streamed or through a file."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from corpus_assets.core.storage import parquet_sink
from corpus_assets.core.storage.artifacts import get_table, put_table, put_table_file
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.parquet_sink import TableWriter

SCHEMA = pa.schema([("n", pa.int64()), ("word", pa.string()), ("maybe", pa.string())])


def _batch(rng: np.random.Generator, rows: int) -> pa.RecordBatch:
    words = [f"w{int(k)}" * int(k % 5) for k in rng.integers(0, 40, rows)]
    maybe = [None if k % 3 == 0 else "m" * int(k % 50) for k in rng.integers(0, 99, rows)]
    return pa.RecordBatch.from_pydict(
        {"n": rng.integers(0, 1 << 40, rows), "word": words, "maybe": maybe}, schema=SCHEMA
    )


@pytest.mark.parametrize("group_rows", [1 << 20, 1000, 777])
@pytest.mark.parametrize(
    "sizes", [[], [0], [5], [300] * 10, [1000, 1, 999, 2500], "random"], ids=str
)
def test_streamed_row_groups_have_put_tables_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group_rows: int, sizes: list | str
) -> None:
    """Small row groups (patched into both writers) make the cut between batches matter."""
    rng = np.random.default_rng(len(str(sizes)) + group_rows)
    counts = list(rng.integers(0, 900, 40)) if sizes == "random" else sizes
    batches = [_batch(rng, int(n)) for n in counts]
    monkeypatch.setattr(parquet_sink, "ROW_GROUP_ROWS", group_rows)
    real = pa.parquet.write_table

    def write_table(table: pa.Table, where: object, **options: object) -> None:
        real(table, where, **{**options, "row_group_size": group_rows})

    monkeypatch.setattr(pa.parquet, "write_table", write_table)
    cas = ContentStore(tmp_path)
    want = put_table(cas, pa.Table.from_batches(batches, SCHEMA))
    writer = TableWriter(cas, SCHEMA)
    for batch in batches:
        writer.write(batch)
    assert writer.close() == want
    assert writer.rows == sum(counts)
    whole = pa.Table.from_batches(batches, SCHEMA)
    assert put_table_file(cas, whole, tmp_path / "whole.parquet") == want
    assert get_table(cas, want).num_rows == sum(counts)


def test_options_are_put_tables(tmp_path: Path) -> None:
    """The default options (one row group up to 2^20 rows) give put_table's digest."""
    cas = ContentStore(tmp_path)
    table = pa.Table.from_batches([_batch(np.random.default_rng(1), 5000)], SCHEMA)
    writer = TableWriter(cas, SCHEMA)
    writer.write_table(table)
    assert writer.close() == put_table(cas, table)
    assert not list((tmp_path / "tmp").glob(".tmp-*"))


def test_abort_leaves_nothing(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path)
    writer = TableWriter(cas, SCHEMA)
    writer.write(_batch(np.random.default_rng(2), 10))
    writer.abort()
    assert not list((tmp_path / "tmp").glob(".tmp-*"))
    assert not (tmp_path / "sha256").exists()
