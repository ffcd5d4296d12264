"""The whole build at three corpus sizes: speed, CPU, peak memory, re-build and incremental cost.

For each size (MB of raw JSONL, made from the shared corpora by ``race_corpus.py``: copies that
keep their internal duplicates and share nothing with each other) it measures, on one machine:

- per layer (and the validation check), each in a fresh child process running only that layer:
  wall seconds, CPU seconds (the child and its pool workers), peak RSS of the child (VmHWM) and
  of its largest worker;
- the whole ``corpus-assets build`` (the CLI through Dagster, fresh data home): wall, CPU,
  MB/s and MB per CPU-second of raw text, peak RSS of the largest process; built once before
  the children and again, in a fresh home each time, before each later pair of children (see
  below): the figure is the median by CPU, every build's CPU beside it. The machine's speed
  drifts by up to 3x over minutes (its 10^7-add loop took 0.36 to 1.20 s on one evening), so a
  ratio of children to one full build measured minutes apart read the drift as much as the
  code (122 MB: 27.0 CPU-s one evening, 40.8 the next start);
- an unchanged re-build (a second partition over the same bytes) against Dagster's start-up
  (``corpus-assets status`` on the same home, the floor any command pays);
- incremental builds after appending 1% more documents (a new object per source, named to sort
  after the source's objects, as a numbered or dated part does) against the full build; the
  build before them is approved and activated, so it is their parent (the layers that reuse a
  parent's work - dedup's verified pairs, packing's blocks - do so). ``--children N`` (default
  3) builds N such children over that one parent, each of new text (nothing is approved between
  them), and shows the median by CPU with every child's CPU: one child is one sample of a
  machine whose speed drifts. Interleaved with them, N children whose new object sorts before
  the source's others (``race_corpus.PREPENDED``, the race's only kind until 2026-12-07): each
  source's first chunk - the canary's - is then the new one, and every parent row moves; their
  median is shown beside. Beside both, the median appended child's CPU beyond the unchanged
  re-build's (the cost every build pays: imports, Dagster's run, the check and the card over
  reused layers), over the full build's;
- a first build of only the objects the last appended child added, in a fresh home: what the new
  documents cost with no parent; that snapshot is then approved and activated and ``--children``
  +1% children (~12 kB of new text at 122 MB) are built over it: the **floor**, what a child
  costs when its parent is ~1% of the corpus, so that almost nothing but a build's fixed cost
  (imports, Dagster's run, each layer's set-up, the check, the card) is left. Over the full
  build it is the least incremental ratio any per-record work could reach at that size.

The named baseline for speed is ``zstd -dc | wc -l`` over the same objects (reading the bytes
once), measured in the same run. The first line also gives a probe of the machine's speed (a
10^7-add Python loop's CPU-s): machines of one class differ, and one machine's speed drifts
(2.3-3.4 s, then 0.66 s, on one machine within two hours of 2026-12-05). It catches the CPU's
drift, not all of it: at 0.66 s that machine's 122 MB build still took 50.8 CPU-s (25.5 on a fast
one) and ``status`` 2.3 s (about 1): compare builds only with a build run beside them. Usage:

    .venv/bin/python bench/race.py --sizes 110,330,1100 [--workers 2] [--tmp DIR]
    .venv/bin/python bench/race.py --incremental-layers 110   # each layer of a +1% child
    .venv/bin/python bench/race.py --engine ray [--ray-nodes 1]  # chunk tasks on a Ray cluster
    .venv/bin/python bench/race.py --engine ray --peaks --sizes 110,330,1100 --tmp DIR [--reuse]
    .venv/bin/python bench/race.py --child CONFIG PARTITION LAYER --direct [--identity-as DIR]

``--peaks`` prints only the driver's peak per layer (dedup_clusters on), each layer built again
in a fresh child by its direct builder (no layer memo, no recorded gate outcome), over one data
home per size under ``--tmp``; with ``--reuse`` a home (corpus, freeze, built layers) made by an
earlier ``--peaks`` run is measured again instead of being made anew (the 1.1 GB corpus takes
minutes of CPU to make and canonicalise).

``--child`` rebuilds one layer of an existing partition in this process and prints its cost;
``--identity-as DIR`` runs this checkout's code under the code identities of the checkout at
``DIR`` (``identity_as/sitecustomize.py``), so an edited layer finds the state its parent's
build (by the code at ``DIR``) left and is measured as a child, not as a first build.

With ``--engine ray`` a local Ray cluster (``race_ray.py``: ``--ray-nodes`` nodes of
``--workers`` CPUs, loopback) runs the chunk tasks; every CPU figure adds what the cluster's
processes spent during the measured command, and the per-layer table also shows the driver's
own CPU (the process running the layer, without its workers).

The package is byte-compiled first, as an installed one is (``PYTHONDONTWRITEBYTECODE`` would
otherwise make every process compile it); the validation row is the build's check (tables
unchanged on disk since they hashed right are trusted), not ``verify``'s full re-hash.
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from child_ab import USED, raw_bytes
from race_corpus import APPENDED, DELTAS, PREPENDED, write_corpus, write_delta
from race_ray import Cluster

from corpus_assets.core.runtime.layer_index import LAYERS as BUILD_ORDER

LAYERS = [*BUILD_ORDER, "validation"]
CLI = [sys.executable, "-m", "corpus_assets.cli"]
CLUSTER: Cluster | None = None  # --engine ray: the cluster every command's chunk tasks run on


def _vm_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def child(config: str, partition: str, layer: str, direct: bool = False) -> None:
    """Run one layer (or the validation check) of ``partition`` and print what it cost; with
    ``direct`` the layer is built again (no memo) and the check runs every rule of its own (a
    parent's recorded outcomes stay: they bound a child's held-out search, as in a build).
    Without pandas, as ``corpus-assets build`` runs (``cli.parser.NO_PANDAS``): pyarrow would
    import it at the layer's first table, ~0.2 CPU-s a build never pays."""
    from corpus_assets.core.pipeline import BUILDERS, DIRECT_BUILDERS, released
    from corpus_assets.core.publication.validation import validate_snapshot
    from corpus_assets.core.runtime.absent_imports import go_without
    from corpus_assets.core.runtime.workspace import open_workspace
    from corpus_assets.core.storage.catalog import gate_results
    from corpus_assets.core.storage.memory import freeze_startup_heap

    go_without("pandas")

    with open_workspace(config) as ws:
        if direct and layer == "validation":  # no recorded outcome stands in for a rule
            # of this snapshot only: the parent's passing outcomes bound a child's search
            mine = gate_results.c.manifest_digest == ws.catalog.layer_output(partition, "manifest")
            with ws.catalog.begin() as conn:
                conn.execute(gate_results.delete().where(mine))
        freeze_startup_heap()  # as the build does before its first layer: no full collection
        floor_kb = _vm_kb("VmRSS")  # of the start-up heap is counted in the layer's CPU
        wall, cpu = time.perf_counter(), time.process_time()
        digests: dict[str, str] = {}
        if layer == "validation":
            manifest = ws.catalog.layer_output(partition, "manifest")
            report = validate_snapshot(ws, manifest, trust_unchanged=True)  # as the build's check
            assert not report.findings, report.findings
        elif direct:
            digests = released(DIRECT_BUILDERS[layer])(ws, partition).digests
        else:
            digests = BUILDERS[layer](ws, partition).digests
        workers = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(
            json.dumps(
                {
                    "wall": time.perf_counter() - wall,
                    "cpu": time.process_time() - cpu + workers.ru_utime + workers.ru_stime,
                    "driver_cpu": time.process_time() - cpu,
                    "peak_mb": _vm_kb("VmHWM") / 1024,
                    "floor_mb": floor_kb / 1024,
                    "worker_peak_mb": workers.ru_maxrss / 1024,
                    "digests": digests,
                }
            )
        )


def run_measured(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    """Run ``cmd`` to completion: wall, CPU and peak RSS of its own process tree (``wait4``)."""
    cluster_before = CLUSTER.cpu_seconds() if CLUSTER else 0.0
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, text=True)
        _pid, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{stdout[-2000:]}\n{stderr[-3000:]}")
    cpu = usage.ru_utime + usage.ru_stime
    cluster = CLUSTER.cpu_seconds() - cluster_before if CLUSTER else 0.0
    return {
        "wall": wall,
        "cpu": cpu + cluster,
        "cluster_cpu": cluster,
        "peak_mb": usage.ru_maxrss / 1024,
        "out": stdout,
    }


def write_config(root: Path, sources: list[dict], workers: int) -> Path:
    lines = ["version: 1", "purpose: race", "alias: race", "sources:"]
    for s in sources:
        lines.append(
            f"  - {{id: {s['id']}, kind: objects, path: {s['path']}, "
            f"include: ['*.jsonl.zst'], content: {s['content']}}}"
        )
    if CLUSTER:
        lines.append(f"execution: {{engine: ray, address: '{CLUSTER.address}'}}")
    else:
        lines.append(f"execution: {{workers: {workers}}}")
    lines.append(f"storage: {{home: {root / 'home'}}}")
    root.mkdir(parents=True, exist_ok=True)
    config = root / "corpus.yaml"
    config.write_text("\n".join(lines) + "\n")
    return config


def env_for(root: Path) -> dict[str, str]:
    env = dict(os.environ, DAGSTER_HOME=str(root / "dagster"), CORPUS_HOME=str(root / "home"))
    env.update(CLUSTER.env() if CLUSTER else {})
    (root / "dagster").mkdir(parents=True, exist_ok=True)
    return env


def per_layer(
    config: Path,
    env: dict[str, str] | None,
    partition: str,
    only: list[str] | None = None,
    direct: bool = False,
) -> list[dict]:
    rows = []
    for layer in only or LAYERS:
        cmd = [sys.executable, __file__, "--child", str(config), partition, layer]
        cmd += ["--direct"] if direct else []
        done = run_measured(cmd, env)
        rows.append({"layer": layer, **json.loads(done["out"].strip().splitlines()[-1])})
        rows[-1]["cpu"] += done["cluster_cpu"]
        rows[-1]["tree_peak_mb"] = done["peak_mb"]
    return rows


def baseline_read(src: Path) -> float:
    """``zstd -dc`` of every object into ``wc -l``: the bytes read once, no parsing."""
    files = sorted(str(p) for p in src.rglob("*.jsonl.zst"))
    start = time.perf_counter()
    subprocess.run(
        f"zstd -dc {' '.join(files)} | wc -l", shell=True, check=True, capture_output=True
    )
    return time.perf_counter() - start


CHILD_COPIES = tuple(range(25, 15, -1))  # new text at every size: the corpora hold copies 0-8
# the floor's children: new text over a parent of one of CHILD_COPIES
FLOOR_COPIES = tuple(range(35, 35 - len(CHILD_COPIES) // 2, -1))
MAX_CHILDREN = len(CHILD_COPIES) // 2  # each count is built twice: appended, and sorting first


def add_one_percent(corpora: Path, src: Path, jsonl_bytes: int, copy: int = 25) -> int:
    """A new object per source holding ~1% of the corpus's bytes as new documents of ``copy``,
    appended (sorting after the source's objects; replacing the one an earlier call wrote); the
    bytes written."""
    return write_delta(corpora, src, copy, jsonl_bytes // 100)


def delta_alone(
    root: Path, alone: Path, sources: list[dict], workers: int, corpora: Path, count: int
) -> tuple[dict, dict]:
    """A first build, in a fresh home, of only the objects the +1% step added: what the new
    documents cost with no parent at all; then ``count`` +1% children of it once it is active
    (``FLOOR_COPIES``, new text there): the floor, a child whose parent is ~1% of the corpus,
    so that its cost is almost all a build's fixed cost. Both as ``children`` reports them."""
    shutil.rmtree(alone, ignore_errors=True)
    moved = []
    for s in sources:
        folder = alone / "src" / s["id"]
        folder.mkdir(parents=True)
        # not under a delta's name: each child's ``write_delta`` replaces those
        shutil.copy(root / "src" / s["id"] / APPENDED, folder / "part-00000.jsonl.zst")
        moved.append({**s, "path": str(folder)})
    config = write_config(alone, moved, workers)
    done = cli_build(config, alone)
    publish(config, alone, done["out"])
    jsonl = raw_bytes(alone / "src")  # the objects the step added, now the parent
    floor = [build_child(config, alone, corpora, copy, jsonl) for copy in FLOOR_COPIES[:count]]
    shutil.rmtree(alone, ignore_errors=True)
    return done, _median(floor)


def build_child(
    config: Path,
    root: Path,
    corpora: Path,
    copy: int,
    jsonl_bytes: int,
    name: str = APPENDED,
    part: int = 0,
) -> dict:
    """A +1% child of the home's active snapshot: ~1% of ``jsonl_bytes`` of copy ``copy`` (its
    slice ``part``) as each source's object ``name`` (replacing the last child's), built; with
    ``added`` bytes."""
    added = write_delta(corpora, root / "src", copy, jsonl_bytes // 100, name, part)
    return {**cli_build(config, root), "added": added}


def cli_build(config: Path, root: Path, args: list[str] | None = None) -> dict:
    return run_measured([*CLI, "--config", str(config), "build", *(args or [])], env_for(root))


def snapshot_of(built: str) -> str:
    """The snapshot id a ``corpus-assets build`` printed."""
    return next(line.split()[1] for line in built.splitlines() if line.startswith("snapshotId "))


def publish(config: Path, root: Path, built: str) -> float:
    """Approve and activate the snapshot a build printed, as an operator would; their CPU-s."""
    sid = snapshot_of(built)
    runs = [
        run_measured([*CLI, "--config", str(config), *command], env_for(root))
        for command in (["approve", sid, "--by", "race"], ["activate", sid])
    ]
    return sum(run["cpu"] for run in runs)


def children(
    config: Path,
    root: Path,
    corpora: Path,
    jsonl_bytes: int,
    count: int,
    between: Callable[[], None] = lambda: None,
) -> dict:
    """``count`` +1% children of the active parent whose new object is appended (it sorts after
    each source's objects: the figure), and ``count`` whose new object sorts first (``first``:
    each source's first chunk is then the new one), interleaved, each of new text
    (``CHILD_COPIES``). Nothing is approved, so each is a child of the same parent. One child is
    one sample of a noisy machine; each figure is a median (by CPU), every child's CPU beside it.
    ``between`` runs after each pair but the last (another full build: ``race_size``)."""
    if not 1 <= count <= MAX_CHILDREN:
        sys.exit(f"--children: 1 to {MAX_CHILDREN}")
    runs: dict[str, list[dict]] = {PREPENDED: [], APPENDED: []}  # the appended last: kept
    copies = iter(CHILD_COPIES)
    for pair in range(count):
        for name, done in runs.items():
            copy = next(copies)
            done.append(build_child(config, root, corpora, copy, jsonl_bytes, name))
            with (root / USED).open("a") as used:  # refused by later benches over this home
                used.write(f"{copy}\n")
        if pair < count - 1:
            between()
    return {**_median(runs[APPENDED]), "first": _median(runs[PREPENDED])}


def another_full(root: Path, sources: list[dict], workers: int) -> dict:
    """A full build again, in a fresh home of its own, of the sources the first one read (the
    last child's new objects taken out first; the next child writes its own): the full build's
    CPU is a sample of the machine's phase as each child's is, so it is sampled between them."""
    for s in sources:
        for name in DELTAS:
            (Path(s["path"]) / name).unlink(missing_ok=True)
    config = write_config(root, sources, workers)
    done = cli_build(config, root)
    shutil.rmtree(root)
    return done


def _median(runs: list[dict]) -> dict:
    """The median run by CPU, with every run's CPU (``cpus``) in the order they ran."""
    median = sorted(runs, key=lambda run: run["cpu"])[(len(runs) - 1) // 2]
    return {**median, "cpus": [run["cpu"] for run in runs]}


def race_size(corpora: Path, tmp: Path, mb: float, workers: int, count: int = 3) -> dict:
    root = tmp / f"mb{int(mb)}"
    shutil.rmtree(root, ignore_errors=True)
    made = write_corpus(corpora, root / "src", mb)
    raw_mb = made["jsonl_bytes"] / 1e6
    config = write_config(root, made["sources"], workers)
    base = baseline_read(root / "src")
    fulls = [cli_build(config, root)]
    start = run_measured([*CLI, "--config", str(config), "status"], env_for(root))
    again = cli_build(config, root)
    publish(config, root, again["out"])  # the incremental build's parent: the alias's active one
    incremental = children(
        config,
        root,
        corpora,
        made["jsonl_bytes"],
        count,
        lambda: fulls.append(another_full(tmp / f"mb{int(mb)}-full", made["sources"], workers)),
    )
    # as many as children of each kind, one before each pair; the peak is the largest
    full = {**_median(fulls), "peak_mb": max(run["peak_mb"] for run in fulls)}
    added = incremental["added"]
    alone, floor = delta_alone(
        root, tmp / f"mb{int(mb)}-delta", made["sources"], workers, corpora, count
    )
    layers_root = tmp / f"mb{int(mb)}-layers"
    shutil.rmtree(layers_root, ignore_errors=True)
    layer_config = write_config(layers_root, made["sources"], workers)
    subprocess.run(
        [sys.executable, __file__, "--freeze", str(layer_config)],
        check=True,
        env=env_for(layers_root),
    )
    layers = per_layer(layer_config, env_for(layers_root), "race-p1")
    shutil.rmtree(layers_root, ignore_errors=True)
    return {
        "mb": raw_mb,
        "baseline_s": base,
        "full": full,
        "status": start,
        "again": again,
        "incremental": incremental,
        "delta_alone": alone,
        "floor": floor,
        "added_mb": added / 1e6,
        "layers": layers,
    }


def incremental_layers(corpora: Path, tmp: Path, mb: float, workers: int) -> list[dict]:
    """Each layer of a +1% child over an approved, active parent, in fresh children."""
    root = tmp / f"mb{int(mb)}-incr"
    shutil.rmtree(root, ignore_errors=True)
    made = write_corpus(corpora, root / "src", mb)
    config = write_config(root, made["sources"], workers)
    publish(config, root, cli_build(config, root)["out"])
    add_one_percent(corpora, root / "src", made["jsonl_bytes"])
    subprocess.run(
        [sys.executable, __file__, "--freeze", str(config)], check=True, env=env_for(root)
    )
    return per_layer(config, env_for(root), "race-p1")


def peaks_size(corpora: Path, tmp: Path, mb: float, workers: int, reuse: bool) -> dict:
    """``--peaks`` at one size: the driver's peak per layer, over a home made once."""
    root = tmp / f"mb{int(mb)}-peaks"
    made_file = root / "made.json"
    if not (reuse and made_file.is_file()):
        shutil.rmtree(root, ignore_errors=True)
        made = write_corpus(corpora, root / "src", mb)
        made_file.parent.mkdir(parents=True, exist_ok=True)
        made_file.write_text(json.dumps({k: made[k] for k in ("sources", "jsonl_bytes")}))
    made = json.loads(made_file.read_text())
    config = write_config(root, made["sources"], workers)  # this run's cluster address
    subprocess.run(
        [sys.executable, __file__, "--freeze", str(config)], check=True, env=env_for(root)
    )
    built = LAYERS[: LAYERS.index("dedup_clusters")]
    per_layer(config, env_for(root), "race-p1", built)  # memoised: made once, then reused
    rows = per_layer(config, env_for(root), "race-p1", LAYERS[len(built) :], direct=True)
    return {"mb": made["jsonl_bytes"] / 1e6, "layers": rows}


def report_peaks(results: list[dict]) -> None:
    print("\n#### Driver peak per layer (VmHWM MB, each layer in a fresh child)\n")
    print("| layer | " + " | ".join(f"{r['mb']:.0f} MB" for r in results) + " | growth |")
    print("|---|" + "---:|" * (len(results) + 1))
    for n, row in enumerate(results[0]["layers"]):
        peaks = [r["layers"][n]["peak_mb"] for r in results]
        cells = " | ".join(f"{p:.0f}" for p in peaks)
        print(f"| {row['layer']} | {cells} | {peaks[-1] / peaks[0]:.2f}x |")
    largest = [max(c["peak_mb"] for c in r["layers"]) for r in results]
    print(
        f"\nlargest layer per size: {', '.join(f'{p:.0f}' for p in largest)} MB; "
        f"last / first = {largest[-1] / largest[0]:.2f}x (target <= 1.3x)"
    )


def freeze_only(config: str, partition: str) -> None:
    from corpus_assets.core.ingest.freeze import freeze
    from corpus_assets.core.runtime.workspace import open_workspace

    with open_workspace(config) as ws:
        freeze(ws, partition)


def report(results: list[dict]) -> None:
    print("\n#### Whole build (`corpus-assets build`, fresh home)\n")
    print(
        "| raw MB | wall s | CPU s | MB/s | MB/CPU-s | peak RSS MB | vs zstd -dc | "
        "unchanged re-build s (CPU s) | status s | incremental s (+MB) | "
        "incr/full CPU (each child's CPU s) | the same, the +1% sorting first | "
        "incr beyond the re-build's CPU / full | the +1% alone, fresh home / full CPU | "
        "floor: a +1% child of that 1% home / full CPU |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        f, mb = r["full"], r["mb"]
        incremental, first = r["incremental"], r["incremental"]["first"]
        print(
            f"| {mb:.0f} | {f['wall']:.1f} | {_each(f)} | {mb / f['wall']:.2f} | "
            f"{mb / f['cpu']:.2f} | {f['peak_mb']:.0f} | {r['baseline_s'] / f['wall']:.3f}x | "
            f"{r['again']['wall']:.1f} ({r['again']['cpu']:.1f}) | {r['status']['wall']:.1f} | "
            f"{incremental['wall']:.1f} (+{r['added_mb']:.1f}) | "
            f"{_ratio(incremental, f['cpu'])} | {_ratio(first, f['cpu'])} | "
            f"{(incremental['cpu'] - r['again']['cpu']) / f['cpu']:.3f} | "
            f"{r['delta_alone']['cpu'] / f['cpu']:.2f} | {_ratio(r['floor'], f['cpu'])} |"
        )
    print(
        "\nThe +1% is one new object per source, appended: it sorts after the source's objects, "
        "as a\nnumbered or dated part does. Sorting first, it is each source's first chunk "
        "(the canary's).\nThe floor is a build's fixed cost: no per-record work brings a "
        "+1% child under it."
    )
    print("\n#### Per layer (each in a fresh child; peak = VmHWM of the child, workers apart)\n")
    sizes = " | ".join(
        f"{r['mb']:.0f} MB: s / CPU s (driver) / peak MB / worker MB" for r in results
    )
    print(f"| layer | {sizes} |")
    print("|---|" + "---|" * len(results))
    for n, layer in enumerate(LAYERS):
        cells = [r["layers"][n] for r in results]
        print(
            f"| {layer} | "
            + " | ".join(
                f"{c['wall']:.1f} / {c['cpu']:.1f} ({c['driver_cpu']:.1f}) / "
                f"{c['peak_mb']:.0f} / {c['worker_peak_mb']:.0f}"
                for c in cells
            )
            + " |"
        )
    # the driver's share is a target on Ray; with the local pool, banding, verification and
    # the held-out search stay in the driver by design (``execution.stages``: cheaper there)
    target = "target <= 10%" if CLUSTER else "stages in the driver on the local engine"
    for r in results:
        dedup = next(c for c in r["layers"] if c["layer"] == "dedup_clusters")
        print(
            f"\n{r['mb']:.0f} MB: dedup driver CPU {dedup['driver_cpu']:.1f} of "
            f"{dedup['cpu']:.1f} s ({dedup['driver_cpu'] / dedup['cpu']:.0%}; {target})"
        )
    peaks = [max(max(c["peak_mb"], c["worker_peak_mb"]) for c in r["layers"]) for r in results]
    print(
        f"\npeak RSS per size: {', '.join(f'{p:.0f} MB' for p in peaks)}; "
        f"largest / smallest = {max(peaks) / min(peaks):.2f}x (target <= 1.3x, each <= 1024 MB)"
    )


def _cpus(runs: dict) -> str:
    """Every run's CPU of a ``_median``, in the order they ran."""
    return ", ".join(f"{c:.1f}" for c in runs.get("cpus", [runs["cpu"]]))


def _ratio(children: dict, full_cpu: float) -> str:
    """The median child's CPU over the full build's, every child's CPU beside it."""
    return f"{children['cpu'] / full_cpu:.3f} ({_cpus(children)})"


def _each(runs: dict) -> str:
    """The median run's CPU, every run's beside it when there were several."""
    return f"{runs['cpu']:.1f}" + (f" ({_cpus(runs)})" if len(runs.get("cpus", [])) > 1 else "")


def compile_package() -> None:
    """Bytecode for the package, as an installed one has: where ``PYTHONDONTWRITEBYTECODE`` is
    set (CI machines, this sandbox) every process would otherwise compile it from source."""
    import compileall

    compileall.compile_dir(Path(__file__).resolve().parents[1] / "corpus_assets", quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shared = Path(__file__).resolve().parents[2] / "shared/corpora"
    parser.add_argument("--corpora", type=Path, default=shared)
    parser.add_argument("--sizes", default="110,330,1100")
    parser.add_argument("--workers", type=int, default=2, help="pool workers (Ray: CPUs per node)")
    parser.add_argument("--engine", choices=("local", "ray"), default="local")
    parser.add_argument("--ray-nodes", type=int, default=1)
    parser.add_argument("--tmp", type=Path, default=Path("/tmp/corpus-race"))
    parser.add_argument("--child", nargs=3, metavar=("CONFIG", "PARTITION", "LAYER"))
    parser.add_argument("--direct", action="store_true", help="with --child: no memo")
    parser.add_argument("--peaks", action="store_true", help="only the driver peak per layer")
    parser.add_argument("--reuse", action="store_true", help="with --peaks: keep each home")
    parser.add_argument("--freeze", metavar="CONFIG")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument(
        "--children",
        type=int,
        default=3,
        help="+1%% children per size, appended (as many sorting first beside them): medians",
    )
    parser.add_argument(
        "--incremental-layers",
        type=float,
        metavar="MB",
        help="per layer of a +1%% child over an active parent built from MB of raw text",
    )
    parser.add_argument("--only", help="with --layers: these layers only (comma-separated)")
    parser.add_argument(
        "--layers",
        nargs=2,
        metavar=("CONFIG", "PARTITION"),
        help="only the per-layer table, for an existing config and new partition",
    )
    parser.add_argument(
        "--identity-as",
        type=Path,
        metavar="CHECKOUT",
        help="code identities of CHECKOUT's files (identity_as/sitecustomize.py): new code "
        "measured over a parent another checkout built",
    )
    args = parser.parse_args()
    if args.identity_as:
        as_if = _identity_as(args.identity_as)
        if as_if:  # the shim must load at start-up: this process again, with it
            os.execve(sys.executable, [sys.executable, *sys.argv], as_if)
    if not args.child:
        compile_package()
    if args.child:
        return child(*args.child, direct=args.direct)
    if args.freeze:
        return freeze_only(args.freeze, "race-p1")
    if args.incremental_layers:
        rows = incremental_layers(args.corpora, args.tmp, args.incremental_layers, args.workers)
        for row in rows:
            print(
                f"{row['layer']:18} {row['wall']:6.1f} s {row['cpu']:6.1f} CPU-s "
                f"{row['peak_mb']:5.0f} MB {row['worker_peak_mb']:5.0f} MB"
            )
        return None
    if args.layers:
        config, partition = Path(args.layers[0]), args.layers[1]
        freeze_only(str(config), partition)
        only = args.only.split(",") if args.only else None
        for row in per_layer(config, None, partition, only):
            print(json.dumps(row))
        return None
    if not args.corpora.is_dir():
        sys.exit(f"{args.corpora} is absent: race needs the shared corpora")
    if args.engine == "ray":
        global CLUSTER
        with Cluster(args.ray_nodes, args.workers) as CLUSTER:
            return race(args)
    return race(args)


def _identity_as(checkout: Path) -> dict[str, str] | None:
    """The environment that loads the identity shim for ``checkout``; None once it is loaded."""
    if os.environ.get("CORPUS_IDENTITY_AS") == str(checkout.resolve()):
        return None
    shim = str(Path(__file__).parent / "identity_as")
    path = os.pathsep.join(p for p in (shim, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, CORPUS_IDENTITY_AS=str(checkout.resolve()), PYTHONPATH=path)


def python_loop_s(count: int = 10**7) -> float:
    """CPU-s of ``count`` integer additions in a Python loop, printed with every race: a first
    probe of the machine's speed (the same code's 122 MB build took 25.5 CPU-s on one machine of
    the class and 69.8 on another), which misses what slows memory-bound work."""
    start, total = time.process_time(), 0
    for n in range(count):
        total += n
    return time.process_time() - start


def race(args: argparse.Namespace) -> None:
    engine = f"ray ({args.ray_nodes} node(s))" if CLUSTER else "local"
    print(
        f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, a 10^7-add Python loop "
        f"{python_loop_s():.2f} CPU-s; workers={args.workers}; engine {engine}"
    )
    if args.peaks:
        sizes = [float(s) for s in args.sizes.split(",")]
        peaks = [peaks_size(args.corpora, args.tmp, mb, args.workers, args.reuse) for mb in sizes]
        if args.json:
            args.json.write_text(json.dumps(peaks, indent=1))
        return report_peaks(peaks)
    results = []
    for mb in (float(s) for s in args.sizes.split(",")):
        results.append(race_size(args.corpora, args.tmp, mb, args.workers, args.children))
        print(f"size {results[-1]['mb']:.0f} MB done", file=sys.stderr)
        if args.json:  # after each size, so a long run keeps what it measured
            args.json.write_text(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    report(results)


if __name__ == "__main__":
    main()
