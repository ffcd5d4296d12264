"""Verified against unverified reads of block shards (``BlockReader``), in one run.

Writes ``--blocks`` blocks of ``--tokens`` random uint32 ids (one field, ``input_ids``; generated
a batch at a time, seeded) as 64 MiB shards with ``--chunk-bytes`` chunk digests
(``--chunk-hash``) into a throwaway CAS, then times, median of ``--repeats``, each with a fresh
reader (a new open verifies every chunk again):

- sequential, by batch: ``BlockReader.batches()``, each shard's rows copied into a reused
  buffer (what a loader's collate does); the next shard is verified ahead on the reader's threads;
- sequential, by block: ``iter(BlockReader)``, each block copied into a reused row buffer;
- random, ``block()`` one at a time: ``--random`` block numbers (seeded), each copied; nothing is
  known ahead, so each first touch of a chunk hashes it while the caller waits (the worst case);
- random, ``blocks(numbers)``: the same numbers through the verify-ahead iterator (what
  ``BlockStream`` uses: the order of an epoch is known in advance);
- random, a whole epoch: every block once in a seeded permutation, through ``blocks()``;
- random, warm: the ``--random`` reads again on the same reader (chunks already verified).

The baseline of each is the same read with ``verify=False``, in the same run, the two
alternating run by run. Page cache: by default the shards stay cached after writing (hot reads:
the baseline runs at memory speed, the least flattering case for hashing); ``--cold`` drops the
page cache (``/proc/sys/vm/drop_caches``, root only) before every timed run of both sides. Prints
the ratios of wall time and of CPU time (all threads; what the hashing costs a loaded machine)
against the 1.5x target, and peak RSS (``ru_maxrss``; touched pages of mapped shards count).

Usage: .venv/bin/python bench/shards_bench.py [--blocks 200000] [--tokens 2048] [--repeats 5]
       [--chunk-bytes 1048576] [--chunk-hash blake3] [--cold]
"""

import argparse
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from corpus_assets.core.publication.block_reader import BlockReader
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.shard_reader import verify_shards
from corpus_assets.core.storage.shards import ShardIndex, write_shards

BATCH = 1000
DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def write(cas: ContentStore, args: argparse.Namespace) -> tuple[ShardIndex, str, float]:
    def batches():
        rng = np.random.default_rng(0)
        for start in range(0, args.blocks, BATCH):
            count = min(BATCH, args.blocks - start)
            yield {"input_ids": rng.integers(0, 2**32, (count, args.tokens), dtype=np.uint32)}

    began = time.perf_counter()
    index, ref = write_shards(
        cas,
        batches(),
        args.tokens,
        {"input_ids": "uint32"},
        chunk_bytes=args.chunk_bytes,
        chunk_hash=args.chunk_hash,
    )
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


def one_at_a_time(reader: BlockReader, numbers: np.ndarray) -> int:
    buffer = np.empty(reader.index.block_tokens, np.uint32)
    for number in numbers.tolist():
        buffer[:] = reader.block(number)["input_ids"]
    return len(numbers)


def ahead(reader: BlockReader, numbers: np.ndarray) -> int:
    buffer = np.empty(reader.index.block_tokens, np.uint32)
    for _number, block in reader.blocks(numbers):
        buffer[:] = block["input_ids"]
    return len(numbers)


def medians(
    run: Callable[[bool], int], repeats: int, cold: bool
) -> dict[bool, tuple[float, float]]:
    """Median (wall s, CPU s of all threads) unverified and verified, the two runs alternating
    (the machine is shared: alternation exposes both sides to the same load)."""
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(repeats):
        for verify in (False, True):
            if cold:
                os.sync()
                DROP_CACHES.write_text("1")
            wall, cpu = time.perf_counter(), time.process_time()
            run(verify)
            times[verify].append((time.perf_counter() - wall, time.process_time() - cpu))
    return {
        verify: (statistics.median(t[0] for t in runs), statistics.median(t[1] for t in runs))
        for verify, runs in times.items()
    }


def compare(cas: ContentStore, index: ShardIndex, args: argparse.Namespace) -> None:
    numbers = np.random.default_rng(1).integers(0, index.blocks, args.random)
    epoch = np.random.default_rng(2).permutation(index.blocks)

    def fresh(verify: bool) -> BlockReader:
        return BlockReader(cas, index, verify=verify)

    def once(verify: bool, read: Callable[[BlockReader], int]) -> int:
        """A read on a fresh open, closed after (its hashing threads stopped)."""
        with fresh(verify) as reader:
            return read(reader)

    warm: dict[bool, BlockReader] = {}

    def warmed(verify: bool) -> BlockReader:
        """Created on the first use (after the cold cases: its mappings pin pages in cache)."""
        if verify not in warm:
            warm[verify] = fresh(verify)
            one_at_a_time(warm[verify], numbers)
        return warm[verify]

    cases = {
        "sequential, by batch": lambda v: once(v, by_batch),
        "sequential, by block": lambda v: once(v, by_block),
        f"random {args.random}, block()": lambda v: once(v, lambda r: one_at_a_time(r, numbers)),
        f"random {args.random}, blocks()": lambda v: once(v, lambda r: ahead(r, numbers)),
        "random whole epoch, blocks()": lambda v: once(v, lambda r: ahead(r, epoch)),
        f"random {args.random}, warm": lambda v: one_at_a_time(warmed(v), numbers),
    }
    print(
        f"{'read':<30} {'unverified s':>13} {'verified s':>11} {'ratio':>7}   "
        f"{'CPU s unverified':>16} {'verified':>9} {'ratio':>7}"
    )
    for name, run in cases.items():
        cold = args.cold and "warm" not in name
        if "warm" in name:
            warmed(False), warmed(True)
        got = medians(run, args.repeats, cold)
        (base, base_cpu), (mine, mine_cpu) = got[False], got[True]
        print(
            f"{name:<30} {base:>13.3f} {mine:>11.3f} {mine / base:>6.2f}x   "
            f"{base_cpu:>16.3f} {mine_cpu:>9.3f} {mine_cpu / base_cpu:>6.2f}x",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=200_000)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--random", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--chunk-bytes", type=int, default=1 << 20)
    parser.add_argument("--chunk-hash", choices=["blake3", "sha256"], default="blake3")
    parser.add_argument("--cold", action="store_true", help="drop the page cache per run (root)")
    args = parser.parse_args()
    if args.cold and not os.access(DROP_CACHES, os.W_OK):
        parser.error(f"--cold needs write access to {DROP_CACHES} (root)")
    with tempfile.TemporaryDirectory(prefix="shards-bench-", dir=Path.cwd()) as folder:
        cas = ContentStore(Path(folder))
        index, digest, seconds = write(cas, args)
        size = sum(entry.size for entry in index.shards)
        print(
            f"wrote {index.blocks} blocks x T={index.block_tokens}: {len(index.shards)} shards, "
            f"{size / 2**20:,.0f} MiB in {seconds:.2f} s ({size / 2**20 / seconds:,.0f} MiB/s); "
            f"{args.chunk_hash} chunks of {args.chunk_bytes:,} B; index {digest}; "
            f"page cache {'dropped before each run' if args.cold else 'hot'}"
        )
        began = time.perf_counter()
        verify_shards(cas, index)
        print(f"verify_shards (every chunk + whole file): {time.perf_counter() - began:.2f} s")
        compare(cas, index, args)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:,.0f} MiB")


if __name__ == "__main__":
    main()
