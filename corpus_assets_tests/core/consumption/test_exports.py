"""Readers people train with, on real shards in a real CAS: MDS export, HF datasets, torch."""

import hashlib
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from corpus_assets.core.consumption.export_mds import (
    MDS_INDEX,
    export_mds,
    load_mds_export,
    materialize_mds,
)
from corpus_assets.core.consumption.exports import ExportError, export_megatron, record_megatron
from corpus_assets.core.consumption.hf_loader import _hf_dataset_of_pack
from corpus_assets.core.consumption.loader_plan import LoaderPlan
from corpus_assets.core.publication.block_reader import (
    BlockReader,
    BlockStream,
    ReaderState,
    ReaderStateError,
    epoch_order,
)
from corpus_assets.core.storage.artifacts import get_json
from corpus_assets.core.storage.cas import ContentStore, CorruptObjectError
from corpus_assets.core.storage.shards import ShardCorruptError
from corpus_assets_tests.core.storage.test_shards import (
    FIELDS,
    T,
    flip,
    identity,
    make_blocks,
    write,
)

BLOCKS = 203


def read_mds(directory: Path) -> dict[str, np.ndarray]:
    """An independent reader of the published MDS v2 layout: index.json, then each shard's
    ``u32`` count, ``u32`` offsets, config JSON and fixed-size samples."""
    index = json.loads((directory / MDS_INDEX).read_text())
    assert index["version"] == 2
    columns: dict[str, list[np.ndarray]] = {}
    for entry in index["shards"]:
        assert (entry["format"], entry["version"], entry["compression"]) == ("mds", 2, None)
        assert entry["zip_data"] is None
        data = (directory / entry["raw_data"]["basename"]).read_bytes()
        assert len(data) == entry["raw_data"]["bytes"] <= entry["size_limit"]
        assert hashlib.sha256(data).hexdigest() == entry["raw_data"]["hashes"]["sha256"]
        count = int(np.frombuffer(data, "<u4", 1)[0])
        assert count == entry["samples"]
        offsets = np.frombuffer(data, "<u4", count + 1, 4)
        config_end = 4 + 4 * (count + 1)
        config = {k: v for k, v in entry.items() if k not in ("raw_data", "samples", "zip_data")}
        assert data[config_end : int(offsets[0])] == json.dumps(config, sort_keys=True).encode()
        assert int(offsets[-1]) == len(data)
        for sample in range(count):
            at = int(offsets[sample])
            for name, encoding, size in zip(
                entry["column_names"], entry["column_encodings"], entry["column_sizes"], strict=True
            ):
                kind, dtype, length = encoding.split(":")
                assert kind == "ndarray" and int(length) * np.dtype(dtype).itemsize == size
                columns.setdefault(name, []).append(np.frombuffer(data, dtype, int(length), at))
                at += size
            assert at == int(offsets[sample + 1])
    return {name: np.stack(rows) for name, rows in columns.items()}


def test_mds_export_follows_the_published_layout_and_holds_the_blocks(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "cas")
    blocks = make_blocks(230)
    _index, ref = write(cas, blocks, [230])
    exported, export_ref = export_mds(
        cas, BlockReader.open(cas, ref["digest"]), ref["digest"], size_limit=20_000
    )
    assert load_mds_export(cas, export_ref["digest"]) == exported
    assert exported.pack_digest == ref["digest"] and exported.blocks == 230
    assert exported.columns == {
        name: f"ndarray:{np.dtype(d).name}:{T}" for name, d in FIELDS.items()
    }
    sample = sum(np.dtype(d).itemsize for d in FIELDS.values()) * T
    for entry in exported.shards[:-1]:  # full shards: one more sample would pass the limit
        assert entry.size <= 20_000 < entry.size + sample + 4
    assert sum(entry.samples for entry in exported.shards) == 230 and len(exported.shards) == 10
    directory = materialize_mds(cas, exported, tmp_path / "mds")
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        f.basename for f in exported.files()
    )
    for entry in exported.files():  # every exported file's digest is recorded
        data = (directory / entry.basename).read_bytes()
        assert "sha256:" + hashlib.sha256(data).hexdigest() == entry.digest
        assert len(data) == entry.size
    read = read_mds(directory)
    assert read.keys() == blocks.keys()
    for name, values in blocks.items():
        assert read[name].dtype == values.dtype
        np.testing.assert_array_equal(read[name], values)
    again_cas = ContentStore(tmp_path / "again")
    _again_index, again_ref = write(again_cas, blocks, [17, 213])
    again, again_export = export_mds(
        again_cas, BlockReader.open(again_cas, again_ref["digest"]), again_ref["digest"], 20_000
    )
    assert (again, again_export) == (exported, export_ref)  # same blocks, same bytes


def test_mds_export_refuses_what_it_cannot_write_and_corrupt_objects(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "cas")
    _index, ref = write(cas, make_blocks(20), [20])
    reader = BlockReader.open(cas, ref["digest"])
    with pytest.raises(ExportError, match="does not fit size_limit 500"):
        export_mds(cas, reader, ref["digest"], size_limit=500)
    with pytest.raises(ExportError, match="size_limit"):
        export_mds(cas, reader, ref["digest"], size_limit=1 << 32)
    exported, _ref = export_mds(cas, reader, ref["digest"], size_limit=4_000)
    flip(cas, exported.shards[1].digest, 40)
    with pytest.raises(CorruptObjectError, match=exported.shards[1].digest):
        materialize_mds(cas, exported, tmp_path / "mds")
    assert not list((tmp_path / "mds").glob(".*.tmp"))  # no half-written file is left


def test_megatron_export_document_records_each_file(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path)
    _index, ref = write(cas, make_blocks(30), [30])
    exported = export_megatron(cas, BlockReader.open(cas, ref["digest"]), 50_000)
    document_ref = record_megatron(cas, exported, ref["digest"])
    document = get_json(cas, document_ref)
    assert (document["pack_digest"], document["sequences"]) == (ref["digest"], 30)
    assert [entry["basename"] for entry in document["files"]] == ["data.bin", "data.idx"]
    for entry in document["files"]:
        data = cas.path(entry["digest"]).read_bytes()
        assert "sha256:" + hashlib.sha256(data).hexdigest() == entry["digest"]
        assert len(data) == entry["size"]
    assert record_megatron(cas, exported, ref["digest"]) == document_ref


def test_hf_dataset_rows_are_the_blocks_and_corruption_surfaces(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path)
    blocks = make_blocks(230)
    index, ref = write(cas, blocks, [230])
    dataset = _hf_dataset_of_pack(cas, ref["digest"])
    assert dataset.n_shards == len(index.shards) == 3
    assert {name: feature.feature.dtype for name, feature in dataset.features.items()} == {
        name: np.dtype(dtype).name for name, dtype in FIELDS.items()
    }
    rows = list(dataset.with_format("numpy"))  # datasets widens integers to int64 here
    reader_rows = list(BlockReader.open(cas, ref["digest"]))
    assert len(rows) == len(reader_rows) == 230
    for row, block in zip(rows, reader_rows, strict=True):
        assert row.keys() == block.keys()
        for name in FIELDS:
            np.testing.assert_array_equal(row[name], block[name])
    tables = list(dataset.with_format("arrow").iter(batch_size=100))
    assert [len(table) for table in tables] == [100, 100, 30]
    for name, dtype in FIELDS.items():  # the Arrow columns keep the shard dtypes exactly
        column = pa.concat_arrays([table.column(name).combine_chunks() for table in tables])
        assert column.type == pa.list_(pa.from_numpy_dtype(np.dtype(dtype)), T)
        values = column.flatten().to_numpy().reshape(-1, T)
        assert values.dtype == blocks[name].dtype
        np.testing.assert_array_equal(values, blocks[name])
    shard = index.shards[1]
    flip(cas, shard.digest, 5 * 4096 + 17)
    with pytest.raises(ShardCorruptError, match=rf"shard {shard.digest} chunk 5 "):
        list(_hf_dataset_of_pack(cas, ref["digest"]))
    assert len(list(_hf_dataset_of_pack(cas, ref["digest"], verify=False))) == 230


def lockstep(plans: list[LoaderPlan], workers: int, limit: int | None = None) -> list[np.ndarray]:
    """Positions each rank takes, step by step; each rank's DataLoader takes its workers' batches
    round-robin. Stops after ``limit`` steps (every rank one batch per step, while it has one)."""
    per_rank = []
    for plan in plans:
        queues = [list(plan.worker_batches(w, workers)) for w in range(max(workers, 1))]
        per_rank.append(
            [queues[j % len(queues)][j // len(queues)] for j in range(sum(map(len, queues)))]
        )
    steps = max(map(len, per_rank)) if limit is None else limit
    return [rank[step] for step in range(steps) for rank in per_rank if step < len(rank)]


def layout(cas: ContentStore, state: ReaderState, world: int, batch: int) -> list[LoaderPlan]:
    return [LoaderPlan(cas.root, state, rank, world, batch) for rank in range(world)]


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_plan_resumes_under_another_layout_without_duplicates_or_gaps(
    tmp_path: Path, world: int, workers: int
) -> None:
    cas = ContentStore(tmp_path)
    _index, ref = write(cas, make_blocks(BLOCKS), [BLOCKS])
    start = identity(ref["digest"])
    order = epoch_order(BLOCKS, start.seed, 0).tolist()
    one_by_one = layout(cas, start, world, 1)  # batch of 1 block: exactly BlockStream's rule
    stream = BlockStream(BlockReader.open(cas, ref["digest"]), start)
    for plan in one_by_one:
        for worker in range(max(workers, 1)):
            served = np.concatenate(plan.worker_batches(worker, workers) or [np.empty(0, int)])
            expected = stream.block_numbers(plan.rank, world, worker, workers)
            assert np.asarray(order)[served].tolist() == expected.tolist()
    chooser = random.Random(world * 10 + workers)
    for batch in (1, 3):
        for _trial in range(3):
            first = layout(cas, start, world, batch)
            steps = chooser.randrange(1, -(-BLOCKS // (batch * world)))
            head = np.concatenate(lockstep(first, workers, steps)).tolist()
            saved = first[0].state_after(steps).state_dict()
            assert head and sorted(head) == list(range(saved["blocks_consumed"]))  # a prefix
            other = layout(cas, start, chooser.choice([1, 2, 4]), chooser.choice([1, 2, 5]))
            for plan in other:
                plan.load_state_dict(saved)
            tail = np.concatenate(lockstep(other, chooser.choice([0, 1, 2]))).tolist()
            assert sorted(head + tail) == list(range(BLOCKS))  # 0 duplicates, 0 gaps
            assert [order[p] for p in sorted(head + tail)] == order  # the uninterrupted stream
            if batch == 1 and len(other) == 1:  # in taken order too, batch by batch
                assert [order[p] for p in head + tail] == order
    end = layout(cas, start, world, 1)[0].state_after(BLOCKS)
    assert (end.epoch, end.blocks_consumed) == (1, 0)


def test_plan_reads_verified_blocks_and_refuses_a_foreign_state_before_reading(
    tmp_path: Path,
) -> None:
    cas = ContentStore(tmp_path)
    blocks = make_blocks(40)
    index, ref = write(cas, blocks, [40])
    plan = LoaderPlan(cas.root, identity(ref["digest"]), rank=1, world_size=2, batch_blocks=3)
    with plan.open_reader() as reader:
        served = list(plan.batches(reader, worker=1, num_workers=2))
    order = epoch_order(40, 7, 0)
    assert [numbers.tolist() for numbers, _ in served] == [
        order[positions].tolist() for positions in plan.worker_batches(1, 2)
    ]
    for numbers, fields in served:
        for name in FIELDS:
            np.testing.assert_array_equal(fields[name], blocks[name][numbers])
    for entry in index.shards:  # no shard left: a refusal must come before any read
        cas.path(entry.digest).unlink()
    saved = plan.state_after(2).state_dict()
    assert saved["blocks_consumed"] == 12
    for name, value in [("pack_digest", "sha256:" + "5" * 64), ("seed", 8), ("shuffle", False)]:
        with pytest.raises(ReaderStateError, match=name):
            plan.load_state_dict({**saved, name: value})
    assert plan.load_state_dict(saved).blocks_consumed == 12


def test_readers_do_not_import_torch_or_datasets_until_used() -> None:
    modules = ["export_mds", "hf_loader", "loader_plan", "torch_dataset"]
    code = "; ".join(f"import corpus_assets.core.consumption.{m}" for m in modules)
    code += "; import sys; print(sorted({'torch', 'datasets'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


TORCH_WHEEL = "/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def test_torch_dataloader_with_workers_serves_the_plan_and_resumes(tmp_path: Path) -> None:
    if not Path(TORCH_WHEEL).exists():
        pytest.skip(f"no CPU torch wheel at {TORCH_WHEEL}: `make` installs the torch group from it")
    import torch  # where the wheel is, `make` installed it: a missing torch is a failure
    from torch.utils.data import DataLoader

    from corpus_assets.core.consumption.torch_dataset import _torch_dataset_of_pack

    cas = ContentStore(tmp_path)
    blocks = make_blocks(BLOCKS)
    _index, ref = write(cas, blocks, [BLOCKS])
    start = identity(ref["digest"])
    dataset = _torch_dataset_of_pack(cas.root, start, rank=1, world_size=2, batch_blocks=3)
    assert isinstance(dataset, torch.utils.data.IterableDataset)
    got = list(DataLoader(dataset, batch_size=None, num_workers=2))
    want = lockstep([LoaderPlan(cas.root, start, 1, 2, 3)], 2)
    order = epoch_order(BLOCKS, start.seed, 0)
    assert [batch["block_numbers"].tolist() for batch in got] == [order[p].tolist() for p in want]
    for batch in got:
        for name in FIELDS:
            assert batch[name].numpy().dtype == blocks[name].dtype
            np.testing.assert_array_equal(batch[name].numpy(), blocks[name][batch["block_numbers"]])
    saved = dataset.state_dict(steps=10)
    assert set(saved) == set(ReaderState.model_fields) and saved["blocks_consumed"] == 60
    resumed = _torch_dataset_of_pack(cas.root, start, rank=0, world_size=1, batch_blocks=4)
    with pytest.raises(ReaderStateError, match="mix_digest"):
        resumed.load_state_dict({**saved, "mix_digest": "sha256:" + "9" * 64})
    resumed.load_state_dict(saved)
    tail = [b["block_numbers"] for b in DataLoader(resumed, batch_size=None, num_workers=2)]
    assert torch.cat(tail).tolist() == order[60:].tolist()
