"""A demo build launched as the UI launches it, beside the CLI's.

Baseline: ``corpus-assets build`` in a fresh data home (the CLI runs the job in its own process).
Measured under ``dagster dev`` (webserver + daemon, as ``make ui`` starts them):
- UI: the same build launched through GraphQL ``launchRun`` (what the Launchpad and the
  Materialize button send): queued, dequeued by the daemon, run by the run launcher in a new
  process; timed from the click to the run's end. Sensors are stopped before the demo sources
  are written, so nothing else runs.
- sensor: the ``source_discovery`` sensor's own build of the demo; timed from the run's creation
  to its end (the wait for the sensor's tick is its interval, not the build's cost).
Each mode runs once with the shipped in-process executor and once with Dagster's multiprocess
default (a bench-only code location, ``ui_multiprocess_defs.py``). Every build starts from a
fresh data home, so every run does the whole work.

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

from corpus_assets.cli.instance import DAGSTER_YAML
from corpus_assets.demo import write_demo

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LAUNCH = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
ADD_PARTITION = """mutation($l: String!, $n: String!, $k: String!) {
  addDynamicPartition(repositorySelector: {repositoryLocationName: $l,
    repositoryName: "__repository__"}, partitionsDefName: $n, partitionKey: $k) { __typename } }"""
RUN = """query($id: ID!) { runOrError(runId: $id) { ... on Run {
  status creationTime startTime endTime } } }"""
SENSORS = """{ sensorsOrError(repositorySelector: {repositoryLocationName: "bench",
  repositoryName: "__repository__"}) { ... on Sensors { results { name
  sensorState { id status } } } } }"""
STOP_SENSOR = """mutation($id: String!) { stopSensor(id: $id) {
  ... on StopSensorMutationResult { instigationState { status } } } }"""
RUNS = """{ runsOrError(filter: {pipelineName: "build_snapshot"}) { ... on Runs {
  results { runId status creationTime endTime } } } }"""


def fresh_home(base: Path, name: str, with_sources: bool = True) -> dict[str, str]:
    """A data home (with the demo sources) and a Dagster home with the shipped SQLite config."""
    home, dagster = base / name / "corpus", base / name / "dagster"
    dagster.mkdir(parents=True)
    (dagster / "dagster.yaml").write_text(DAGSTER_YAML)  # the root config, storage here
    if with_sources:
        write_demo(home)
    config = home / "corpus.yaml"
    return dict(
        os.environ, CORPUS_HOME=str(home), CORPUS_CONFIG=str(config), DAGSTER_HOME=str(dagster)
    )


def cli_build(env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([str(BIN / "corpus-assets"), "build"], env=env, capture_output=True)
    if done.returncode:
        raise SystemExit(f"corpus-assets build failed:\n{done.stderr.decode()[-3000:]}")
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


def start_dev(env: dict[str, str], module: str, log: Path) -> tuple[subprocess.Popen, int]:
    """``dagster dev`` (webserver + daemon) on a free loopback port, in its own process group."""
    port = free_port()
    workspace = log.with_suffix(".workspace.yaml")
    workspace.write_text(
        f"load_from:\n  - python_module: {{module_name: {module}, location_name: bench}}\n"
    )
    cmd = [str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port), "-w", str(workspace)]
    env = dict(env, PYTHONPATH=f"{ROOT}:{ROOT / 'bench'}")
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=log.parent)  # fmt: skip
    for _ in range(240):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2)
            if graphql(port, SENSORS, {})["sensorsOrError"].get("results"):
                return proc, port
        except OSError:
            pass
        time.sleep(0.5)
    stop(proc)  # never leave a half-started webserver and daemon behind
    raise SystemExit(f"dagster dev did not start: {log}")


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_run(port: int, run_id: str) -> dict:
    while True:
        run = graphql(port, RUN, {"id": run_id})["runOrError"]
        if run["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
            break
        time.sleep(0.25)
    if run["status"] != "SUCCESS":
        raise SystemExit(f"run {run_id} ended {run['status']}")
    return run


def ui_build(port: int, key: str) -> float:
    """Launch as the UI does and wait: the time a user waits from the click to the end."""
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
    wait_run(port, launched["run"]["runId"])
    return time.perf_counter() - start


def measure_ui(base: Path, module: str, rep: int) -> float:
    env = fresh_home(base, f"ui-{module}-{rep}", with_sources=False)
    proc, port = start_dev(env, module, base / f"ui-{module}-{rep}.log")
    try:
        for sensor in graphql(port, SENSORS, {})["sensorsOrError"]["results"]:
            graphql(port, STOP_SENSOR, {"id": sensor["sensorState"]["id"]})
        write_demo(Path(env["CORPUS_HOME"]))
        return ui_build(port, "bench-1")
    finally:
        stop(proc)


def measure_sensor(base: Path, module: str, rep: int) -> float:
    env = fresh_home(base, f"sensor-{module}-{rep}")
    proc, port = start_dev(env, module, base / f"sensor-{module}-{rep}.log")
    try:
        for _ in range(600):
            runs = graphql(port, RUNS, {})["runsOrError"]["results"]
            if runs:
                run = wait_run(port, runs[0]["runId"])
                return run["endTime"] - run["creationTime"]
            time.sleep(1)
        raise SystemExit("the sensor requested no build in 10 minutes")
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--multiprocess-reps", type=int, default=1)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ui-runs-"))
    shipped, multi = "corpus_assets.definitions", "ui_multiprocess_defs"
    rows = [("CLI `corpus-assets build` (baseline)",
             [cli_build(fresh_home(base, f"cli-{i}")) for i in range(args.reps)])]  # fmt: skip
    modes = [
        ("in-process (shipped)", shipped, args.reps),
        ("multiprocess (Dagster default)", multi, args.multiprocess_reps),
    ]
    for label, module, reps in modes:
        rows.append((f"UI launch, {label}", [measure_ui(base, module, i) for i in range(reps)]))
        rows.append(
            (f"sensor run, {label}", [measure_sensor(base, module, i) for i in range(reps)])
        )
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print("| path | runs | median s | vs CLI |\n|---|---:|---:|---:|")
    baseline = statistics.median(rows[0][1])
    for name, times in rows:
        median = statistics.median(times)
        print(f"| {name} | {len(times)} | {median:.1f} | {median / baseline:.2f}x |")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
