"""Peak memory of the dedup layer's main process, by phase, on an existing home.

For a config whose home already holds a built ``canonical_records`` (e.g. after
``race.py --layers CONFIG race-p1 --only raw_snapshot,canonical_records,dedup_clusters``), it
freezes a new partition (reusing the canonical layer through the layer memo), then runs
``build_dedup_clusters`` directly (no memo) in a fresh child. The child samples its own
``/proc/self/status`` every few milliseconds and, at each new RSS high, notes which dedup
function the main thread was in; it prints the peak (``VmHWM``), CPU seconds, the digests of
the clusters, edges and report outputs (the bytes must not change), and the phase of each new
high. Signatures are reused from the CAS when present (the main process is what is measured).

    .venv/bin/python bench/dedup_mem_bench.py CONFIG [--partition KEY]
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile")


def _status() -> dict[str, int]:
    """The memory lines of /proc/self/status, in kB."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            name = line.split(":", 1)[0]
            if name in _FIELDS:
                out[name] = int(line.split()[1])
    return out


def _where(frame: FrameType | None, depth: int = 3) -> str:
    """The innermost corpus_assets frames of a stack, outermost first."""
    names = []
    while frame is not None:
        if "corpus_assets" in frame.f_code.co_filename:
            names.append(f"{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_name}")
        frame = frame.f_back
    return " < ".join(names[:depth])


class Sampler(threading.Thread):
    """Records (seconds, RSS MB, anon MB, file MB, where) at each new RSS high of >= 4 MB."""

    def __init__(self, period: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.period, self.highs, self.stop = period, [], threading.Event()
        self.phases: dict[str, list] = {}  # where -> [first seen s, largest RSS MB]
        self.main = threading.main_thread().ident
        self.start_at = time.perf_counter()

    def run(self) -> None:
        best = 0
        while not self.stop.wait(self.period):
            s = _status()
            frame = sys._current_frames().get(self.main)
            where = _where(frame, 2)
            at = self.phases.setdefault(where, [round(time.perf_counter() - self.start_at, 2), 0])
            at[1] = max(at[1], s["VmRSS"] // 1024)
            if s["VmRSS"] >= best + 4096:
                best = s["VmRSS"]
                frame = sys._current_frames().get(self.main)
                self.highs.append(
                    (
                        round(time.perf_counter() - self.start_at, 2),
                        s["VmRSS"] // 1024,
                        s["RssAnon"] // 1024,
                        s["RssFile"] // 1024,
                        _where(frame),
                    )
                )


def child(config: str, partition: str) -> None:
    from corpus_assets.core.pipeline import DIRECT_BUILDERS
    from corpus_assets.core.runtime.workspace import open_workspace

    with open_workspace(config) as ws:
        floor = _status()["VmRSS"] / 1024
        sampler = Sampler()
        sampler.start()
        wall, cpu = time.perf_counter(), time.process_time()
        result = DIRECT_BUILDERS["dedup_clusters"](ws, partition)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        sampler.stop.set()
        sampler.join()
        out = _output_digests(ws, result.digest)
        print(
            json.dumps(
                {
                    "partition": partition,
                    "records": result.counts["records"],
                    "wall": round(wall, 2),
                    "cpu": round(cpu, 2),
                    "floor_mb": round(floor),
                    "peak_mb": round(_status()["VmHWM"] / 1024),
                    "run_stats": result.run_stats,
                    "digests": out,
                    "highs": sampler.highs,
                    "phases": sampler.phases,
                }
            )
        )


def _output_digests(ws: Any, digest: str) -> dict[str, str]:
    """Each output's digest, and the clusters parts' own (the parts document also names the
    code that wrote it: equal parts are equal bytes across code versions)."""
    from corpus_assets.core.runtime.layer_index import load_index
    from corpus_assets.core.runtime.parted_table import PartedTable

    index = load_index(ws.cas, digest, "dedup_clusters")
    names = ("clusters", "edges", "report", "decisions", "pairs")
    out = {name: index.outputs[name]["digest"] for name in names if name in index.outputs}
    parted = PartedTable.read(ws.cas, index.output("clusters"), "clusters")
    parts = "".join(ref["digest"] for ref in parted.refs)
    out["clusters_parts"] = "sha256:" + hashlib.sha256(parts.encode()).hexdigest()
    return out


def prepare(config: str, partition: str) -> None:
    """Freeze ``partition`` and build its raw and canonical layers (memo hits on a built home)."""
    from corpus_assets.core.ingest.freeze import freeze
    from corpus_assets.core.pipeline import BUILDERS
    from corpus_assets.core.runtime.workspace import open_workspace

    with open_workspace(config) as ws:
        freeze(ws, partition)
        for layer in ("raw_snapshot", "canonical_records"):
            BUILDERS[layer](ws, partition)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--partition", default=f"dedupmem-{int(time.time())}")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--phases", action="store_true", help="largest RSS per function")
    parser.add_argument("--show", type=int, default=150, help="print highs within this many MB")
    args = parser.parse_args()
    if args.child:
        return child(args.config, args.partition)
    load = os.getloadavg()
    prepare(args.config, args.partition)
    cmd = [sys.executable, __file__, args.config, "--partition", args.partition, "--child"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(done.stderr[-3000:])
    got = json.loads(done.stdout.strip().splitlines()[-1])
    got["load"] = [round(x, 1) for x in (*load, *os.getloadavg())]
    highs, phases = got.pop("highs"), got.pop("phases")
    print(json.dumps(got))
    for t, rss, anon, file, where in highs:
        if rss >= got["peak_mb"] - args.show:
            print(f"  {t:7.2f}s rss {rss} anon {anon} file {file}  {where}")
    if args.phases:
        for where, (first, rss) in sorted(phases.items(), key=lambda kv: kv[1][0]):
            print(f"  phase {first:7.2f}s max rss {rss:5d}  {where}")
    return None


if __name__ == "__main__":
    main()
