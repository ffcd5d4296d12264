"""The training readers against a plain verified ``BlockReader`` pass over one pack, one run.

Writes ``--blocks`` blocks of ``--tokens`` tokens with the four packed fields (``input_ids`` u32,
``segment_ids`` i32, ``positions`` i32, ``label_mask`` u8; seeded) as shards into a throwaway
CAS, then times, median of ``--repeats``, each in a fresh child process (its ``ru_maxrss`` is the
phase's peak RSS; the shards sit in the page cache, so reads are memory-speed):

- baseline: ``BlockReader.batches()`` with verification, every field copied out (what a loader's
  collate does);
- ``LoaderPlan.batches`` (what the torch ``IterableDataset`` yields before tensor wrapping), one
  rank, one worker, ``--batch`` blocks per batch, in the shuffled epoch order;
- ``export_mds`` of the whole pack into the CAS (hashing, assembling samples, writing, adopting);
- ``_hf_dataset_of_pack(...).with_format("numpy")`` iterated row by row (``datasets`` builds an
  Arrow row per block), and ``.iter(batch_size=--batch)`` (numpy batches): skipped with a message
  when ``datasets`` is missing.

Prints MB/s of pack bytes for each, its ratio to the baseline, and each phase's peak RSS.

Usage: .venv/bin/python bench/readers_bench.py [--blocks 20000] [--tokens 2048] [--repeats 3]
"""

import argparse
import multiprocessing
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from corpus_assets.core.consumption.export_mds import export_mds
from corpus_assets.core.consumption.loader_plan import LoaderPlan
from corpus_assets.core.publication.block_reader import BlockReader, ReaderState
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.shards import write_shards

FIELDS = {"input_ids": "uint32", "segment_ids": "int32", "positions": "int32", "label_mask": "u1"}
WRITE_BATCH = 500


def write_pack(cas: ContentStore, blocks: int, tokens: int) -> str:
    def batches():
        rng = np.random.default_rng(0)
        for start in range(0, blocks, WRITE_BATCH):
            count = min(WRITE_BATCH, blocks - start)
            yield {
                "input_ids": rng.integers(0, 50_000, (count, tokens), dtype=np.uint32),
                "segment_ids": rng.integers(0, 9, (count, tokens), dtype=np.int32),
                "positions": np.tile(np.arange(tokens, dtype=np.int32), (count, 1)),
                "label_mask": rng.integers(0, 2, (count, tokens), dtype=np.uint8),
            }

    return write_shards(cas, batches(), tokens, FIELDS)[1]["digest"]


def baseline(cas: ContentStore, digest: str, _batch: int) -> int:
    seen = 0
    with BlockReader.open(cas, digest) as reader:
        for batch in reader.batches():
            copies = {name: np.array(values) for name, values in batch.items()}
            seen += len(copies["input_ids"])
    return seen


def plan_batches(cas: ContentStore, digest: str, batch: int) -> int:
    state = ReaderState(
        snapshot_id="bench",
        pack_digest=digest,
        mix_digest="bench",
        tokenizer_digest="bench",
        seed=1,
    )
    plan = LoaderPlan(cas.root, state, batch_blocks=batch)
    seen = 0
    with plan.open_reader() as reader:
        for numbers, _fields in plan.batches(reader):
            seen += len(numbers)
    return seen


def mds_export(cas: ContentStore, digest: str, _batch: int) -> int:
    with BlockReader.open(cas, digest) as reader:
        return export_mds(cas, reader, digest)[0].blocks


def hf_rows(cas: ContentStore, digest: str, _batch: int) -> int:
    from corpus_assets.core.consumption.hf_loader import _hf_dataset_of_pack

    return sum(1 for _row in _hf_dataset_of_pack(cas, digest).with_format("numpy"))


def hf_batches(cas: ContentStore, digest: str, batch: int) -> int:
    from corpus_assets.core.consumption.hf_loader import _hf_dataset_of_pack

    numpy_rows = _hf_dataset_of_pack(cas, digest).with_format("numpy")
    return sum(len(rows["input_ids"]) for rows in numpy_rows.iter(batch_size=batch))


def _child(run: Callable[..., int], args: tuple, queue: multiprocessing.Queue) -> None:
    began = time.perf_counter()
    seen = run(*args)
    elapsed = time.perf_counter() - began
    queue.put((seen, elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def measure(run: Callable[..., int], args: tuple, repeats: int, blocks: int) -> tuple[float, float]:
    """(median seconds, max peak RSS MiB) of ``run`` in fresh child processes."""
    context = multiprocessing.get_context("spawn")
    times, peaks = [], []
    for _ in range(repeats):
        queue = context.Queue()
        child = context.Process(target=_child, args=(run, args, queue))
        child.start()
        seen, elapsed, peak = queue.get()
        child.join()
        if seen != blocks:
            raise SystemExit(f"{run.__name__} saw {seen} blocks, not {blocks}")
        times.append(elapsed)
        peaks.append(peak)
    return statistics.median(times), max(peaks)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=20_000)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        cas = ContentStore(Path(scratch))
        digest = write_pack(cas, options.blocks, options.tokens)
        pack_mb = options.blocks * options.tokens * 13 / 1e6
        print(f"pack: {options.blocks} blocks x T={options.tokens}, {pack_mb:.0f} MB")
        runs = [baseline, plan_batches, mds_export, hf_rows, hf_batches]
        try:
            import datasets  # noqa: F401
        except ImportError:
            print("hf_rows, hf_batches: skipped, datasets is not installed")
            runs = runs[:3]
        base = None
        for run in runs:
            args = (cas, digest, options.batch)
            seconds, peak = measure(run, args, options.repeats, options.blocks)
            base = base or seconds
            print(
                f"{run.__name__:>13}: {pack_mb / seconds:8.0f} MB/s  {seconds:7.2f} s"
                f"  x{seconds / base:6.2f} baseline time  peak RSS {peak:6.0f} MiB"
            )


if __name__ == "__main__":
    main()
