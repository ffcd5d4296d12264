"""The dedup layer on 1, 2 and 4 Ray workers (one machine, loopback), against the in-process path.

The corpus (``race_corpus.py``: the shared corpora scaled to ``--mb`` of JSONL) is frozen and
its raw snapshot, canonical records and MinHash signatures are built once, locally; then the
dedup layer itself (no layer memo: banding, verification, the scan, the clusters join) runs in a
fresh child per configuration:

- ``local x1``: ``execution.workers: 1``, the in-process path (the named baseline);
- ``local x2``: two spawn-pool workers running the same tasks as Ray's;
- ``ray xN``: a Ray cluster of one node with N CPUs, banding and verification as map and reduce
  tasks on it (``core/dedup/band_runner.py``).

Printed per configuration: wall, the driver's CPU (the child process alone), the cluster's CPU
(every Ray process, ``race_ray.py``), the driver's share, the driver's peak RSS, the layer
digest (equal everywhere: bytes never depend on the engine or worker count) and wall speed-up
against ``ray x1``. Then a paper estimate for 1 TB from the per-GB figures. With 2 cores here,
4 workers oversubscribe the machine: that row shows the cost of more tasks, not more speed.

    .venv/bin/python bench/dedup_scaling.py --mb 1100 [--workers 1,2,4] [--tmp DIR]
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from race import compile_package, env_for, run_measured, write_config
from race_corpus import write_corpus
from race_ray import Cluster

PARTITION = "scale-p1"
PREREQUISITES = "raw_snapshot,canonical_records,dedup_clusters"  # the last one caches signatures


def child(config: str) -> None:
    """Run the dedup layer once (no memo) and print what it cost in this process."""
    from corpus_assets.core.pipeline import DIRECT_BUILDERS
    from corpus_assets.core.runtime.workspace import open_workspace

    with open_workspace(config) as ws:
        wall, cpu, pool = time.perf_counter(), time.process_time(), _children_cpu()
        result = DIRECT_BUILDERS["dedup_clusters"](ws, PARTITION)
        figures = {
            "wall": time.perf_counter() - wall,
            "driver_cpu": time.process_time() - cpu,
            "pool_cpu": _children_cpu() - pool,
            "driver_peak_mb": _vm_hwm_mb(),
            "digest": result.digest,
            "run_stats": result.run_stats,
        }
    print(json.dumps(figures))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _vm_hwm_mb() -> float:
    with open("/proc/self/status") as fh:
        line = next(x for x in fh if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def measure(config: Path, root: Path, cluster: Cluster | None) -> dict:
    env = {**env_for(root), **(cluster.env() if cluster else {})}
    before = cluster.cpu_seconds() if cluster else 0.0
    done = run_measured([sys.executable, __file__, "--child", str(config)], env)
    figures = json.loads(done["out"].strip().splitlines()[-1])
    figures["cluster_cpu"] = (cluster.cpu_seconds() - before) if cluster else 0.0
    # the layer's CPU wherever it ran (the child's start-up and imports left out)
    figures["total_cpu"] = figures["driver_cpu"] + figures["pool_cpu"] + figures["cluster_cpu"]
    return figures


def configure(config: Path, execution: str) -> None:
    lines = [x for x in config.read_text().splitlines() if not x.startswith("execution:")]
    config.write_text("\n".join([*lines, f"execution: {execution}"]) + "\n")


def prepare(corpora: Path, root: Path, mb: float) -> tuple[Path, float]:
    """The corpus, its config, and every layer dedup reads (plus cached signatures)."""
    shutil.rmtree(root, ignore_errors=True)
    made = write_corpus(corpora, root / "src", mb)
    config = write_config(root, made["sources"], 2)
    build_prerequisites(config, root)
    return config, made["jsonl_bytes"] / 1e6


def build_prerequisites(config: Path, root: Path) -> None:
    """The layers dedup reads and its signatures, built (or found) with the code at hand: a
    reused home built by other code would make the first measured run pay for re-hashing."""
    configure(config, "{workers: 2}")
    race = [sys.executable, str(Path(__file__).with_name("race.py"))]
    subprocess.run(
        [*race, "--layers", str(config), PARTITION, "--only", PREREQUISITES],
        check=True,
        env=env_for(root),
        stdout=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shared = Path(__file__).resolve().parents[2] / "shared/corpora"
    parser.add_argument("--corpora", type=Path, default=shared)
    parser.add_argument("--mb", type=float, default=1100)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--tmp", type=Path, default=Path("/tmp/corpus-dedup-scaling"))
    parser.add_argument("--child", metavar="CONFIG")
    parser.add_argument("--reuse", action="store_true", help="keep a home an earlier run made")
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    compile_package()
    made = args.tmp / "prepared.json"
    if args.reuse and made.is_file():
        config, mb = args.tmp / "corpus.yaml", json.loads(made.read_text())["mb"]
        build_prerequisites(config, args.tmp)
    else:
        config, mb = prepare(args.corpora, args.tmp, args.mb)
        made.write_text(json.dumps({"mb": mb}))
    rows = {}
    for workers in (1, 2):  # the in-process path, then the local pool's tasks
        configure(config, f"{{workers: {workers}}}")
        rows[f"local x{workers}"] = measure(config, args.tmp, None)
    for n in (int(w) for w in args.workers.split(",")):
        with Cluster(1, n) as cluster:
            configure(config, f"{{engine: ray, address: '{cluster.address}'}}")
            rows[f"ray x{n}"] = measure(config, args.tmp, cluster)
        print(f"ray x{n} done", file=sys.stderr)
    report(rows, mb)


def report(rows: dict[str, dict], mb: float) -> None:
    print(f"\n#### Dedup layer at {mb:.0f} MB of raw JSONL ({os.cpu_count()} CPUs here)\n")
    print(
        "| run | wall s | driver CPU s | cluster CPU s | total CPU s | driver share | "
        "driver peak MB | wall vs ray x1 | layer digest |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    one = rows.get("ray x1", next(iter(rows.values())))
    for name, r in rows.items():
        print(
            f"| {name} | {r['wall']:.1f} | {r['driver_cpu']:.1f} | {r['cluster_cpu']:.1f} | "
            f"{r['total_cpu']:.1f} | {r['driver_cpu'] / r['total_cpu']:.0%} | "
            f"{r['driver_peak_mb']:.0f} | {one['wall'] / r['wall']:.2f}x | {r['digest'][:19]} |"
        )
    digests = {r["digest"] for r in rows.values()}
    print(f"\nlayer digests equal across runs: {len(digests) == 1}")
    ray = rows.get("ray x2", one)
    per_gb = {k: ray[k] / (mb / 1000) for k in ("driver_cpu", "cluster_cpu")}
    print(
        f"\nPaper estimate for 1 TB from `{next(k for k, v in rows.items() if v is ray)}`: "
        f"{per_gb['cluster_cpu']:.0f} cluster CPU-s and {per_gb['driver_cpu']:.0f} driver CPU-s "
        "per GB; the driver's part is serial, the cluster's divides by its cores:"
    )
    for nodes, cores in ((10, 16), (100, 16)):
        cluster_h = per_gb["cluster_cpu"] * 1000 / (nodes * cores) / 3600
        driver_h = per_gb["driver_cpu"] * 1000 / 3600
        print(
            f"- {nodes} nodes x {cores} cores: {cluster_h:.1f} h on the cluster + "
            f"{driver_h:.1f} h on the driver = {cluster_h + driver_h:.1f} h"
        )


if __name__ == "__main__":
    main()
