"""Verified against unverified reads of block shards (``BlockReader``), in one run.

Writes ``--blocks`` blocks of ``--tokens`` random uint32 ids (one field, ``input_ids``; generated
a batch at a time, seeded) as 64 MiB shards with 4 MiB chunk digests into a throwaway CAS, then
times, median of ``--repeats``, each with a fresh reader (a new open verifies every chunk again):

- sequential, by batch: ``BlockReader.batches()``, each shard's rows copied into a reused
  buffer (what a loader's collate does);
- sequential, by block: ``iter(BlockReader)``, each block copied into a reused row buffer;
- random blocks: ``--random`` block numbers (seeded), each copied; with verification every 4 MiB
  chunk a read touches is hashed once, so this is the worst case;
- random blocks, warm: the same reads again on the same reader (chunks already verified).

The baseline of each is the same read with ``verify=False``, measured in the same run. The
shards sit in the page cache after writing (hot reads: the baseline is memory-speed, the least
flattering case for hashing). Prints the ratios against the 1.5x target and peak RSS
(``ru_maxrss``; mapped shard pages that were touched count in it).

Usage: .venv/bin/python bench/shards_bench.py [--blocks 200000] [--tokens 2048] [--repeats 3]
"""

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from corpus_assets.core.release.block_reader import BlockReader
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.shards import ShardIndex, verify_shards, write_shards

BATCH = 1000


def write(cas: ContentStore, blocks: int, tokens: int) -> tuple[ShardIndex, str, float]:
    def batches():
        rng = np.random.default_rng(0)
        for start in range(0, blocks, BATCH):
            count = min(BATCH, blocks - start)
            yield {"input_ids": rng.integers(0, 2**32, (count, tokens), dtype=np.uint32)}

    began = time.perf_counter()
    index, ref = write_shards(cas, batches(), tokens, {"input_ids": "uint32"})
    return index, ref["digest"], time.perf_counter() - began


def by_batch(reader: BlockReader) -> int:
    buffer = np.empty((reader.index.shard_blocks, reader.index.block_tokens), np.uint32)
    seen = 0
    for batch in reader.batches():
        rows = batch["input_ids"]
        buffer[: len(rows)] = rows
        seen += len(rows)
    return seen


def by_block(reader: BlockReader) -> int:
    buffer = np.empty(reader.index.block_tokens, np.uint32)
    seen = 0
    for block in reader:
        buffer[:] = block["input_ids"]
        seen += 1
    return seen


def random_reads(reader: BlockReader, numbers: np.ndarray) -> int:
    buffer = np.empty(reader.index.block_tokens, np.uint32)
    for number in numbers:
        buffer[:] = reader.block(int(number))["input_ids"]
    return len(numbers)


def median(run: Callable[[], int], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def compare(cas: ContentStore, index: ShardIndex, numbers: np.ndarray, repeats: int) -> None:
    def fresh(verify: bool) -> BlockReader:
        return BlockReader(cas, index, verify=verify)

    warm = {flag: fresh(flag) for flag in (False, True)}
    for reader in warm.values():
        random_reads(reader, numbers)
    cases = {
        "sequential, by batch": lambda v: by_batch(fresh(v)),
        "sequential, by block": lambda v: by_block(fresh(v)),
        "random blocks (fresh open)": lambda v: random_reads(fresh(v), numbers),
        "random blocks (warm)": lambda v: random_reads(warm[v], numbers),
    }
    print(f"{'read':<28} {'unverified s':>13} {'verified s':>11} {'ratio':>7}")
    for name, run in cases.items():
        base = median(lambda run=run: run(False), repeats)
        mine = median(lambda run=run: run(True), repeats)
        print(f"{name:<28} {base:>13.3f} {mine:>11.3f} {mine / base:>6.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=200_000)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--random", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shards-bench-") as folder:
        cas = ContentStore(Path(folder))
        index, digest, seconds = write(cas, args.blocks, args.tokens)
        size = sum(entry.size for entry in index.shards)
        print(
            f"wrote {index.blocks} blocks x T={index.block_tokens}: {len(index.shards)} shards, "
            f"{size / 2**20:,.0f} MiB in {seconds:.2f} s ({size / 2**20 / seconds:,.0f} MiB/s); "
            f"index {digest}"
        )
        began = time.perf_counter()
        verify_shards(cas, index)
        print(f"verify_shards (every chunk + whole file): {time.perf_counter() - began:.2f} s")
        numbers = np.random.default_rng(1).integers(0, index.blocks, args.random)
        compare(cas, index, numbers, args.repeats)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:,.0f} MiB")


if __name__ == "__main__":
    main()
