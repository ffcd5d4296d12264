"""Near-dedup on the driver (one worker) vs on the task runner (two workers): CPU and wall.

The corpus is ``race_corpus.py``'s copy of the shared corpora at ``--mb`` MB. Raw and canonical
layers are built once and the signatures hashed once (a warm-up dedup run, not measured); then
``dedup_clusters`` runs again (not the layer memo: a real run) on a fresh partition over the same
bytes in a fresh child process per worker count, signatures reused from the chunk cache, so
what differs is banding, verification and the scan. Per run: wall, the driver's CPU
(``RUSAGE_SELF``), the pool workers' CPU (``RUSAGE_CHILDREN``: the run's one pool, started at
its first map and reaped at its end, imports included), the candidate pairs, those the scan
verified and those the reduce tasks verified (computed or known; a pair in two partitions
twice), and the layer's digests (equal, or the run fails).

Usage: .venv/bin/python bench/dedup_band_bench.py [--mb 110] [--workers 1,2] [--tmp DIR]
"""

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from race import write_config
from race_corpus import write_corpus


def child(config: str, partition: str) -> None:
    """Build the layers before dedup (not measured), then time one real dedup run."""
    from corpus_assets.core.pipeline import BUILDERS, DIRECT_BUILDERS
    from corpus_assets.core.runtime.pool import shared_pool
    from corpus_assets.core.runtime.workspace import open_workspace

    with open_workspace(config) as ws:
        for layer in ("raw_snapshot", "canonical_records"):
            BUILDERS[layer](ws, partition)
        before = (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
        wall = time.perf_counter()
        with shared_pool():  # one pool for the layer's maps, as in a build; reaped at the end
            result = DIRECT_BUILDERS["dedup_clusters"](ws, partition)
        wall = time.perf_counter() - wall
        after = (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
    cpu = [
        a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime
        for a, b in zip(after, before, strict=True)
    ]
    out = {"wall": wall, "driver_cpu": cpu[0], "workers_cpu": cpu[1]}
    classes = result.details["classes"].values()
    out["run_stats"] = {
        **result.run_stats,
        "candidates": sum(c["candidate_pairs"] for c in classes),
    }
    out["digests"] = {**result.digests, "layer": result.digest}
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shared = Path(__file__).resolve().parents[2] / "shared/corpora"
    parser.add_argument("--corpora", type=Path, default=shared)
    parser.add_argument("--mb", type=float, default=110)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--tmp", type=Path, default=Path("/tmp/dedup-band-bench"))
    parser.add_argument("--child", nargs=2, metavar=("CONFIG", "PARTITION"))
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    corpus = args.tmp / "corpus"
    listing = args.tmp / "sources.json"
    if not listing.exists():
        listing.write_text(json.dumps(write_corpus(args.corpora, corpus, args.mb)))
    sources = json.loads(listing.read_text())["sources"]
    runs = [("warm", 2)] + [(f"w{w}", int(w)) for w in args.workers.split(",")]
    digests = None
    for partition, workers in runs:
        config = write_config(args.tmp, sources, workers)
        cmd = [sys.executable, __file__, "--child", str(config), partition]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        stats = row.pop("run_stats")
        if partition != "warm":
            assert digests in (None, row["digests"]), (digests, row["digests"])
            digests = row["digests"]
        keys = ("candidates", "pairs_verified", "pairs_computed", "band_pairs_verified")
        keys += ("band_reduce_tasks", "pair_verify_tasks", "pair_verify_elsewhere")
        figures = {k: stats[k] for k in keys if k in stats}
        print(
            f"{partition:5} workers={workers} wall {row['wall']:6.1f} s  driver "
            f"{row['driver_cpu']:6.1f} CPU-s  workers {row['workers_cpu']:6.1f} CPU-s  {figures}"
        )
    return None


if __name__ == "__main__":
    main()
