"""numpy bytes the dedup driver holds in each phase of ``decide`` and of the output after it,
traced (``tracemalloc``).

One dedup rebuild of a ``race.py --peaks`` home in this process, as ``race.py --child --direct``
runs it, with each phase wrapped: the traced bytes when the phase starts and its peak, and both
per record above what was traced when ``decide`` started (the driver's own arrays: the tasks'
memory is in their workers, and DuckDB's and Arrow's pages are not traced; but the local runner
runs a lone job in the driver, so a class with one band map job puts that task's arrays in the
near stage's peak, where Ray runs it on a worker). The named baseline is another checkout
measured the same way (``--checkout``): a phase it lacks is left out. Run with ``stages:
runner`` in the config (``execution: {workers: 2, stages: runner}``), the path a Ray build's
driver takes. ``--held PHASE`` also lists what is held when PHASE starts, by the allocating
line (tracing 12 frames a block: slower).

    DAGSTER_HOME=H/dagster CORPUS_HOME=H/home .venv/bin/python bench/decide_memory.py \\
        H/runner.yaml [--checkout DIR] [--held PHASE]
"""

import argparse
import importlib
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

# (module under corpus_assets.core.dedup, attribute path, label), in the order decide runs them
PHASES = (
    ("clusters", "decide", "decide"),
    ("task_coding", "TaskCoding.id_rank", "id ranks placed"),
    ("partition_db", "PartitionDb.total_order", "total order"),
    ("task_coding", "TaskCoding.exact", "exact copies"),
    ("near_stage", "NearStage.run", "near stage"),
    ("task_coding", "TaskCoding.group_codes", "group codes placed"),
    ("clusters", "_leakage_rows", "leakage rows (driver codes)"),
    ("task_coding", "TaskCoding.leakage", "leakage rows (merges' groups)"),
    ("dedup_clusters", "store_pairs", "verified pairs stored"),
    ("dedup_clusters", "put_decisions", "decisions table"),
    ("dedup_clusters", "reused_parts", "parent parts kept"),
    ("dedup_clusters", "_decisions", "decisions file for the join"),
    ("dedup_clusters", "_put_clusters", "clusters parts"),
)


def _wrapped(
    label: str, fn: Callable[..., Any], seen: list[tuple[str, float, float]], held: list[Any]
) -> Any:
    def phase(*args: Any, **kwargs: Any) -> Any:
        before = tracemalloc.get_traced_memory()[0]
        if held and held[0] == label:
            held.append(tracemalloc.take_snapshot())
        tracemalloc.reset_peak()
        try:
            return fn(*args, **kwargs)
        finally:
            seen.append((label, before, tracemalloc.get_traced_memory()[1]))

    return phase


def _wrap(seen: list[tuple[str, float, float]], held: list[Any]) -> None:
    """Wrap each phase the checkout has (a nested phase resets the outer one's peak, so the
    outer ``decide`` line shows its start only)."""
    for module_name, path, label in PHASES:
        owner: Any = importlib.import_module(f"corpus_assets.core.dedup.{module_name}")
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        if hasattr(owner, name):
            setattr(owner, name, _wrapped(label, getattr(owner, name), seen, held))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--partition", default="race-p1")
    parser.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument(
        "--held", metavar="PHASE", help="also list what is held when PHASE starts, by site"
    )
    args = parser.parse_args()
    sys.path[:0] = [str(args.checkout), str(Path(__file__).parent)]
    import race  # bench/ is not a package: its folder is on the path

    seen: list[tuple[str, float, float]] = []
    held: list[Any] = [args.held] if args.held else []
    _wrap(seen, held)
    tracemalloc.start(HELD_FRAMES if args.held else 1)
    race.child(args.config, args.partition, "dedup_clusters", direct=True)

    start = next(before for label, before, _ in seen if label == "decide")
    records = _records(args.config, args.partition)
    print(
        f"{records} records; outputs {_outputs(args.config, args.partition)} (the same bytes: "
        f"the same digest); traced at decide's start {start / 1e6:.1f} MB"
    )
    for label, before, peak in seen:
        if label == "decide":
            continue
        print(
            f"{label:32} start {before / 1e6:6.1f} MB  peak {peak / 1e6:6.1f} MB  "
            f"{(peak - start) / max(records, 1):5.1f} B a record above decide's start"
        )
    if len(held) > 1:
        _print_held(held[0], held[1], records)


HELD_FRAMES = 12  # frames kept per allocation: enough to reach the dedup module that holds it


def _print_held(label: str, snapshot: tracemalloc.Snapshot, records: int) -> None:
    """The largest blocks held when ``label`` started, by the innermost corpus_assets frame
    that allocated them (numpy's own frames say nothing of who holds the array)."""
    sizes: dict[str, int] = {}
    for trace in snapshot.traces:
        ours = [f for f in trace.traceback if "corpus_assets" in f.filename]
        frame = ours[-1] if ours else trace.traceback[-1]
        site = f"{Path(frame.filename).name}:{frame.lineno}"
        sizes[site] = sizes.get(site, 0) + trace.size
    print(f"held when {label!r} started, by site:")
    for site, size in sorted(sizes.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {site:40} {size / 1e6:7.1f} MB  {size / max(records, 1):5.1f} B a record")


def _outputs(config: str, partition: str) -> str:
    """A digest of the layer's bytes that does not name the code: every clusters part, the
    edges, decisions and report (the parts document itself names the code)."""
    import hashlib

    from corpus_assets.core.runtime.layer_index import read_layer_index
    from corpus_assets.core.runtime.parted_table import PartedTable
    from corpus_assets.core.runtime.workspace import open_workspace

    with open_workspace(config) as ws:
        _, index = read_layer_index(ws, partition, "dedup_clusters")
        parts = PartedTable.read(ws.cas, index.output("clusters"), "dedup clusters").refs
        names = [ref["digest"] for ref in parts]
        names += [index.output(name)["digest"] for name in ("edges", "decisions", "report")]
    return hashlib.sha256(" ".join(names).encode()).hexdigest()[:16]


def _records(config: str, partition: str) -> int:
    from corpus_assets.core.records.index import CanonicalIndex
    from corpus_assets.core.runtime.workspace import open_workspace

    with open_workspace(config) as ws:
        _, canonical = CanonicalIndex.read(ws, partition)
        return sum(chunk.count for chunk in canonical.chunks())


if __name__ == "__main__":
    main()
