"""packed_blocks of a child with +1% documents: incremental (the parent's blocks kept) against a
full repack (the named baseline), in the same run on the same home.

The corpus is ``race_corpus.py``'s (``--mb`` of raw JSONL from the shared corpora). A parent is
built and activated, ``race.add_one_percent`` adds a new object per source, and the child's
layers are built once. Then the packed_blocks layer alone is rebuilt (no memo) in a fresh child
process per run, ``--repeats`` times per mode, under the same config but ``incremental: true`` or
``false``: CPU seconds (the process and its pool workers), wall seconds, peak RSS (VmHWM), the
padding fraction (pad / positions), blocks, the decision and the shards reused. Medians printed.

Usage: .venv/bin/python bench/packing_incremental_bench.py [--mb 120] [--repeats 3] [--workers 2]
"""

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from race import add_one_percent, write_config
from race_corpus import write_corpus

PARENT, CHILD = "bench-p1", "bench-p2"


def _vm_hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def child(config: str) -> None:
    """Rebuild the child's packed_blocks only (no memo) and print its cost and layout figures."""
    from corpus_assets.core.pipeline import DIRECT_BUILDERS
    from corpus_assets.core.runtime.workspace import open_workspace

    with open_workspace(config) as ws:
        wall, cpu = time.perf_counter(), time.process_time()
        result = DIRECT_BUILDERS["packed_blocks"](ws, CHILD)
        workers = resource.getrusage(resource.RUSAGE_CHILDREN)
        counts = result.counts
        print(
            json.dumps(
                {
                    "cpu": time.process_time() - cpu + workers.ru_utime + workers.ru_stime,
                    "wall": time.perf_counter() - wall,
                    "peak_mb": _vm_hwm_mb(),
                    "padding": counts["pad_tokens"] / max(counts["tokens"], 1),
                    "blocks": counts["blocks"],
                    "packing": result.details["packing"],
                    "shards_reused": result.run_stats.get("shards_reused", 0),
                    "digest": result.digest,
                }
            )
        )


def prepare(root: Path, corpora: Path, mb: float, workers: int) -> Path:
    """Corpus, parent (built and active), +1% documents, the child's layers; the config."""
    from corpus_assets.core.pipeline import build_all
    from corpus_assets.core.publication.publish import activate, approve
    from corpus_assets.core.runtime.workspace import open_workspace

    made = write_corpus(corpora, root / "src", mb)
    config = write_config(root, made["sources"], workers)
    with open_workspace(config) as ws:
        sid = build_all(ws, PARENT)["manifest"].digests["snapshotId"]
        approve(ws, sid, by="bench")
        activate(ws, sid, actor="bench")
        added = add_one_percent(corpora, root / "src", made["jsonl_bytes"])
        build_all(ws, CHILD)
    print(f"corpus {made['jsonl_bytes'] / 1e6:.1f} MB, added {added / 1e6:.2f} MB", flush=True)
    return config


def variant(config: Path, incremental: bool) -> Path:
    text = (
        config.read_text() + f"policies: {{packing: {{incremental: {str(incremental).lower()}}}}}\n"
    )
    out = config.with_name(f"corpus-{'incremental' if incremental else 'full'}.yaml")
    out.write_text(text)
    return out


def measure(config: Path, repeats: int) -> list[dict]:
    runs = []
    for _ in range(repeats):
        cmd = [sys.executable, __file__, "--child", str(config)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if len({r["digest"] for r in runs}) != 1:
        sys.exit(f"{config.name}: reruns gave different layers")
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", type=Path, default=Path("/work/shared/corpora"))
    parser.add_argument("--mb", type=float, default=120)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tmp", type=Path, default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    root = Path(tempfile.mkdtemp(prefix="pack-incr-", dir=args.tmp))
    try:
        config = prepare(root, args.corpora, args.mb, args.workers)
        results = {mode: measure(variant(config, mode), args.repeats) for mode in (True, False)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {}
    for incremental, runs in results.items():
        name = "incremental" if incremental else "full"
        medians[name] = {k: statistics.median(r[k] for r in runs) for k in ("cpu", "wall")}
        first, each = runs[0], [round(r["cpu"], 2) for r in runs]
        print(
            f"{name:12s} CPU {medians[name]['cpu']:.2f} s (runs {each})"
            f"  wall {medians[name]['wall']:.2f} s  peak {max(r['peak_mb'] for r in runs):.0f} MB"
            f"  padding {first['padding']:.5f}  blocks {first['blocks']}"
            f"  shards reused {first['shards_reused']}  {first['packing']['mode']}:"
            f" {first['packing']['reason']}"
        )
    ratio = medians["incremental"]["cpu"] / medians["full"]["cpu"]
    print(f"CPU incremental / full: {ratio:.3f} (median of {args.repeats})")


if __name__ == "__main__":
    main()
