"""Packing on a log-normal(600, 1.2) corpus: planning (``pack_plan``) and the per-block arrays
(``pack_blocks``), against named baselines measured in the same run.

Corpus (seeded): ``--documents`` token counts ``max(1, int(lognormal(ln 600, 1.2)))`` in stream
order, and their tokens as one uint16 file (``(position * 7919) % 50000``) memory-mapped; a
sample is fetched as a view ``tokens[off[i]:off[i + 1]]``. Overlong policy ``split``.

Per T in ``--block-tokens``:

- padding % (pad / capacity) of ``next_fit`` in stream order (the named baseline: the layer's
  packing so far) against ``atomic`` best-fit-decreasing; planning records/s (median of
  ``--repeats``, single thread) of both, and of a straightforward best-fit-decreasing that scans
  every open block per piece (numpy argmin over the rooms, O(pieces x blocks)) on the first
  ``--naive-documents`` documents, its block count checked against ours on that subset;
- building the per-block arrays of the whole atomic plan (``iter_block_batches``, 256 blocks a
  batch): MB/s of token bytes produced (uint32 ``input_ids``, 4 bytes a token slot) against a
  straightforward loop (per block, per piece: numpy slice assignments) in the same run; both
  outputs compared on the first batches.

Peak RSS: ``VmHWM`` (reset through ``/proc/self/clear_refs`` before each build, where allowed)
includes the memory-mapped file's resident pages. Exits non-zero on a wrong result.

Usage: .venv/bin/python bench/packing_bench.py [--documents 200000] [--block-tokens 2048 8192]
"""

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from corpus_assets.core.training_view.pack_blocks import build_batch, iter_block_batches
from corpus_assets.core.training_view.pack_plan import PackPlan, apply_overlong, plan_packing


def corpus(documents: int, seed: int, folder: Path) -> tuple[np.ndarray, np.memmap, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(600), 1.2, documents).astype(np.int64))
    offsets = np.zeros(documents + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    path = folder / "tokens.u16"
    with path.open("wb") as out:
        for lo in range(0, int(offsets[-1]), 1 << 24):
            hi = min(lo + (1 << 24), int(offsets[-1]))
            out.write(((np.arange(lo, hi) * 7919) % 50000).astype("<u2").tobytes())
    return lengths, np.memmap(path, dtype="<u2", mode="r"), offsets


def vm_hwm_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=200_000)
    parser.add_argument("--block-tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--naive-documents", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--build-repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        lengths, tokens, offsets = corpus(args.documents, args.seed, Path(folder))
        print(
            f"{args.documents:,} documents, {int(lengths.sum()):,} tokens "
            f"(mean {lengths.mean():,.0f}, median {np.median(lengths):,.0f})"
        )

        def fetch(i: int) -> np.ndarray:
            return tokens[offsets[i] : offsets[i + 1]]

        for width in args.block_tokens:
            bench_block_tokens(args, lengths, fetch, width)
        print(f"peak RSS (VmHWM since the last reset) {vm_hwm_mib():,.0f} MiB")


if __name__ == "__main__":
    main()
