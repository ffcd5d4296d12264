"""The packed_blocks layer alone, rebuilt (no memo) in a fresh child per run: the driver's peak
RSS (``VmHWM``) and CPU, the pool workers' CPU, and the shard index and spans digests.

``--prepare MB ROOT`` writes a race corpus of about MB of raw JSONL (``race_corpus``: 122 MB a
copy) under ROOT and builds it once with the CLI; ``ROOT [CONFIG]`` then measures the layer on
that home (CONFIG: another config file in ROOT, e.g. with ``execution: {workers: 1}``). Run the
same ROOT under the code before and after (``PYTHONPATH`` to an older tree with its ``uv.lock``,
or the code identity - and so the spans' transform names - differs).
"""

import json
import os
import resource
import sys
import time
from pathlib import Path


def _vm_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def prepare(mb: float, root: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import race

    shared = Path(__file__).resolve().parents[2] / "shared/corpora"
    made = race.write_corpus(shared, root / "src", mb)
    config = race.write_config(root, made["sources"], 2)
    built = race.cli_build(config, root)
    print(json.dumps({"raw_mb": made["jsonl_bytes"] / 1e6, "build_cpu": built["cpu"]}))


def measure(root: Path, config: str) -> None:
    os.environ.update(DAGSTER_HOME=str(root / "dagster"), CORPUS_HOME=str(root / "home"))
    from corpus_assets.core.pipeline import DIRECT_BUILDERS
    from corpus_assets.core.runtime.workspace import open_workspace

    with open_workspace(root / config) as ws:
        floor = _vm_mb("VmRSS")
        wall, cpu = time.perf_counter(), time.process_time()
        result = DIRECT_BUILDERS["packed_blocks"](ws, ws.catalog.partition_keys()[0])
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        row = {
            "wall": round(time.perf_counter() - wall, 2),
            "driver_cpu": round(time.process_time() - cpu, 2),
            "workers_cpu": round(kids.ru_utime + kids.ru_stime, 2),
            "floor_mb": round(floor),
            "peak_mb": round(_vm_mb("VmHWM")),
            "samples": result.counts["samples"],
            "shard_index": result.digests["shard_index"],
            "spans": result.digests["spans"],
        }
    print(json.dumps(row))


if __name__ == "__main__":
    if sys.argv[1] == "--prepare":
        prepare(float(sys.argv[2]), Path(sys.argv[3]))
    else:
        measure(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "corpus.yaml")
