"""+1% children of a race home two ways, interleaved: the CLI build, and the same layers with no
Dagster and no dataset card - what a child would cost if the build's fixed cost were gone.

A race home (``bench/race.py --sizes N --tmp DIR`` leaves ``DIR/mbN``: sources, config, an
active parent) gets a new appended ~1% object per source per child, copy K of the shared corpora
(``race_corpus.write_delta``; K new text: ``child_ab.check_copies`` refuses a copy the home's
corpus holds or one built in it before, as ``race.py``, ``child_ab.py`` and this script list
theirs in the home). The child is built either by ``corpus-assets build``
or, in a fresh process that imports ``corpus_assets.core`` only, by the freeze,
``pipeline.build_all`` (the seven layers) and the build's check (``validate_snapshot`` as the
validation asset runs it). Nothing is approved, so each is a child of the same parent. CPU-s
of each process tree (``race.run_measured``); the named baseline is the CLI build; medians,
and each over ``--full`` (a full build's CPU-s, e.g. the race's) when given.

    .venv/bin/python bench/core_only_child.py HOME --copies 19,18,17,16,15,14 [--full 26.6]
"""

import argparse
import statistics
import sys
from pathlib import Path

CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"


def core_only(config: str, partition: str) -> None:
    """The child's layers and check in this process, without Dagster or the card."""
    from corpus_assets.core.ingest.freeze import freeze
    from corpus_assets.core.pipeline import build_all
    from corpus_assets.core.publication.validation import validate_snapshot
    from corpus_assets.core.runtime.absent_imports import go_without
    from corpus_assets.core.runtime.workspace import open_workspace
    from corpus_assets.core.storage.memory import freeze_startup_heap

    go_without("pandas")  # as ``corpus-assets build`` runs
    with open_workspace(config) as ws:
        freeze_startup_heap()
        freeze(ws, partition)
        build_all(ws, partition)
        manifest = ws.catalog.layer_output(partition, "manifest")
        report = validate_snapshot(ws, manifest, trust_unchanged=True)  # as the build's check
        if report.findings:
            raise SystemExit(f"the check refused {partition}: {report.findings}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("home", type=Path)
    parser.add_argument("--copies", help="comma-separated, new text each, two per pair")
    parser.add_argument("--full", type=float, help="a full build's CPU-s, for the ratios")
    parser.add_argument("--corpora", type=Path, default=CORPORA)
    parser.add_argument("--core-only", nargs=2, metavar=("CONFIG", "PARTITION"))
    args = parser.parse_args()
    if args.core_only:
        return core_only(*args.core_only)
    if not args.copies:
        parser.error("--copies is required")
    # not in the core-only process, which imports corpus_assets.core only
    from child_ab import USED, check_copies, raw_bytes
    from race import env_for, run_measured
    from race_corpus import write_delta

    copies = [int(c) for c in args.copies.split(",")]
    check_copies(copies, [args.home], args.corpora)  # new text, built nowhere in the home yet
    config = str(args.home / "corpus.yaml")
    jsonl = raw_bytes(args.home / "src")
    cli = [sys.executable, "-m", "corpus_assets.cli", "--config", config, "build"]
    here = [sys.executable, __file__, str(args.home), "--core-only", config]
    ways = {"cli": lambda copy: cli, "core only": lambda copy: [*here, f"core-only-{copy}"]}
    cpus: dict[str, list[float]] = {way: [] for way in ways}
    for n, copy in enumerate(copies):
        way = list(ways)[n % 2]
        write_delta(args.corpora, args.home / "src", copy, jsonl // 100)
        cpus[way].append(run_measured(ways[way](copy), env_for(args.home))["cpu"])
        with (args.home / USED).open("a") as used:
            used.write(f"{copy}\n")
        print(f"{way} copy {copy}: {cpus[way][-1]:.2f} CPU-s", file=sys.stderr)
    for way, runs in cpus.items():
        median = statistics.median(runs)
        ratio = f", {median / args.full:.3f} of the full build" if args.full else ""
        print(f"{way}: median {median:.2f} CPU-s ({', '.join(f'{c:.2f}' for c in runs)}){ratio}")


if __name__ == "__main__":
    main()
