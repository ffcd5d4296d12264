"""The runner's record codes (a sample sort by tasks) order and equal like the coding sorts'."""

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from corpus_assets.core.dedup.code_tasks import (
    PARTITION_VALUES,
    merge_partitions,
    runner_codes,
    splitters,
)
from corpus_assets.core.dedup.partition_db import PartitionDb
from corpus_assets.core.records.index import RECORD_COLUMNS, ChunkRecords
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import put_table

# byte order differs from naive orders here: accents, CJK, astral code points, prefixes
_ALPHABET = ["a", "b", "ab", "B", "é", "e\u0301", "日本", "\U0001f600", "z", "a/b", ""]


def _value(rng: random.Random) -> str:
    return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 3)))


def _records(rng: random.Random, n: int) -> pa.Table:
    """Ids that repeat (across chunks too), group ids that are null, the record's own id,
    another record's id or a new value, dedup keys that repeat."""
    ids = [_value(rng) for _ in range(n)]
    groups: list[str | None] = []
    for i in range(n):
        pick = rng.random()
        groups.append(
            None
            if pick < 0.15
            else ids[i]
            if pick < 0.6
            else rng.choice(ids)
            if pick < 0.8
            else "g" + _value(rng)
        )
    columns = {field.name: pa.nulls(n, field.type) for field in RECORD_COLUMNS}
    columns |= {
        "record_id": pa.array(ids, pa.string()),
        "group_id": pa.array(groups, pa.string()),
        "dedup_key": pa.array([f"sha256:{rng.randrange(n // 3 + 1):04x}" for _ in range(n)]),
        "source_id": pa.array(["s"] * n),
        "kind": pa.array(["document"] * n),
        "object": pa.array([f"o{i // 50}" for i in range(n)]),
        "line": pa.array(range(n), pa.int64()),
        "text": pa.array(["t"] * n),
    }
    return pa.table(columns, schema=RECORD_COLUMNS)


def _chunks(ws: Workspace, table: pa.Table, sizes: list[int]) -> list[ChunkRecords]:
    chunks, start = [], 0
    for n, size in enumerate(sizes):
        ref = put_table(ws.cas, table.slice(start, size))
        chunks.append(ChunkRecords(f"s/chunk-{n}", ref, size))
        start += size
    return chunks


def _ranks(values: np.ndarray) -> np.ndarray:
    """Each value's dense rank: two codings agree on order and equality iff these are equal."""
    return np.unique(values, return_inverse=True)[1]


@pytest.mark.parametrize("partitions", [None, 1, 3, 7])
def test_runner_codes_order_and_equal_as_the_coding_sorts(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partitions: int | None
) -> None:
    if partitions is None:
        monkeypatch.delenv("CORPUS_CODE_PARTITIONS", raising=False)
    else:
        monkeypatch.setenv("CORPUS_CODE_PARTITIONS", str(partitions))
    rng = random.Random(7)
    table = _records(rng, 600)
    ws = open_workspace()
    try:
        chunks = _chunks(ws, table, [250, 0, 1, 149, 200])  # an empty chunk too
        work = Counter[str]()
        ids, keys, groups = runner_codes(ws, chunks, tmp_path, work)
    finally:
        ws.close()
    with PartitionDb.from_table(
        table.drop_columns(["text"]).append_column("length", pa.array(np.ones(600, np.int64)))
    ) as db:
        expected = db.codes()
    n = table.num_rows
    # record ids and group ids are ranked together: a group id equal to a record id shares its code
    both = np.concatenate([ids.codes, groups.codes])
    want = np.concatenate([expected.record_id.codes, expected.group_id.codes])
    assert _ranks(both).tolist() == _ranks(want).tolist()
    assert _ranks(keys.codes).tolist() == _ranks(expected.dedup_key.codes).tolist()
    assert len(ids.codes) == len(keys.codes) == len(groups.codes) == n
    assert work["code_run_tasks"] == len(chunks)
    assert work["code_merge_tasks"] == 2 * (partitions or 1)  # ids and keys
    assert not list(tmp_path.glob("run-*")) and not list(tmp_path.glob("merged-*"))
    assert len(list(tmp_path.glob("names-*.arrow"))) == len(chunks)  # for the gather tasks


def test_splitters_cut_at_distinct_sample_quantiles() -> None:
    samples = ["d", "a", "c", "b", "b", "e", "f", "g"]
    assert splitters(samples, 1) == []
    assert splitters(samples, 3) == ["c", "e"]  # of a..g at 7/3 and 14/3
    assert splitters(["x"] * 9, 4) == ["x"]  # one distinct sample: two partitions
    assert splitters([], 4) == []


def test_merge_partitions_follow_the_values_and_the_task_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CORPUS_CODE_PARTITIONS", raising=False)
    big = 1 << 40
    assert merge_partitions(0, 0, big) == 1
    assert merge_partitions(PARTITION_VALUES, 0, big) == 1
    assert merge_partitions(PARTITION_VALUES + 1, 0, big) == 2
    # 1M values of 80 bytes: ~267 MB held in a task's copies -> four tasks under 64 MB each
    assert merge_partitions(1_000_000, 80_000_000, 64 << 20) == 4
    assert merge_partitions(1_000_000, 80_000_000, 1 << 30) == 4  # by the value count
    assert merge_partitions(100_000, 800_000_000, 256 << 20) == 9  # long values: by bytes
    monkeypatch.setenv("CORPUS_CODE_PARTITIONS", "5")
    assert merge_partitions(10, 10, big) == 5
