"""Block shards in a real CAS: layout, determinism, chunk verification, resume order, Megatron."""

import hashlib
import random
import struct
from pathlib import Path

import blake3
import numpy as np
import pytest

from corpus_assets.core.consumption.exports import ExportError, export_megatron
from corpus_assets.core.publication.block_reader import (
    BlockReader,
    BlockStream,
    ReaderState,
    ReaderStateError,
    assigned_positions,
    load_state,
)
from corpus_assets.core.storage.artifacts import put_json
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.shard_reader import verify_shards
from corpus_assets.core.storage.shards import (
    ShardCorruptError,
    ShardError,
    ShardWriter,
    load_index,
    write_shards,
)
from corpus_assets.core.training_view.packing.blocks import (
    FileSamples,
    build_batch,
    iter_block_batches,
)
from corpus_assets.core.training_view.packing.plan import plan_packing

T = 64
FIELDS = {"input_ids": "uint32", "segment_ids": "int32", "positions": "int32", "label_mask": "u1"}
BLOCK_BYTES = T * (4 + 4 + 4 + 1)


def make_blocks(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(0, 50_000, (count, T), dtype=np.uint32),
        "segment_ids": rng.integers(0, 9, (count, T), dtype=np.int32),
        "positions": np.tile(np.arange(T, dtype=np.int32), (count, 1)),
        "label_mask": rng.integers(0, 2, (count, T), dtype=np.uint8),
    }


def split(blocks: dict[str, np.ndarray], sizes: list[int]) -> list[dict[str, np.ndarray]]:
    batches, start = [], 0
    for size in sizes:
        batches.append({name: values[start : start + size] for name, values in blocks.items()})
        start += size
    return batches


def write(cas: ContentStore, blocks: dict[str, np.ndarray], sizes: list[int], **options):
    options.setdefault("shard_bytes", 100 * BLOCK_BYTES)
    options.setdefault("chunk_bytes", 4096)
    return write_shards(cas, split(blocks, sizes), T, FIELDS, **options)


def test_layout_is_memmappable_and_independent_of_batch_boundaries(tmp_path: Path) -> None:
    blocks = make_blocks(250)
    index, ref = write(ContentStore(tmp_path / "a"), blocks, [250])
    again, ref_again = write(ContentStore(tmp_path / "b"), blocks, [1, 99, 7, 120, 23])
    assert ref == ref_again and index == again
    assert [entry.blocks for entry in index.shards] == [100, 100, 50]
    assert [entry.first_block for entry in index.shards] == [0, 100, 200]
    cas = ContentStore(tmp_path / "a")
    assert load_index(cas, ref["digest"]) == index
    last = index.shards[2]
    path = cas.path(last.digest)
    assert "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest() == last.digest
    chunks = [path.read_bytes()[i : i + 4096] for i in range(0, last.size, 4096)]
    assert list(last.chunk_digests) == ["blake3:" + blake3.blake3(c).hexdigest() for c in chunks]
    assert index.format == "corpus-assets.block-shards/2" and index.chunk_hash == "blake3"
    offset = 0  # the documented layout: each field's (blocks, T) array, back to back
    for name, dtype in FIELDS.items():
        mapped = np.memmap(path, dtype=np.dtype(dtype), mode="r", offset=offset, shape=(50, T))
        np.testing.assert_array_equal(mapped, blocks[name][200:])
        offset += mapped.nbytes
    assert offset == last.size


def test_reader_iterates_and_reads_at_random(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path)
    blocks = make_blocks(230)
    _index, ref = write(cas, blocks, [230])
    reader = BlockReader.open(cas, ref["digest"])
    read = list(reader)
    assert len(read) == len(reader) == 230
    for number in (0, 99, 100, 229, 57):
        for name in FIELDS:
            np.testing.assert_array_equal(read[number][name], blocks[name][number])
            np.testing.assert_array_equal(reader.block(number)[name], blocks[name][number])
    with pytest.raises(IndexError):
        reader.block(230)
    one_mapped = BlockReader(cas, load_index(cas, ref["digest"]), max_mapped=1)
    for number in (5, 150, 220, 6, 151):  # shards unmapped and mapped again
        np.testing.assert_array_equal(
            one_mapped.block(number)["segment_ids"], read[number]["segment_ids"]
        )
    assert len(one_mapped._mapped) == 1 and len(one_mapped._verified) == 3


def test_writer_refuses_values_that_do_not_fit(tmp_path: Path) -> None:
    blocks = make_blocks(3)
    blocks["label_mask"] = blocks["label_mask"].astype(np.int64) + 300
    with pytest.raises(ShardError, match="label_mask"):
        write(ContentStore(tmp_path), blocks, [3])


def test_a_flipped_byte_names_the_shard_and_chunk(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path)
    index, ref = write(cas, make_blocks(250), [250])
    assert verify_shards(cas, index) == 3
    shard = index.shards[1]
    path = cas.path(shard.digest)
    data = bytearray(path.read_bytes())
    where = 5 * 4096 + 17
    data[where] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    reader = BlockReader.open(cas, ref["digest"])
    reader.block(100)  # chunk 0 of that shard is intact and reads fine
    row = where // (T * 4)  # the byte lies in input_ids of this row of the shard
    with pytest.raises(ShardCorruptError, match=rf"shard {shard.digest} chunk 5 ") as caught:
        reader.block(100 + row)
    assert (caught.value.shard, caught.value.chunk) == (shard.digest, 5)
    for threads in (1, 2):  # one thread, and a read's chunks hashed in parallel
        with (
            BlockReader(cas, index, threads=threads, max_mapped=1) as every,
            pytest.raises(ShardCorruptError, match="chunk 5 "),
        ):
            list(every)
    with pytest.raises(ShardCorruptError, match=shard.digest):
        verify_shards(cas, index)
    unverified = BlockReader.open(cas, ref["digest"], verify=False)
    assert len(list(unverified)) == 250  # the baseline does not look


def flip(cas: ContentStore, digest: str, where: int) -> None:
    path = cas.path(digest)
    data = bytearray(path.read_bytes())
    data[where] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))


def test_verify_ahead_raises_at_the_corrupt_block_never_before_or_after(tmp_path: Path) -> None:
    """Chunks hashed ahead on threads: blocks before the corrupt chunk are all handed out
    intact, the corrupt one never is, and the error names its shard and chunk."""
    cas = ContentStore(tmp_path)
    blocks = make_blocks(250)
    index, _ref = write(cas, blocks, [250])
    shard = index.shards[2]  # blocks 200..249; byte in input_ids row 30 of that shard
    flip(cas, shard.digest, 30 * T * 4 + 5)
    corrupt_chunk = (30 * T * 4) // 4096
    numbers = [7, 120, 3, 199, 201, 150, 230, 249, 0]
    with BlockReader(cas, index, threads=2) as reader:
        served = []
        with pytest.raises(ShardCorruptError, match=rf"chunk {corrupt_chunk} ") as caught:
            for number, fields in reader.blocks(numbers, ahead=4):
                np.testing.assert_array_equal(fields["input_ids"], blocks["input_ids"][number])
                served.append(number)
        assert served == numbers[: numbers.index(230)]  # 201 shares no chunk with row 30
        assert (caught.value.shard, caught.value.chunk) == (shard.digest, corrupt_chunk)
    with BlockReader(cas, index, threads=2) as reader:
        seen = []
        with pytest.raises(ShardCorruptError, match=rf"{shard.digest} chunk {corrupt_chunk} "):
            for batch in reader.batches():  # shard 2 is hashed ahead while shard 1 is served
                seen.append(batch["input_ids"].copy())
        np.testing.assert_array_equal(np.concatenate(seen), blocks["input_ids"][:200])


def test_a_v1_index_with_sha256_chunks_still_reads(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path)
    blocks = make_blocks(120)
    index, _ref = write(cas, blocks, [120], chunk_hash="sha256")
    assert index.shards[0].chunk_digests[0].startswith("sha256:")
    old = index.model_dump(mode="json")
    old["format"] = "corpus-assets.block-shards/1"
    del old["chunk_hash"]
    v1 = load_index(cas, put_json(cas, old)["digest"])
    assert v1.chunk_hash == "sha256"
    np.testing.assert_array_equal(
        np.stack([b["input_ids"] for b in BlockReader(cas, v1)]), blocks["input_ids"]
    )
    with pytest.raises(ValueError, match="chunks are sha256"):
        load_index(cas, put_json(cas, {**old, "chunk_hash": "blake3"})["digest"])
    flip(cas, index.shards[1].digest, 3)
    with pytest.raises(ShardCorruptError, match="chunk 0 "):
        BlockReader(cas, v1).block(100)


def identity(pack_digest: str) -> ReaderState:
    return ReaderState(
        snapshot_id="sha256:" + "1" * 64,
        pack_digest=pack_digest,
        mix_digest="sha256:" + "2" * 64,
        tokenizer_digest="sha256:" + "3" * 64,
        seed=7,
    )


def consume(stream: BlockStream, world: int, workers: int, limit: int) -> list[int]:
    """Lockstep trainer: each position's rank takes its next block from that round's worker."""
    iterators = {
        (rank, worker): iter(stream.block_numbers(rank, world, worker, workers))
        for rank in range(world)
        for worker in range(max(workers, 1))
    }
    taken = []
    for position in range(stream.state.blocks_consumed, stream.state.blocks_consumed + limit):
        rank, round_ = position % world, position // world
        taken.append(int(next(iterators[(rank, round_ % max(workers, 1))])))
    return taken


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_resume_under_another_layout_gives_the_uninterrupted_stream(
    tmp_path: Path, world: int, workers: int
) -> None:
    cas = ContentStore(tmp_path)
    _index, ref = write(cas, make_blocks(203), [203])
    reader = BlockReader.open(cas, ref["digest"])
    start = identity(ref["digest"])
    whole = BlockStream(reader, start)
    expected = [int(b) for b in whole.order]
    assert sorted(expected) == list(range(203)) and expected != list(range(203))
    chooser = random.Random(world * 10 + workers)
    for _trial in range(3):
        stop = chooser.randrange(1, 203)
        first = BlockStream(reader, start)
        head = consume(first, world, workers, stop)
        saved = first.state_after(stop).state_dict()
        other_world, other_workers = chooser.choice([1, 2, 4]), chooser.choice([0, 1, 2])
        resumed = BlockStream(reader, load_state(saved, start, len(reader)))
        tail = consume(resumed, other_world, other_workers, 203 - stop)
        assert head + tail == expected
        served = np.concatenate(  # every remaining position served once: 0 duplicates, 0 gaps
            [
                assigned_positions(203, stop, rank, other_world, worker, other_workers)
                for rank in range(other_world)
                for worker in range(max(other_workers, 1))
            ]
        )
        assert sorted(served.tolist()) == list(range(stop, 203))
    end = BlockStream(reader, start).state_after(203)
    assert (end.epoch, end.blocks_consumed) == (1, 0)
    assert BlockStream(reader, end).order.tolist() != expected


def test_load_state_refuses_a_mismatch_naming_the_field(tmp_path: Path) -> None:
    expected = identity("sha256:" + "4" * 64)
    saved = expected.model_copy(update={"blocks_consumed": 5}).state_dict()
    assert load_state(saved, expected, 10).blocks_consumed == 5
    for name, value in [
        ("pack_digest", "sha256:" + "5" * 64),
        ("mix_digest", "sha256:" + "6" * 64),
        ("tokenizer_digest", "sha256:" + "7" * 64),
        ("snapshot_id", "sha256:" + "8" * 64),
        ("seed", 8),
    ]:
        with pytest.raises(ReaderStateError, match=rf"{name}: expected .*, got {value!r}"):
            load_state({**saved, name: value}, expected, 10)
    with pytest.raises(ReaderStateError, match="blocks_consumed"):
        load_state({**saved, "blocks_consumed": 11}, expected, 10)


def read_megatron(idx: bytes, data: bytes) -> list[np.ndarray]:
    """An independent reader of the documented MMIDIDX v1 layout."""
    assert idx[:9] == b"MMIDIDX\x00\x00"
    version, code, sequences, documents = struct.unpack("<QBQQ", idx[9:34])
    assert version == 1
    dtype = {4: np.dtype("<i4"), 8: np.dtype("<u2")}[code]
    lengths = np.frombuffer(idx, "<i4", sequences, 34)
    pointers = np.frombuffer(idx, "<i8", sequences, 34 + 4 * sequences)
    docs = np.frombuffer(idx, "<i8", documents, 34 + 12 * sequences)
    assert len(idx) == 34 + 12 * sequences + 8 * documents
    assert docs.tolist() == list(range(sequences + 1))
    return [
        np.frombuffer(data, dtype, int(length), int(pointer))
        for length, pointer in zip(lengths, pointers, strict=True)
    ]


@pytest.mark.parametrize("vocab", [50_000, 100_000])
def test_megatron_export_reads_back(tmp_path: Path, vocab: int) -> None:
    cas = ContentStore(tmp_path)
    blocks = make_blocks(230)
    _index, ref = write(cas, blocks, [230])
    exported = export_megatron(cas, BlockReader.open(cas, ref["digest"]), vocab)
    assert exported.dtype == ("<u2" if vocab < 65500 else "<i4")
    sequences = read_megatron(
        cas.get_bytes(exported.idx["digest"]), cas.get_bytes(exported.bin["digest"])
    )
    assert len(sequences) == exported.sequences == 230
    np.testing.assert_array_equal(np.stack(sequences), blocks["input_ids"])
    again = export_megatron(cas, BlockReader.open(cas, ref["digest"]), vocab)
    assert again == exported
    with pytest.raises(ExportError, match="vocab size 1000"):
        export_megatron(cas, BlockReader.open(cas, ref["digest"]), 1000)


def test_packed_blocks_from_file_samples_round_trip_through_shards(tmp_path: Path) -> None:
    """Pack from a token .npy read by FileSamples (pread, no mapping), write shards, read them
    back verified: the blocks are the ones built from the tokens in RAM."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 3 * T, 300)
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.uint32)
    np.save(tmp_path / "tokens.npy", tokens)
    plan = plan_packing(lengths, T, "atomic", seed=b"s")
    cas = ContentStore(tmp_path / "cas")
    names = ("input_ids", "segment_ids", "positions", "label_mask")
    with (
        FileSamples(tmp_path / "tokens.npy", offsets) as samples,
        ShardWriter(cas, T, {name: FIELDS[name] for name in names}, 40 * BLOCK_BYTES) as out,
    ):
        for batch in iter_block_batches(plan, samples, batch_blocks=7):
            out.write({name: getattr(batch, name) for name in names})
    with pytest.raises(ValueError, match="want a flat array"):
        FileSamples(tmp_path / "tokens.npy", offsets + 1)
    assert out.index is not None and out.ref is not None and len(out.index.shards) > 1
    expected = build_batch(plan, 0, plan.blocks, lambda i: tokens[offsets[i] : offsets[i + 1]])
    with BlockReader.open(cas, out.ref["digest"]) as reader:
        for number, block in reader.blocks(range(plan.blocks)):
            for name in names:
                np.testing.assert_array_equal(block[name], getattr(expected, name)[number])


def _bytes_read() -> int:
    """Bytes this process has read through read system calls (pread included)."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


def test_a_sample_split_over_many_blocks_is_read_once_not_once_per_piece(tmp_path: Path) -> None:
    """An overlong document cut into 200 pieces costs one read of its tokens, not 200: packing
    the race corpus read 43x its tokens before ``FileSamples.piece``."""
    lengths = np.array([200 * T, 3, 5])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = np.arange(int(offsets[-1]), dtype=np.uint32)
    np.save(tmp_path / "tokens.npy", tokens)
    plan = plan_packing(lengths, T, "atomic", overlong="split", seed=b"s")
    assert plan.sample.size > 200
    with FileSamples(tmp_path / "tokens.npy", offsets) as samples:
        before = _bytes_read()
        built = list(iter_block_batches(plan, samples, batch_blocks=16))
        read = _bytes_read() - before
    assert read < 2 * tokens.nbytes, f"read {read} bytes for {tokens.nbytes} of tokens"
    expected = build_batch(plan, 0, plan.blocks, lambda i: tokens[offsets[i] : offsets[i + 1]])
    got = np.concatenate([b.input_ids for b in built])
    np.testing.assert_array_equal(got, expected.input_ids)


def test_stream_blocks_read_ahead_give_the_order_and_bytes_of_single_reads(tmp_path: Path) -> None:
    cas = ContentStore(tmp_path)
    blocks = make_blocks(230)
    _index, ref = write(cas, blocks, [230])
    with BlockReader.open(cas, ref["digest"]) as reader:
        stream = BlockStream(reader, identity(ref["digest"]))
        for rank, world in [(0, 1), (1, 2), (3, 4)]:
            expected = stream.block_numbers(rank, world).tolist()
            got = list(stream.blocks(rank, world))
            assert [number for number, _ in got] == expected
            for number, fields in got:
                np.testing.assert_array_equal(fields["input_ids"], blocks["input_ids"][number])
        reader.prefetch([-1, 5, 230])  # out of range: ignored here, refused by the read
        served = []
        with pytest.raises(IndexError, match="block 230"):
            for number, _fields in reader.blocks([4, 5, 230, 6], ahead=2):
                served.append(number)
        assert served == [4, 5]
