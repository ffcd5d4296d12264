"""A demo build launched as the UI launches it, beside the CLI's (issue 15).

Baseline: ``corpus-assets build`` in a fresh data home (the CLI runs the job in its own process).
Measured: the same build launched through a real ``dagster-webserver``'s GraphQL ``launchRun``
(what the Launchpad and the Materialize button send), which the instance's run launcher runs in a
new process - once with the shipped in-process executor, once with Dagster's multiprocess
default (a bench-only code location, ``ui_multiprocess_defs.py``). Each build starts from a fresh
data home, so every run does the whole work. The discovery sensor's runs go through the same run
launcher (the browser test drives that path end to end).

    .venv/bin/python bench/ui_runs.py [--reps 3] [--multiprocess-reps 1]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LAUNCH = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
ADD_PARTITION = """mutation($l: String!, $n: String!, $k: String!) {
  addDynamicPartition(repositorySelector: {repositoryLocationName: $l,
    repositoryName: "__repository__"}, partitionsDefName: $n, partitionKey: $k) { __typename } }"""
RUN = """query($id: ID!) { runOrError(runId: $id) { ... on Run { status startTime endTime } } }"""


def fresh_home(base: Path, name: str) -> dict[str, str]:
    """A data home with the demo sources and a Dagster home with the shipped SQLite config."""
    sys.path.insert(0, str(ROOT))
    from corpus_assets.demo import write_demo

    home, dagster = base / name / "corpus", base / name / "dagster"
    dagster.mkdir(parents=True)
    shutil.copy(ROOT / "instance" / "dagster.yaml", dagster / "dagster.yaml")
    config = write_demo(home)
    return dict(
        os.environ, CORPUS_HOME=str(home), CORPUS_CONFIG=str(config), DAGSTER_HOME=str(dagster)
    )


def cli_build(env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run([str(BIN / "corpus-assets"), "build"], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def graphql(port: int, query: str, variables: dict) -> dict:
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["data"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_webserver(env: dict[str, str], module: str, log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    workspace = log.with_suffix(".workspace.yaml")
    workspace.write_text(
        f"load_from:\n  - python_module: {{module_name: {module}, location_name: bench}}\n"
    )
    cmd = [str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port), "-w", str(workspace)]
    env = dict(env, PYTHONPATH=f"{ROOT}:{ROOT / 'bench'}")
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    for _ in range(240):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2)
            return proc, port
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"webserver did not start: {log}")


def ui_build(port: int, key: str) -> float:
    """Launch as the UI does and wait; the time a user waits from the click to the end."""
    graphql(port, ADD_PARTITION, {"l": "bench", "n": "snapshots", "k": key})
    params = {
        "selector": {"repositoryLocationName": "bench", "repositoryName": "__repository__",
                     "jobName": "build_snapshot"},
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": key}]},
    }  # fmt: skip
    start = time.perf_counter()
    launched = graphql(port, LAUNCH, {"p": params})["launchRun"]
    if launched["__typename"] != "LaunchRunSuccess":
        raise SystemExit(f"launch failed: {launched}")
    run_id = launched["run"]["runId"]
    while True:
        status = graphql(port, RUN, {"id": run_id})["runOrError"]["status"]
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(0.25)
    if status != "SUCCESS":
        raise SystemExit(f"run {run_id} ended {status}")
    return time.perf_counter() - start


def measure_ui(base: Path, module: str, reps: int) -> list[float]:
    times = []
    for rep in range(reps):
        env = fresh_home(base, f"{module}-{rep}")
        proc, port = start_webserver(env, module, base / f"{module}-{rep}.log")
        try:
            times.append(ui_build(port, "bench-1"))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--multiprocess-reps", type=int, default=1)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ui-runs-"))
    cli = [cli_build(fresh_home(base, f"cli-{i}")) for i in range(args.reps)]
    ui = measure_ui(base, "corpus_assets.definitions", args.reps)
    multi = measure_ui(base, "ui_multiprocess_defs", args.multiprocess_reps)
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print("| path | runs | median s | vs CLI |\n|---|---:|---:|---:|")
    baseline = statistics.median(cli)
    for name, times in (
        ("CLI `corpus-assets build` (baseline)", cli),
        ("UI launch, in-process executor (shipped)", ui),
        ("UI launch, multiprocess executor (Dagster default)", multi),
    ):
        median = statistics.median(times)
        print(f"| {name} | {len(times)} | {median:.1f} | {median / baseline:.2f}x |")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
