"""Planning memory: peak RSS a ``plan_packing`` call adds, and each phase's traced peak.

Two children on the same log-normal(ln 600, 1.2) lengths: one reads ``VmHWM`` before and after
``plan_packing`` (what planning adds to the process's peak, bytes a piece), one runs the phases
(overlong rule, best-fit, layout, keyed block order) under ``tracemalloc`` (numpy allocations
are traced) and prints each phase's peak and what it keeps.

    .venv/bin/python bench/pack_plan_memory.py --documents 2000000
"""

import argparse
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np

from corpus_assets.core.training_view.packing import plan as pack_plan


def lengths_of(documents: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.maximum(1, rng.lognormal(np.log(600), 1.2, documents).astype(np.int64))


def hwm_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def peak_child(documents: int, block_tokens: int) -> None:
    lengths = lengths_of(documents)
    before = hwm_mib()
    plan = pack_plan.plan_packing(lengths, block_tokens, "atomic", seed=b"bench")
    added = hwm_mib() - before
    per_piece = added * 2**20 / plan.length.size
    print(f"{plan.length.size:,} pieces: planning adds {added:.0f} MiB ({per_piece:.0f} B/piece)")


def phases_child(documents: int, block_tokens: int) -> None:
    lengths = lengths_of(documents)
    tracemalloc.start()

    def step(name, function, *args):
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        out = function(*args)
        now, peak = tracemalloc.get_traced_memory()
        grew, kept = (peak - before) / 2**20, (now - before) / 2**20
        print(f"  {name:12} peak +{grew:5.0f} MiB, keeps +{kept:5.0f} MiB")
        return out

    pieces = step("overlong", pack_plan.apply_overlong, lengths, block_tokens, "split")
    block = step("best fit", pack_plan.best_fit_blocks, pieces.length, block_tokens)
    laid = step("layout", pack_plan.layout_pieces, pieces, block)
    blocks = int(block.max()) + 1
    step("block order", pack_plan.block_order, laid[0], laid[2], laid[3], blocks, b"bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=2_000_000)
    parser.add_argument("--block-tokens", type=int, default=2048)
    parser.add_argument("--child", choices=["peak", "phases"])
    args = parser.parse_args()
    if args.child:
        child = peak_child if args.child == "peak" else phases_child
        child(args.documents, args.block_tokens)
        return
    for mode in ("peak", "phases"):
        command = [sys.executable, __file__, "--child", mode, "--documents", str(args.documents),
                   "--block-tokens", str(args.block_tokens)]  # fmt: skip
        subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
