"""Packing on a log-normal(600, 1.2) corpus: planning (``packing.plan``), the per-block arrays
(``packing.blocks``), pack + write into verified shards, and peak RSS as the corpus grows, each
against a named baseline measured in the same run.

Corpus (seeded): ``--documents`` token counts ``max(1, int(lognormal(ln 600, 1.2)))`` in stream
order, and their tokens as one flat uint16 ``.npy`` file (``(position * 7919) % 50000``),
memory-mapped (``np.load(mmap_mode="r")``), never in RAM; a sample is fetched as a view
``tokens[off[i]:off[i + 1]]`` (``--fetch mmap``) or read by ``packing.blocks.FileSamples``, one
``pread`` per sample (``--fetch pread``). Overlong policy ``split``.

Per T in ``--block-tokens``:

- padding % (pad / capacity) of ``next_fit`` in stream order (the named baseline: the layer's
  packing so far) against ``atomic`` best-fit-decreasing; planning records/s (median of
  ``--repeats``, single thread) of both, and of a straightforward best-fit-decreasing that scans
  every open block per piece (numpy argmin over the rooms, O(pieces x blocks)) on the first
  ``--naive-documents`` documents, its block count checked against ours on that subset;
- building the per-block arrays of the whole atomic plan (``iter_block_batches``, 256 blocks a
  batch): MB/s of token bytes produced (uint32 ``input_ids``, 4 bytes a token slot) against a
  straightforward loop (per block, per piece: numpy slice assignments) in the same run; both
  outputs compared on the first batches;
- pack + write: ``plan_packing`` + ``iter_block_batches`` + ``ShardWriter`` (input_ids,
  segment_ids, positions, label_mask; 64 MiB shards, sha256-named, BLAKE3 chunk digests, each
  fsynced) into a real CAS, median of ``--write-repeats``; MB/s of input tokens (4 bytes a
  token) per wall second and per CPU second (all threads: "per core"), first and last block read
  back verified and compared. Baseline: a per-sample Python loop, next-fit in stream order into
  per-block arrays kept in a list, then ``np.save`` of each field (no hashing, no fsync), on the
  first ``--baseline-documents`` documents (its lists hold every block in RAM).

Peak RSS as the corpus grows (``--rss-documents``, T = the first ``--block-tokens``): pack +
write in a child process per size, tokens fetched both ways (``--rss-fetch mmap pread``). Printed:
the child's ``ru_maxrss`` (on Linux it starts from the parent's RSS at fork, so it is an upper
bound), its ``VmHWM`` (its own peak, mapped file pages included), ``RssAnon`` after planning,
the bytes of the live plan arrays (5 int64 per piece, plus lengths and offsets), ``RssAnon``
after ``malloc_trim(0)`` (what the planner freed but the heap kept), ``RssAnon`` at its peak
(sampled every 16 batches) and ``RssFile`` at the end.

Also: ``VmHWM`` (reset through ``/proc/self/clear_refs`` before each build, where allowed)
includes the memory-mapped file's resident pages. Exits non-zero on a wrong result.

Usage: .venv/bin/python bench/packing_bench.py [--documents 200000] [--block-tokens 2048 8192]
       [--write-repeats 3] [--rss-documents 200000 600000 2000000] [--skip plan build write rss]
"""

import argparse
import contextlib
import ctypes
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from corpus_assets.core.publication.block_reader import BlockReader
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.shards import ShardIndex, ShardWriter
from corpus_assets.core.training_view.packing.blocks import (
    BlockBatch,
    FileSamples,
    build_batch,
    iter_block_batches,
)
from corpus_assets.core.training_view.packing.plan import PackPlan, apply_overlong, plan_packing


def corpus(documents: int, seed: int, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """Lengths and offsets of the documents; their tokens go to ``folder/tokens.npy`` (written
    a piece at a time, so never in RAM whole), the lengths to ``lengths.npy`` for child runs."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(600), 1.2, documents).astype(np.int64))
    offsets = np.zeros(documents + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    path = folder / "tokens.npy"
    out = np.lib.format.open_memmap(path, mode="w+", dtype="<u2", shape=(int(offsets[-1]),))
    for lo in range(0, out.size, 1 << 24):
        hi = min(lo + (1 << 24), out.size)
        out[lo:hi] = (np.arange(lo, hi) * 7919) % 50000
    out.flush()
    del out
    np.save(folder / "lengths.npy", lengths)
    return lengths, offsets


def status_mib(key: str = "VmHWM") -> float:
    """A ``/proc/self/status`` memory line in MiB (VmHWM, RssAnon, RssFile, ...)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def vm_hwm_mib() -> float:
    return status_mib("VmHWM")


def reset_peak() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def naive_best_fit_blocks(lengths: np.ndarray, block_tokens: int) -> int:
    """Best-fit-decreasing the straightforward way: scan every open block's room per piece."""
    pieces = apply_overlong(lengths, block_tokens, "split").length
    rooms = np.empty(pieces.size, dtype=np.int64)
    opened = 0
    for need in np.sort(pieces)[::-1].tolist():
        fits = np.flatnonzero(rooms[:opened] >= need)
        if fits.size:
            best = fits[np.argmin(rooms[fits])]
            rooms[best] -= need
        else:
            rooms[opened] = block_tokens - need
            opened += 1
    return opened


def loop_build(plan: PackPlan, fetch, first: int, last: int) -> list[tuple[np.ndarray, ...]]:
    """Per-block arrays the straightforward way (no prompt masking, like the timed run)."""
    width, bounds, out = plan.block_tokens, plan.block_bounds(), []
    for b in range(first, last):
        ids = np.zeros(width, np.uint32)
        seg, pos = np.zeros(width, np.int32), np.zeros(width, np.int32)
        lab = np.zeros(width, np.uint8)
        for rank, row in enumerate(range(bounds[b], bounds[b + 1]), start=1):
            s, o, n = int(plan.start[row]), int(plan.offset[row]), int(plan.length[row])
            ids[s : s + n] = fetch(int(plan.sample[row]))[o : o + n]
            seg[s : s + n], pos[s : s + n] = rank, np.arange(n)
            lab[s : s + n - 1] = 1
        out.append((ids, seg, pos, lab))
    return out


def check_build(plan: PackPlan, fetch, blocks: int) -> None:
    ours = build_batch(plan, 0, blocks, fetch)
    for b, arrays in enumerate(loop_build(plan, fetch, 0, blocks)):
        mine = (ours.input_ids[b], ours.segment_ids[b], ours.positions[b], ours.label_mask[b])
        if not all(np.array_equal(x, y) for x, y in zip(arrays, mine, strict=True)):
            sys.exit(f"block {b}: the vectorised arrays differ from the loop's")


def bench_block_tokens(args, lengths, fetch, width: int) -> None:
    docs = lengths.size
    t_nf, nf = timed(lambda: plan_packing(lengths, width, "next_fit"), args.repeats)
    t_bfd, bfd = timed(lambda: plan_packing(lengths, width, "atomic", seed=b"b"), args.repeats)
    sub = lengths[: args.naive_documents]
    t_naive, naive_blocks = timed(lambda: naive_best_fit_blocks(sub, width), 1)
    t_sub, sub_plan = timed(lambda: plan_packing(sub, width, "atomic", seed=b"b"), args.repeats)
    if naive_blocks != sub_plan.blocks:
        sys.exit(f"T={width}: naive best fit {naive_blocks} blocks, ours {sub_plan.blocks}")
    for name, plan, seconds in (("next_fit", nf, t_nf), ("atomic BFD", bfd, t_bfd)):
        a = plan.accounting()
        pad = 100 * a["pad_tokens"] / a["capacity_tokens"]
        print(
            f"T={width} {name:>10}: {a['blocks']:>8,} blocks, pad {pad:8.4f} %, "
            f"plan {docs / seconds:>12,.0f} records/s ({seconds:.3f} s)"
        )
    print(
        f"T={width} naive BFD on {sub.size:,}: {sub.size / t_naive:,.0f} records/s; "
        f"ours on the same {sub.size / t_sub:,.0f} records/s ({t_naive / t_sub:.0f}x)"
    )
    check_build(bfd, fetch, min(64, bfd.blocks))
    produced = bfd.blocks * width * 4 / 1e6
    reset_peak()

    def ours() -> int:
        return sum(b.blocks for b in iter_block_batches(bfd, fetch, batch_blocks=256))

    t_ours, _ = timed(ours, args.build_repeats)
    peak_ours = vm_hwm_mib()
    reset_peak()

    def loop() -> None:
        for lo in range(0, bfd.blocks, 256):
            loop_build(bfd, fetch, lo, min(lo + 256, bfd.blocks))

    t_loop, _ = timed(loop, args.build_repeats)
    print(
        f"T={width} build {produced:,.0f} MB of input_ids: ours {produced / t_ours:,.0f} MB/s "
        f"({t_ours:.2f} s, VmHWM {peak_ours:,.0f} MiB), loop {produced / t_loop:,.0f} MB/s "
        f"({t_loop:.2f} s, VmHWM {vm_hwm_mib():,.0f} MiB): {t_loop / t_ours:.1f}x"
    )


SHARD_FIELDS = {"input_ids": "<u4", "segment_ids": "<i4", "positions": "<i4", "label_mask": "u1"}


def shard_fields(batch: BlockBatch) -> dict[str, np.ndarray]:
    return {name: getattr(batch, name) for name in SHARD_FIELDS}


def write_plan(plan: PackPlan, fetch, cas: ContentStore, probe=None) -> ShardIndex:
    """Ours: the plan's blocks built 256 at a time and streamed into verified shards."""
    with ShardWriter(cas, plan.block_tokens, SHARD_FIELDS) as writer:
        for number, batch in enumerate(iter_block_batches(plan, fetch, batch_blocks=256)):
            writer.write(shard_fields(batch))
            if probe is not None and number % 16 == 0:
                probe()
    assert writer.index is not None
    return writer.index


def loop_pack_save(lengths: np.ndarray, fetch, width: int, folder: Path) -> int:
    """The straightforward packer: per sample (stream order, cut into T-token pieces), next-fit
    into per-block arrays kept in lists, then ``np.save`` of each field. Returns the blocks."""
    fields: list[list[np.ndarray]] = [[], [], [], []]
    ids, seg, pos, lab, used, segment = None, None, None, None, width, 0
    for sample, total in enumerate(lengths.tolist()):
        for offset in range(0, total, width):
            n = min(width, total - offset)
            if used + n > width:
                ids, seg = np.zeros(width, np.uint32), np.zeros(width, np.int32)
                pos, lab = np.zeros(width, np.int32), np.zeros(width, np.uint8)
                for out, array in zip(fields, (ids, seg, pos, lab), strict=True):
                    out.append(array)
                used, segment = 0, 0
            segment += 1
            ids[used : used + n] = fetch(sample)[offset : offset + n]
            seg[used : used + n], pos[used : used + n] = segment, np.arange(n)
            lab[used : used + n - 1] = 1
            used += n
    for name, arrays in zip(SHARD_FIELDS, fields, strict=True):
        np.save(folder / f"{name}.npy", np.stack(arrays))
    return len(fields[0])


def timed_cpu(fn: Callable[[], object]) -> tuple[float, float, object]:
    """(wall s, CPU s of every thread of this process, result)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def bench_pack_write(args, lengths, fetch, width: int, folder: Path) -> None:
    """Pack + write throughput: ours over the whole corpus against the loop on a prefix."""
    runs = []
    for repeat in range(args.write_repeats):
        cas = ContentStore(folder / f"cas-{width}-{repeat}")
        wall_plan, cpu_plan, plan = timed_cpu(
            lambda: plan_packing(lengths, width, "atomic", seed=b"b")
        )
        wall, cpu, index = timed_cpu(lambda cas=cas, plan=plan: write_plan(plan, fetch, cas))
        runs.append((wall + wall_plan, cpu + cpu_plan))
        with BlockReader(cas, index) as reader:  # read back verified: the same arrays
            for number in (0, index.blocks - 1):
                built = build_batch(plan, number, number + 1, fetch)
                for name, values in reader.block(number).items():
                    if not np.array_equal(values, getattr(built, name)[0]):
                        sys.exit(f"T={width}: shard block {number} {name} differs from the build")
        shutil.rmtree(cas.root)
    mb = int(lengths.sum()) * 4 / 1e6
    wall, cpu = (statistics.median(r[i] for r in runs) for i in (0, 1))
    sub = lengths[: args.baseline_documents]
    out = folder / "loop"
    out.mkdir(exist_ok=True)
    loop_wall, loop_cpu, loop_blocks = timed_cpu(lambda: loop_pack_save(sub, fetch, width, out))
    shutil.rmtree(out)
    loop_mb = int(sub.sum()) * 4 / 1e6
    print(
        f"T={width} pack+write {mb:,.0f} MB of tokens (4 B each) into {index.blocks:,} blocks, "
        f"{len(index.shards)} shards: {mb / wall:,.0f} MB/s wall, {mb / cpu:,.0f} MB/s per core "
        f"({wall:.2f} s, {cpu:.2f} CPU s, median of {len(runs)}); loop on {sub.size:,} documents "
        f"({loop_blocks:,} blocks): {loop_mb / loop_wall:,.0f} MB/s wall, "
        f"{loop_mb / loop_cpu:,.0f} MB/s per core; ours {loop_cpu / loop_mb * mb / cpu:.1f}x "
        f"per core",
        flush=True,
    )


def rss_child(folder: Path, width: int, fetcher: str) -> None:
    """One pack + write in this (child) process; prints its memory figures as JSON."""
    lengths = np.load(folder / "lengths.npy")
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.load(folder / "tokens.npy", mmap_mode="r")
    plan = plan_packing(lengths, width, "atomic", seed=b"b")
    arrays = (plan.block, plan.start, plan.sample, plan.offset, plan.length, lengths, offsets)
    after_plan = {
        "plan_hwm": status_mib("VmHWM"),
        "plan_anon": status_mib("RssAnon"),
        "plan_arrays": sum(a.nbytes for a in arrays) / 2**20,
    }
    with contextlib.suppress(OSError, AttributeError):  # glibc: give freed heap back
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    after_plan["trimmed_anon"] = status_mib("RssAnon")
    peak_anon = [after_plan["plan_anon"]]

    def probe() -> None:
        peak_anon[0] = max(peak_anon[0], status_mib("RssAnon"))

    def plain(i: int) -> np.ndarray:
        return tokens[offsets[i] : offsets[i + 1]]

    began = time.perf_counter()
    fetch = FileSamples(folder / "tokens.npy", offsets) if fetcher == "pread" else plain
    index = write_plan(plan, fetch, ContentStore(folder / "cas"), probe)
    probe()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        **after_plan, "pieces": int(plan.length.size), "blocks": index.blocks,
        "tokens": int(lengths.sum()), "seconds": time.perf_counter() - began,
        "ru_maxrss": usage.ru_maxrss / 1024, "hwm": status_mib("VmHWM"), "peak_anon": peak_anon[0],
        "end_anon": status_mib("RssAnon"), "end_file": status_mib("RssFile"),
    }))  # fmt: skip


def bench_rss(args, folder: Path) -> None:
    """Peak RSS of pack + write in a child process at each corpus size (T = first width), the
    tokens fetched as views of a memmap and by ``FileSamples`` (pread)."""
    width = args.block_tokens[0]
    print(
        f"{'documents':>10} {'fetch':>8} {'tokens':>14} {'pieces':>9} {'ru_maxrss':>10} "
        f"{'VmHWM':>8} {'plan anon':>10} {'arrays':>7} {'trimmed':>8} "
        f"{'peak anon':>10} {'end file':>9} {'s':>6}   (MiB; T={width})"
    )
    for documents in args.rss_documents:
        size = folder / f"rss-{documents}"
        size.mkdir()
        corpus(documents, args.seed, size)
        for fetcher in args.rss_fetch:
            child = subprocess.run(
                [sys.executable, __file__, "--rss-child", str(size), str(width), fetcher],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            row = json.loads(child.stdout.splitlines()[-1])
            shutil.rmtree(size / "cas")
            print(
                f"{documents:>10,} {fetcher:>8} {row['tokens']:>14,} {row['pieces']:>9,} "
                f"{row['ru_maxrss']:>10,.0f} {row['hwm']:>8,.0f} {row['plan_anon']:>10,.0f} "
                f"{row['plan_arrays']:>7,.0f} {row['trimmed_anon']:>8,.0f} "
                f"{row['peak_anon']:>10,.0f} {row['end_file']:>9,.0f} {row['seconds']:>6.1f}",
                flush=True,
            )
        shutil.rmtree(size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=200_000)
    parser.add_argument("--block-tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--naive-documents", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--build-repeats", type=int, default=1)
    parser.add_argument("--write-repeats", type=int, default=3)
    parser.add_argument("--baseline-documents", type=int, default=20_000)
    parser.add_argument(
        "--rss-documents", type=int, nargs="*", default=[200_000, 600_000, 2_000_000]
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=["plan", "build", "write", "rss"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fetch", choices=["mmap", "pread"], default="mmap")
    parser.add_argument("--rss-fetch", nargs="+", default=["mmap", "pread"])
    parser.add_argument("--rss-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        rss_child(Path(args.rss_child[0]), int(args.rss_child[1]), args.rss_child[2])
        return
    with tempfile.TemporaryDirectory(prefix="packing-bench-", dir=Path.cwd()) as folder:
        lengths, offsets = corpus(args.documents, args.seed, Path(folder))
        print(
            f"{args.documents:,} documents, {int(lengths.sum()):,} tokens "
            f"(mean {lengths.mean():,.0f}, median {np.median(lengths):,.0f})"
        )

        tokens = np.load(Path(folder) / "tokens.npy", mmap_mode="r")

        def view(i: int) -> np.ndarray:
            return tokens[offsets[i] : offsets[i + 1]]

        fetch = FileSamples(Path(folder) / "tokens.npy", offsets) if args.fetch == "pread" else view
        print(f"fetch: {args.fetch}")
        for width in args.block_tokens:
            if not {"plan", "build"} <= set(args.skip):
                bench_block_tokens(args, lengths, fetch, width)
            if "write" not in args.skip:
                bench_pack_write(args, lengths, fetch, width, Path(folder))
        print(f"peak RSS (VmHWM since the last reset) {vm_hwm_mib():,.0f} MiB")
        if "rss" not in args.skip:
            bench_rss(args, Path(folder))


if __name__ == "__main__":
    main()
