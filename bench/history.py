"""A home's history against a child's cost: does a daily +1% build cost more as snapshots pile up?

A scheduled build of a growing corpus approves and activates a new snapshot every day, so its
home keeps every generation: snapshots and their states, Dagster runs and events, memo and trust
rows, CAS objects, alias history, deletion-index chains. Nothing a child does should grow with
that history, only with its parent. Here one race corpus (``race_corpus.py``, ``--mb`` of raw
JSONL) is built once, then ``--generations`` times a +1% object of new text (copy K, as the
race's children) replaces the last one, the child is built, approved and activated, so that each
generation is the next one's parent and the corpus keeps its size: what moves is the history.

It prints each generation's build CPU (process tree, ``wait4``), its approval and activation CPU,
``corpus-assets status`` wall, the machine's 10^7-add loop (the machine drifts by phases of
minutes: a step in the loop is the machine, not the code), then the median of the first and the
last ``--window`` generations and their ratio, and the least-squares slope of build CPU per
generation with its standard error, and the same for approval with activation and for the size of
the snapshot's closure (the CAS objects ``verify`` re-hashes and gc keeps for it: deterministic,
so it shows growth the machine's drift hides). Flat history: a closure that does not grow, and
CPU slopes within about two errors of 0. The errors assume independent generations, which a
machine whose slow phases last several generations does not give: a CPU slope a little over
two errors, with the closure flat and the last generations back at the first ones' CPU, is the
machine. ``polyfit`` needs three generations for its error.

    .venv/bin/python bench/history.py --tmp DIR [--mb 110] [--generations 24] [--json OUT]

At 110 MB the corpus is copy 0, and each of copies 1-25 holds 17 slices of 1% (the smallest
source's count): 425 generations of new text.
"""

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

import numpy as np
from race import (
    CLI,
    build_child,
    cli_build,
    compile_package,
    env_for,
    publish,
    python_loop_s,
    run_measured,
    snapshot_of,
    write_config,
)
from race_corpus import delta_parts, write_corpus

from corpus_assets.core.publication.verify import reachable, resolve
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.artifacts import JSON, make_ref

CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"
ROTATIONS = 26  # copy K rotates letters by K mod 26: copies from the corpus's count to 25 are new


def generation(
    config: Path, root: Path, copy: int, part: int, jsonl_bytes: int, gc: bool = False
) -> dict:
    """One day: a +1% object (slice ``part`` of copy ``copy``) built as a child, then approved
    and activated (then ``corpus-assets gc`` when ``gc``)."""
    built = build_child(config, root, CORPORA, copy, jsonl_bytes, part=part)
    published = publish(config, root, built["out"])
    collected = run_measured([*CLI, "--config", str(config), "gc"], env_for(root)) if gc else None
    status = run_measured([*CLI, "--config", str(config), "status"], env_for(root))
    objects, size = closure(config, snapshot_of(built["out"]))
    return {
        "copy": copy,
        "part": part,
        "build_cpu": built["cpu"],
        "build_wall": built["wall"],
        "publish_cpu": published,
        "status_wall": status["wall"],
        "loop_s": python_loop_s(),
        "closure_objects": objects,
        "closure_mb": size / 1e6,
        "gc_cpu": collected["cpu"] if collected else None,
        "cas_mb": tree_bytes(root / "home" / "cas") / 1e6,
        "dagster_mb": tree_bytes(root / "dagster") / 1e6,
        "catalog_mb": (root / "home" / "catalog.sqlite").stat().st_size / 1e6,
    }


def tree_bytes(folder: Path) -> int:
    """The bytes of every file under ``folder``: what the home keeps of its history."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def closure(config: Path, snapshot_id: str) -> tuple[int, int]:
    """How many CAS objects, and bytes, the snapshot's closure holds: what verify re-hashes
    (approval, activation, scrub) and gc keeps for it."""
    ws = open_workspace(config)  # the race's config names its home
    try:
        manifest = resolve(ws.catalog, snapshot_id).manifest_digest
        named, _ = reachable(ws.cas, [make_ref(manifest, JSON, ws.cas.size(manifest))])
        return len(named), sum(ws.cas.size(digest) for digest in named)
    finally:
        ws.close()


def new_text(held: int, parts: int) -> list[tuple[int, int]]:
    """Each day's (copy, slice): copies from ``held`` (those the corpus holds apart) to 25, each
    slice of every copy before the next slice of any."""
    return [(copy, part) for part in range(parts) for copy in range(held, ROTATIONS)]


SERIES = {  # what each generation's row is summed up by: name -> (key, unit)
    "build CPU": ("build_cpu", "s"),
    "approve+activate CPU": ("publish_cpu", "s"),
    "closure": ("closure_mb", "MB"),
    "Dagster's storage": ("dagster_mb", "MB"),
    "catalog": ("catalog_mb", "MB"),
}


def summary(days: list[dict], key: str, window: int) -> dict:
    """Medians of the first and last ``window`` generations, their ratio, the fitted slope."""
    values = [day[key] for day in days]
    first, last = statistics.median(values[:window]), statistics.median(values[-window:])
    fit, cov = np.polyfit(np.arange(len(values)), values, 1, cov=True)
    slope, error = float(fit[0]), float(np.sqrt(cov[0][0]))
    return {"first": first, "last": last, "ratio": last / first, "slope": slope, "error": error}


def _cpu(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(days: list[dict], window: int, mb: float) -> None:
    print(f"\n#### A +1% child a day over {mb:.0f} MB, approved and activated each day\n")
    print(
        "| generation | copy/slice | build CPU s | build wall s | approve+activate CPU s "
        "| status s | loop s | closure: objects, MB | gc CPU s | CAS, Dagster, catalog MB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, day in enumerate(days, 1):
        print(
            f"| {n} | {day['copy']}/{day.get('part', 0)} | {day['build_cpu']:.2f} | "
            f"{day['build_wall']:.2f} | {day['publish_cpu']:.2f} | {day['status_wall']:.2f} | "
            f"{day['loop_s']:.2f} | "
            f"{day['closure_objects']}, {day['closure_mb']:.0f} | {_cpu(day.get('gc_cpu'))} | "
            f"{day.get('cas_mb', 0):.0f}, {day.get('dagster_mb', 0):.1f}, "
            f"{day.get('catalog_mb', 0):.1f} |"
        )
    print()
    series = {**SERIES, **({"gc CPU": ("gc_cpu", "s")} if days[0].get("gc_cpu") else {})}
    for name, (key, unit) in series.items():
        s = summary(days, key, window)
        print(
            f"{name}: median of the first {window} generations {s['first']:.2f} {unit}, of the "
            f"last {window} {s['last']:.2f} {unit} ({s['ratio']:.2f}x); slope "
            f"{s['slope']:+.3f} +- {s['error']:.3f} {unit} per generation (least squares and "
            "its standard error)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tmp", type=Path, required=True)
    parser.add_argument("--mb", type=float, default=110)
    parser.add_argument("--generations", type=int, default=24, help="at least 3")
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--keep", type=int, help="retention.keep_generations, and gc after each generation"
    )
    args = parser.parse_args()
    compile_package()
    root = args.tmp / "history"
    shutil.rmtree(root, ignore_errors=True)
    made = write_corpus(CORPORA, root / "src", args.mb)
    config = write_config(root, made["sources"], args.workers)
    if args.keep:
        with config.open("a") as out:
            out.write(f"retention: {{keep_generations: {args.keep}}}\n")
    publish(config, root, cli_build(config, root)["out"])  # generation 0: the first parent
    days = []
    news = new_text(made["copies"], delta_parts(CORPORA, made["jsonl_bytes"] // 100))
    if args.generations > len(news):
        sys.exit(f"--generations: at most {len(news)} at {args.mb} MB (new text each day)")
    for copy, part in news[: args.generations]:
        days.append(generation(config, root, copy, part, made["jsonl_bytes"], bool(args.keep)))
        print(f"generation {len(days)}: {days[-1]['build_cpu']:.2f} CPU-s", file=sys.stderr)
        if args.json:
            args.json.write_text(json.dumps(days, indent=1))
    report(days, args.window, made["jsonl_bytes"] / 1e6)


if __name__ == "__main__":
    main()
