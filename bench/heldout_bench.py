"""CPU of the held-out near-pair search: the splits layer's (full and incremental) and the gate's.

The search runs twice per build (splits layer, then the validation gate), fully
each time. This bench builds the race corpus (``race.py``'s helpers, ~110 MB of JSONL), builds
it, publishes, adds ~1% new documents and builds the child; then it re-runs, in a fresh process
each, the parent's splits layer (a build without parent: no Jaccards to reuse but dedup's),
the child's (its parent's verified pairs reused) and the gate on the child's snapshot, timing
``splits._heldout`` and the gate in CPU seconds of the process (every thread; pandas, which
DuckDB's first ``register`` imports, is imported before, as it is in a real run).

``--workers 1,2`` measures this code at each worker count instead (the same home, a config per
count): the driver's CPU in ``splits._heldout`` and the worker processes' CPU (their whole
lives: spawn, imports and the search tasks; nothing else of the layer runs on the pool with
its tokens cached), and the layer's digest, which must not change.

``--old CHECKOUT`` measures another checkout's code the same way on a copy of the home (so its
republished layers never touch the measured one), for a before/after ratio in one run:

    .venv/bin/python bench/heldout_bench.py --root /tmp/heldout-bench --old /work/main
    .venv/bin/python bench/heldout_bench.py --root /tmp/heldout-bench --reuse   # home kept
"""

import argparse
import json
import shutil
import subprocess
from pathlib import Path

import race

MEASURE = r"""
import json, resource, sys, time
import pandas  # noqa: F401 - DuckDB's first register imports it: a validation run has it already
from corpus_assets.core.publication import heldout_check, rules
from corpus_assets.core.publication.evidence import Evidence
from corpus_assets.core.runtime.pool import shared_pool
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.artifacts import get_json
from corpus_assets.core.training_view.splits import build as splits
from corpus_assets.core.runtime.snapshot_manifest import read_manifest

config, what, part = sys.argv[1:4]
spent = {}
inner = splits._heldout


def timed(*args, **kwargs):
    start = time.process_time()
    out = inner(*args, **kwargs)
    spent["cpu"] = time.process_time() - start
    spent["stats"] = {k: v for k, v in out[1].items() if not isinstance(v, str) or k == "mode"}
    return out


splits._heldout = timed
with open_workspace(config) as ws, shared_pool():
    if what == "splits":
        spent["digest"] = splits.build_splits(ws, part).digest
    else:
        manifest = read_manifest(ws.cas, ws.catalog.layer_output(part, "manifest"))
        with Evidence.load(ws.cas, ws.catalog, manifest) as ev:
            report = rules.RuleReport()
            start = time.process_time()
            findings = heldout_check.heldout_near_apart(ws)(ev, report)
            spent["cpu"] = time.process_time() - start
            spent["stats"] = {"findings": len(findings), "pairs": report.heldout_near_pairs}
workers = resource.getrusage(resource.RUSAGE_CHILDREN)  # the pool has shut down: reaped
spent["workers_cpu"] = workers.ru_utime + workers.ru_stime
print(json.dumps(spent))
"""


def setup(root: Path) -> dict[str, str]:
    """The race corpus built, published, grown by ~1% and built again: the two partitions."""
    shutil.rmtree(root, ignore_errors=True)
    corpora = Path(__file__).resolve().parents[1].parent / "shared" / "corpora"
    made = race.write_corpus(corpora, root / "src", 110)
    config = race.write_config(root, made["sources"], 2)
    full = race.cli_build(config, root)
    race.publish(config, root, full["out"])
    race.add_one_percent(corpora, root / "src", made["jsonl_bytes"])
    child = race.cli_build(config, root)
    parts = {"parent": _partition(full["out"]), "child": _partition(child["out"])}
    parts["build_cpu_s"] = {"full": full["cpu"], "incremental": child["cpu"]}
    (root / "parts.json").write_text(json.dumps(parts))
    return parts


def _partition(out: str) -> str:
    return next(x.split()[1].rstrip(":") for x in out.splitlines() if x.startswith("partition "))


def copy_home(root: Path, name: str) -> Path:
    """A copy of the built home with its own config (the other code's layers land there)."""
    other = root.parent / f"{root.name}-{name}"
    shutil.rmtree(other, ignore_errors=True)
    other.mkdir(parents=True)
    shutil.copytree(root / "home", other / "home", symlinks=True)
    text = (root / "corpus.yaml").read_text().replace(str(root / "home"), str(other / "home"))
    (other / "corpus.yaml").write_text(text)
    return other


def measure(checkout: Path, root: Path, what: str, part: str, config: Path | None = None) -> dict:
    env = dict(race.env_for(root), PYTHONPATH=str(checkout))
    python = checkout / ".venv" / "bin" / "python"
    config = config or root / "corpus.yaml"
    cmd = [str(python), "-c", MEASURE, str(config), what, part]
    done = subprocess.run(cmd, env=env, cwd=checkout, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(
    checkout: Path, root: Path, parts: dict[str, str], config: Path | None = None
) -> dict[str, dict]:
    return {
        "full": measure(checkout, root, "splits", parts["parent"], config),
        "incremental": measure(checkout, root, "splits", parts["child"], config),
        "gate": measure(checkout, root, "gate", parts["child"], config),
    }


def by_workers(root: Path, parts: dict[str, str], counts: list[int]) -> None:
    """This code at each worker count: driver and worker CPU-s, and the layer digests."""
    here = Path(__file__).resolve().parents[1]
    text = (root / "corpus.yaml").read_text()
    head = f"{'search':12s} {'workers':>7s} {'driver':>8s} {'workers':>8s} {'total':>8s}"
    print(f"{head} {'tasks':>8s}  digest")
    for count in counts:
        config = root / f"corpus-w{count}.yaml"
        lines = [line for line in text.splitlines() if not line.startswith("execution:")]
        config.write_text("\n".join([*lines, f"execution: {{workers: {count}}}"]) + "\n")
        for name, got in run(here, root, parts, config).items():
            total = got["cpu"] + got["workers_cpu"]
            print(
                f"{name:12s} {count:7d} {got['cpu']:8.2f} {got['workers_cpu']:8.2f} "
                f"{total:8.2f} {got['stats'].get('task_cpu_s', 0):8.2f}  "
                f"{got.get('digest', '')[:19]}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--reuse", action="store_true", help="keep a home built before")
    parser.add_argument("--old", type=Path, help="another checkout to measure, e.g. /work/main")
    parser.add_argument("--workers", help="worker counts to compare, e.g. 1,2 (this code)")
    args = parser.parse_args()
    root = args.root.resolve()
    parts = json.loads((root / "parts.json").read_text()) if args.reuse else setup(root)
    if args.workers:
        by_workers(root, parts, [int(n) for n in args.workers.split(",")])
        return
    here = Path(__file__).resolve().parents[1]
    results = {"new": run(here, root, parts)}
    if args.old is not None:
        results["old"] = run(args.old.resolve(), copy_home(root, "old"), parts)
    print(json.dumps(results, indent=1))
    if "build_cpu_s" in parts:
        print("whole builds, CPU-s (this code, CLI):", parts["build_cpu_s"])
    print(f"{'search':12s} {'new cpu_s':>10s} {'old cpu_s':>10s} {'old/new':>8s}")
    for name in ("full", "incremental", "gate"):
        new = results["new"][name]["cpu"]
        old = results.get("old", {}).get(name, {}).get("cpu")
        ratio = f"{old / new:8.1f}" if old else ""
        print(f"{name:12s} {new:10.2f} {old if old is not None else float('nan'):10.2f} {ratio}")


if __name__ == "__main__":
    main()
