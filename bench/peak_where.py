"""Where a layer's driver peak sits: one layer rebuilt as ``race.py --child --direct`` does, with
a thread sampling the process's RSS every 10 ms.

It prints the layer's cost line (``race.py``'s JSON), then the main thread's stack (this
project's frames) and Arrow's allocated bytes at the highest RSS seen, then a timeline: one line
each time RSS moved by 20 MB, with Arrow's bytes and the innermost frame. The stack at the peak
names the phase that was running, not what holds the memory: read the timeline for the phases
that raised the floor under it (DuckDB's pages stay with its allocator until handed back).
Quote peaks from ``race.py --child``, not from here: under this sampler the packed_blocks layer
at 1.1 GB peaked at 480-520 MB in five runs against 330-360 in ``race.py --child`` (not
understood: a bare thread reading the same ``/proc`` line and Arrow's bytes did not raise it).
Usage (a home made by ``race.py --peaks``; ``--identity-as`` as in ``race.py``):

    DAGSTER_HOME=H/dagster CORPUS_HOME=H/home .venv/bin/python bench/peak_where.py \\
        H/corpus.yaml race-p1 splits [--identity-as CHECKOUT]
"""

import argparse
import os
import sys
import threading
import traceback
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))
import race  # bench/ is not a package: its folder is put on the path first

STEP_KB = 20 * 1024  # a timeline line each time RSS moves this much
PERIOD_S = 0.01


def _rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Sampler(threading.Thread):
    """RSS, Arrow's bytes and the main thread's project frames, sampled until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.main = threading.get_ident()
        self.peak_kb, self.peak_stack, self.peak_arrow = 0, [], 0
        self.timeline: list[tuple[int, int, str]] = []
        self.stopped = threading.Event()

    def stack(self) -> list[str]:
        frame = sys._current_frames().get(self.main)
        return [
            f"{f.filename.split('corpus_assets/')[-1]}:{f.lineno} {f.name}"
            for f in traceback.extract_stack(frame)
            if "corpus_assets" in f.filename
        ]

    def run(self) -> None:
        last = 0
        while not self.stopped.wait(PERIOD_S):
            rss = _rss_kb()
            if rss > self.peak_kb:
                self.peak_kb, self.peak_arrow = rss, pa.total_allocated_bytes()
                self.peak_stack = self.stack()
            if abs(rss - last) >= STEP_KB:
                inner = (self.stack() or ["?"])[-1]
                self.timeline.append((rss // 1024, pa.total_allocated_bytes() >> 20, inner))
                last = rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("partition")
    parser.add_argument("layer")
    parser.add_argument("--identity-as", type=Path)
    args = parser.parse_args()
    if args.identity_as is not None:
        env = race._identity_as(args.identity_as)
        if env is not None:  # the shim loads at start-up: run again under it
            os.execve(sys.executable, [sys.executable, *sys.argv], env)
    sampler = Sampler()
    sampler.start()
    race.child(args.config, args.partition, args.layer, direct=True)
    sampler.stopped.set()
    sampler.join()
    print(f"peak RSS {sampler.peak_kb / 1024:.0f} MB, Arrow {sampler.peak_arrow >> 20} MB, in:")
    print("\n".join(f"  {frame}" for frame in sampler.peak_stack))
    print("timeline (RSS MB, Arrow MB, innermost frame):")
    for rss, arrow, frame in sampler.timeline:
        print(f"  {rss:5d} {arrow:4d}  {frame}")


if __name__ == "__main__":
    main()
