"""One large file per source against the same corpus in 64 MB files: each layer's peak and CPU.

Users hand over what their tools wrote, often one large JSONL a source. The corpus of
``race.py`` (copies of the shared corpora) is written twice: as the race writes it, in objects
of 64 MB (the named baseline), and as one object per source (fortunes alone is ~550,000 short
documents in one file at 1.1 GB). Each layer is built in a fresh child of ``race.py --child``
over a fresh home, one home per layout, and the table gives both layouts' peak RSS of the
layer's process (VmHWM), its CPU (the process and its pool workers) and the ratios. Canonical
records are cut into chunks of at most 4 row groups (``records.pieces``), so the later layers'
tasks are bounded whatever an object's size; before, a file was one chunk, and its tasks ran
as lone jobs in the layer's process. Usage:

    .venv/bin/python bench/large_objects.py --mb 1100 [--workers 2] [--tmp DIR] [--json FILE]

Run the code before a change by putting its checkout first on ``PYTHONPATH`` (the children
inherit the environment).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import race
from race_corpus import write_corpus

LAYOUTS = {"64 MB files": 64, "one file a source": 1 << 20}  # object_mb; the baseline first


def measure(corpora: Path, root: Path, mb: float, object_mb: int, workers: int) -> list[dict]:
    """Every layer of a first build over ``mb`` MB written in objects of ``object_mb`` MB."""
    shutil.rmtree(root, ignore_errors=True)
    made = write_corpus(corpora, root / "src", mb, object_mb=object_mb)
    config = race.write_config(root, made["sources"], workers)
    env = race.env_for(root)
    subprocess.run([sys.executable, race.__file__, "--freeze", str(config)], check=True, env=env)
    rows = race.per_layer(config, env, "race-p1")
    shutil.rmtree(root, ignore_errors=True)
    return rows


def report(results: dict[str, list[dict]]) -> None:
    base, large = (results[name] for name in LAYOUTS)
    print(f"\n{' / '.join(LAYOUTS)}: the layer's process, its largest worker, CPU (with workers)")
    print("\n| layer | peak MB | ratio | worker peak MB | CPU-s | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for b, g in zip(base, large, strict=True):
        peaks = f"{b['peak_mb']:.0f} / {g['peak_mb']:.0f}"
        workers = f"{b['worker_peak_mb']:.0f} / {g['worker_peak_mb']:.0f}"
        cpu = f"{b['cpu']:.1f} / {g['cpu']:.1f}"
        ratio = g["cpu"] / b["cpu"] if b["cpu"] else 1.0
        peak_ratio = g["peak_mb"] / b["peak_mb"]
        print(f"| {b['layer']} | {peaks} | {peak_ratio:.2f}x | {workers} | {cpu} | {ratio:.2f}x |")
    small, big = (max(r["peak_mb"] for r in rows) for rows in (base, large))
    print(f"\nlargest layer: {small:.0f} MB / {big:.0f} MB ({big / small:.2f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared = Path(__file__).resolve().parents[2] / "shared/corpora"
    parser.add_argument("--corpora", default=str(shared))
    parser.add_argument("--mb", type=float, default=1100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tmp")
    parser.add_argument("--json")
    parser.add_argument("--report", metavar="JSON", help="only print the table of an earlier run")
    args = parser.parse_args()
    if args.report:
        return report(json.loads(Path(args.report).read_text()))
    tmp = Path(args.tmp or tempfile.mkdtemp(prefix="large-objects-"))
    race.compile_package()
    print(
        f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, a 10^7-add Python loop "
        f"{race.python_loop_s():.2f} CPU-s; workers={args.workers}; {args.mb:.0f} MB",
        flush=True,
    )
    results = {}
    for n, (name, object_mb) in enumerate(LAYOUTS.items()):
        rows = measure(Path(args.corpora), tmp / f"layout{n}", args.mb, object_mb, args.workers)
        results[name] = rows
        print(f"{name}: done", flush=True)
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
