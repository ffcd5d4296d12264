"""Start-up costs: the CLI's (``--help``, ``status``) and a chunk worker's, against
``python -c pass`` measured in the same run. Medians of ``--runs`` (default 5).

- CLI: ``python -X importtime -m corpus_assets.cli ARGS``: total import time (the sum of the
  top-level cumulative times), and, without ``-X importtime``, wall and CPU seconds. ``status``
  runs on an empty data home with no Dagster instance.
- worker: CPU seconds a spawned worker has used when its first job, importing a chunk task's
  module (``corpus_assets.core.records.canonical_records``), is done. Three parents: a bare one
  (the floor of a spawn worker), one whose ``__main__`` imports the CLI as the console script
  does, with the stock spawn context (a worker runs the parent's ``__main__`` again), and the
  same parent with the build's pool (``core.runtime.pool``, absent in older checkouts).

Usage: ``.venv/bin/python bench/startup_bench.py [--runs 5]``; for an older checkout's figures,
run it with ``PYTHONPATH=<that checkout>``.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if os.environ.get("STARTUP_BENCH_CLI"):  # the console script's import; a stock worker reruns it
    import corpus_assets.cli.main  # noqa: F401

TASK_MODULE = "corpus_assets.core.records.canonical_records"


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s of the child and its children, stderr) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, done.stderr


def import_total_ms(importtime: str) -> float:
    """The sum of the top-level entries' cumulative microseconds, in ms."""
    total = 0
    for line in importtime.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self, cumulative, name = line.removeprefix("import time:").split("|")
        if not name.startswith("  "):  # one space after the bar: a top-level import
            total += int(cumulative)
    return total / 1000


def command_row(name: str, args: list[str], env: dict[str, str], runs: int) -> dict:
    python = [sys.executable]
    walls, cpus, imports = [], [], []
    for _ in range(runs):
        wall, cpu, _err = _timed([*python, *args], env)
        walls.append(wall)
        cpus.append(cpu)
        if args[:1] == ["-m"]:
            imports.append(import_total_ms(_timed([*python, "-X", "importtime", *args], env)[2]))
    row = {"what": name, "wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}
    if imports:
        row["imports_ms"] = statistics.median(imports)
    return row


def worker_child(mode: str) -> None:
    """A parent: start one worker, run its first job, print the worker's CPU seconds."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if mode == "core":
        from corpus_assets.core.runtime.pool import _new_pool

        pool = _new_pool(1)
    else:
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    start = time.perf_counter()
    with pool:
        pool.submit(exec, f"import {TASK_MODULE}").result()  # exec: returns None, picklable
        cpu = pool.submit(time.process_time).result()
    print(json.dumps({"worker_cpu_s": cpu, "first_job_wall_s": time.perf_counter() - start}))


def worker_row(name: str, mode: str, cli: bool, env: dict[str, str], runs: int) -> dict:
    env = {**env, "STARTUP_BENCH_CLI": "1"} if cli else env
    got = []
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, __file__, "--worker", mode],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        got.append(json.loads(done.stdout.splitlines()[-1]))
    return {
        "what": name,
        "worker_cpu_s": statistics.median(g["worker_cpu_s"] for g in got),
        "wall_s": statistics.median(g["first_job_wall_s"] for g in got),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_child(args.worker)
        return
    home = Path(tempfile.mkdtemp(prefix="startup-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    env |= {"CORPUS_HOME": str(home / "home"), "DAGSTER_HOME": str(home / "dagster")}
    rows = [command_row("python -c pass", ["-c", "pass"], env, args.runs)]
    for cli_args in (["--help"], ["status"]):
        name = "corpus-assets " + " ".join(cli_args)
        rows.append(command_row(name, ["-m", "corpus_assets.cli", *cli_args], env, args.runs))
    rows.append(worker_row("worker, bare parent (floor)", "stock", False, env, args.runs))
    rows.append(worker_row("worker, CLI parent, stock spawn", "stock", True, env, args.runs))
    try:
        import corpus_assets.core.runtime.pool  # noqa: F401
    except ImportError:
        pass  # an older checkout, without the build pool
    else:
        rows.append(worker_row("worker, CLI parent, build pool", "core", True, env, args.runs))
    report(rows, os.getloadavg()[0])


def report(rows: list[dict], load: float) -> None:
    floor = rows[0]
    print(f"machine: {os.cpu_count()} CPUs, load {load:.1f}; medians of each row's runs\n")
    print("| what | import total ms | wall s | CPU s | CPU / python -c pass |")
    print("|---|---|---|---|---|")
    for row in rows:
        cpu = row.get("cpu_s", row.get("worker_cpu_s", 0.0))
        imports = f"{row['imports_ms']:.0f}" if "imports_ms" in row else "-"
        ratio = cpu / floor["cpu_s"] if floor["cpu_s"] else float("nan")
        print(f"| {row['what']} | {imports} | {row['wall_s']:.2f} | {cpu:.2f} | {ratio:.1f}x |")


if __name__ == "__main__":
    main()
