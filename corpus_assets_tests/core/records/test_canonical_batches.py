"""canonical_records holds an object's kept records a bounded batch at a time; the batch
bounds must not change a byte of any chunk output (records, exclusions and their order)."""

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.governance import alias_gate, benchmarks
from corpus_assets.core.pipeline import BUILDERS
from corpus_assets.core.records import kept
from corpus_assets.core.records.canonical_records import _rows as raw_rows
from corpus_assets.core.records.canonical_records import canonical_tables
from corpus_assets.core.records.canonicalize import Stages
from corpus_assets.core.records.index import ChunkDescriptor
from corpus_assets.core.records.normalize import dedup_key
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.artifacts import put_table
from corpus_assets_tests.conftest import use_demo_copy

QUESTION = (
    "Which river flows through the quiet harbor past the velvet meadow where the patient "
    "lantern keeper counts each ember of the orbit every careful evening?"
)


def _leaky_essays(home: Path) -> None:
    """A contaminated document between valid ones, then a parse error after it."""
    filler = " ".join(["Filler words about many unrelated things."] * 300)
    rows = [
        json.dumps({"id": "before", "text": "A clean essay about rivers and their harbours."}),
        json.dumps({"id": "leak", "text": f"{filler} {QUESTION} {filler}"}),
        json.dumps({"id": "after", "text": "Another clean essay, about meadows this time."}),
        "{not json",
        json.dumps({"id": "last", "text": "The last clean essay, about lanterns at dusk."}),
    ]
    essays = home / "demo-sources" / "essays" / "essays-00001.jsonl"
    with essays.open("a") as handle:
        handle.write("\n".join(rows) + "\n")


def _build(home: Path) -> tuple[list[str], list[str]]:
    """Chunk output digests and the essays object's exclusion reasons, in stored order."""
    with open_workspace() as ws:
        item = benchmarks.BenchmarkItem(
            "quiz/7", ws.cas.put_bytes(QUESTION.encode()), dedup_key(QUESTION)
        )
        alias_gate.read_alias_gate(ws.catalog, "demo")
        benchmarks.add_benchmark_items(ws.catalog, "quiz", [item])
        BUILDERS["raw_snapshot"](ws, "p1")
        result = BUILDERS["canonical_records"](ws, "p1")
        index = json.loads(ws.cas.get_bytes(result.digest))
        chunks = index["outputs"]["chunks"]
        reasons = []
        for chunk in chunks:
            if "essays-00001" in chunk["chunk"]:
                descriptor = json.loads(ws.cas.get_bytes(chunk["output"]["digest"]))
                data = ws.cas.get_bytes(descriptor["excluded"]["digest"])
                reasons = pq.read_table(pa.BufferReader(data)).column("reason").to_pylist()
    return [c["output"]["digest"] for c in chunks], reasons


@pytest.mark.parametrize(("rows", "chars"), [(1, 1 << 20), (2, 1 << 20), (4096, 1)])
def test_batch_bounds_change_no_byte(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int, chars: int
) -> None:
    _leaky_essays(demo_home)
    use_demo_copy(demo_home, tmp_path / "whole", 1, monkeypatch)
    whole, reasons = _build(tmp_path / "whole")
    assert reasons[-1] == "contamination.benchmark"  # after the later parse error
    assert "parse.invalid_json" in reasons
    monkeypatch.setattr(kept, "BATCH_ROWS", rows)
    monkeypatch.setattr(kept, "BATCH_CHARS", chars)
    use_demo_copy(demo_home, tmp_path / "batched", 1, monkeypatch)
    assert _build(tmp_path / "batched") == (whole, reasons)


def _essays_groups(home: Path) -> list[int]:
    """Rows per row group of the essays object's records, piece after piece."""
    with open_workspace() as ws:
        chunks = json.loads(ws.cas.get_bytes(ws.catalog.layer_output("p1", "canonical_records")))
        for chunk in chunks["outputs"]["chunks"]:
            if "essays-00001" in chunk["chunk"]:
                descriptor = json.loads(ws.cas.get_bytes(chunk["output"]["digest"]))
                groups = []
                for piece in descriptor["pieces"]:
                    meta = pq.ParquetFile(ws.cas.path(piece["records"]["digest"])).metadata
                    groups += [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
                return groups
    raise AssertionError("no essays chunk")


@pytest.mark.parametrize(("rows", "chars"), [(1, 1 << 20), (3, 1)])
def test_records_leave_by_row_groups_whatever_the_batches(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int, chars: int
) -> None:
    """Small group bounds cut the essays' records file into several row groups, a group
    written as it fills; the batch bounds move none of them (the same chunk bytes)."""
    _leaky_essays(demo_home)
    monkeypatch.setattr(kept, "ROW_GROUP_ROWS", 6)
    monkeypatch.setattr(kept, "GROUP_BYTES", 1500)
    use_demo_copy(demo_home, tmp_path / "whole", 1, monkeypatch)
    whole = _build(tmp_path / "whole")
    groups = _essays_groups(tmp_path / "whole")
    assert len(groups) > 1 and any(n < 6 for n in groups[:-1])  # by rows and by bytes
    monkeypatch.setattr(kept, "BATCH_ROWS", rows)
    monkeypatch.setattr(kept, "BATCH_CHARS", chars)
    use_demo_copy(demo_home, tmp_path / "batched", 1, monkeypatch)
    assert _build(tmp_path / "batched") == whole
    assert _essays_groups(tmp_path / "batched") == groups


def test_streamed_tables_are_the_whole_tables_bytes(demo_home: Path) -> None:
    """An object of more exclusions and kept rows than one row group: the layer writes both
    tables a group at a time, and each file is ``put_table`` of the table held whole (the
    canary's path) - several row groups, the same bytes."""
    lines = [json.dumps({"id": f"k{n}", "text": f"Kept essay number {n}."}) for n in range(70_000)]
    lines += ['{"id": "broken' for _ in range(66_000)]  # malformed: one exclusion each
    essays = demo_home / "demo-sources" / "essays" / "essays-00002.jsonl"
    essays.write_text("\n".join(lines) + "\n")
    with open_workspace() as ws:
        BUILDERS["raw_snapshot"](ws, "p1")
        index = json.loads(ws.cas.get_bytes(BUILDERS["canonical_records"](ws, "p1").digest))
        chunk = next(c for c in index["outputs"]["chunks"] if "essays-00002" in c["chunk"])
        stored = ChunkDescriptor.model_validate(
            json.loads(ws.cas.get_bytes(chunk["output"]["digest"]))
        )
        raw = json.loads(ws.cas.get_bytes(ws.catalog.layer_output("p1", "raw_snapshot")))
        item = next(
            o for o in raw["outputs"]["objects"] if o["name"].endswith("essays-00002.jsonl")
        )
        source = next(s for s in ws.config.sources if s.id == item["source"])
        whole = canonical_tables(ws, source, item, Stages.for_config(ws.config, None))
        (piece,) = stored.parts()
        for table, ref in ((whole.records, piece.records), (whole.excluded, stored.excluded)):
            assert pq.ParquetFile(ws.cas.path(ref["digest"])).metadata.num_row_groups == 2
            assert put_table(ws.cas, table)["digest"] == ref["digest"]


def test_a_parquet_object_is_read_without_holding_its_row_groups(demo_home: Path) -> None:
    """A Parquet raw object as other tools write it (here 16 row groups of 8 long documents,
    32 MB of text): its rows are read in batches of about 1 MiB, holding about one row group of
    Arrow memory. Before, Arrow's pre-buffering kept every group read until the file closed, and
    4,096-row batches took the whole file at once: a worker's peak grew with the file."""
    letters = bytes.maketrans(bytes(range(256)), bytes(97 + n % 26 for n in range(256)))
    texts = [random.Random(n).randbytes(1 << 18).translate(letters).decode() for n in range(128)]
    table = pa.table({"id": [f"p{n}" for n in range(128)], "text": texts})
    pq.write_table(table, demo_home / "demo-sources" / "essays" / "big.parquet", row_group_size=8)
    with open_workspace() as ws:
        BUILDERS["raw_snapshot"](ws, "p1")
        raw = json.loads(ws.cas.get_bytes(ws.catalog.layer_output("p1", "raw_snapshot")))
        item = next(o for o in raw["outputs"]["objects"] if o["name"].endswith("big.parquet"))
        before, held, rows = pa.total_allocated_bytes(), 0, 0
        for _ in raw_rows(ws, item, "big.parquet"):
            held = max(held, pa.total_allocated_bytes() - before)
            rows += 1
    assert rows == 128 and item["format"] == "parquet"
    assert held < 12 << 20, held  # one group is 2 MB of text, the file 32 MB
