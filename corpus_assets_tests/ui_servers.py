"""Real Dagster servers for the browser test: a webserver and a daemon, each its own process group.

Both are started headless on a loopback port against a throwaway DAGSTER_HOME and CORPUS_HOME,
and stopped by their own process-group id (never by name), so the code servers and run workers
they spawn go with them even when the test fails half-way.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import dagster as dg

from corpus_assets.cli.instance import DAGSTER_YAML
from corpus_assets_tests.paths import REPO

BIN = Path(sys.executable).parent
T = TypeVar("T")


def free_port() -> int:
    """A port the kernel has just handed out on loopback (closed again for the server to take)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float,
    every: float = 1.0,
    deadline: float | None = None,
) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` on timeout
    (``timeout`` seconds from now, or at the monotonic ``deadline`` when one is given)."""
    deadline = time.monotonic() + timeout if deadline is None else deadline
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is still there (signal 0 only checks)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@dataclass
class Group:
    """One started command, the leader of its own session and process group."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pgid(self) -> int:
        return self.process.pid  # start_new_session: the leader's pid is the group id

    def gone(self) -> bool:
        """No process of the group is left; reaps the leader first (we are its parent, and an
        unreaped zombie would keep the group alive)."""
        self.process.poll()
        return not group_alive(self.pgid)

    def terminate(self) -> None:
        """SIGTERM the whole group: the leader and the code servers and runs it spawned."""
        if group_alive(self.pgid):
            os.killpg(self.pgid, signal.SIGTERM)

    def finish(self, deadline: float) -> None:
        """Wait until ``deadline`` (monotonic) for the group to go, then SIGKILL what is left."""
        how = "SIGTERM"
        try:
            wait_for(f"{self.name} to exit", self.gone, 0, 0.2, deadline)
        except TimeoutError:
            if group_alive(self.pgid):
                os.killpg(self.pgid, signal.SIGKILL)
                how = "SIGKILL"
        self.process.wait(timeout=10)
        # orphans of the group are reaped by init shortly after the leader dies
        wait_for(f"{self.name}'s group to be gone", self.gone, 10, 0.2)
        print(f"{self.name} (pgid {self.pgid}) stopped by {how}")


def stop_groups(groups: list[Group], grace: float = 10.0) -> None:
    """Stop every group by its own id: SIGTERM all, SIGKILL what remains ``grace`` s later."""
    for group in groups:
        group.terminate()
    deadline = time.monotonic() + grace
    for group in groups:
        group.finish(deadline)


def start_group(
    name: str, argv: list[str], env: dict[str, str], logs: Path, cwd: Path = REPO
) -> Group:
    """Start ``argv`` in a new session (its own process group), output to ``logs/name.log``."""
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Group(name, process, log)


def server_env(dagster_home: Path, corpus_home: Path, config: Path) -> dict[str, str]:
    """The environment every process of the test shares: only the temporary homes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    env.update(
        DAGSTER_HOME=str(dagster_home),
        CORPUS_HOME=str(corpus_home),
        CORPUS_CONFIG=str(config),
        PYTHONUNBUFFERED="1",
    )
    return env


def dagster_home(path: Path) -> Path:
    """A DAGSTER_HOME holding the project's own instance config (SQLite, telemetry off), its
    storage created here: the webserver's code server and the daemon starting at once on an
    empty home race to create the schedule database and can leave two alembic heads, after
    which the code location fails to load ("more than one head present")."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "dagster.yaml").write_text(DAGSTER_YAML)  # the root config, storage in $DAGSTER_HOME
    # the config reads base_dir from $DAGSTER_HOME: point it here, whatever the caller's env says
    # (an in-process CLI call in the same worker leaves it set to ./.dagster)
    saved = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(path)
    try:
        with dg.DagsterInstance.from_config(str(path)):
            pass
    finally:
        if saved is None:
            del os.environ["DAGSTER_HOME"]
        else:
            os.environ["DAGSTER_HOME"] = saved
    assert (path / "schedules" / "schedules.db").exists(), f"no schedule storage under {path}"
    return path


class GraphQL:
    """The webserver's GraphQL endpoint, the same API the UI reads."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def query(self, text: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        body = json.dumps({"query": text, "variables": variables or {}}).encode()
        request = urllib.request.Request(
            f"{self.base}/graphql", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = json.load(response)
        if payload.get("errors"):
            raise AssertionError(f"GraphQL errors: {payload['errors']}")
        return payload["data"]

    def server_info(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.base}/server_info", timeout=5) as response:
                return json.load(response)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return None


LOCATION_STATUS = """{ workspaceOrError { ... on Workspace { locationEntries {
  name loadStatus locationOrLoadError { __typename ... on PythonError { message stack } } } } } }"""

RUNS = """query Runs($filter: RunsFilter) { runsOrError(filter: $filter) { ... on Runs {
  results { runId jobName status tags { key value } } } } }"""


def location_loaded(gql: GraphQL) -> bool:
    """The webserver answers and has loaded the ``corpus_assets`` code location."""
    if gql.server_info() is None:
        return False
    entries = gql.query(LOCATION_STATUS)["workspaceOrError"].get("locationEntries", [])
    for entry in entries:
        if entry["name"] == "corpus_assets" and entry["loadStatus"] == "LOADED":
            loaded = entry["locationOrLoadError"]
            if loaded["__typename"] != "RepositoryLocation":
                stack = "".join(loaded.get("stack") or [])
                raise AssertionError(
                    f"code location failed to load: {loaded.get('message')}\n{stack}"
                )
            return True
    return False


def runs(gql: GraphQL, job: str) -> list[dict[str, Any]]:
    """Every run of ``job``, newest first, with its tags as a dict."""
    results = gql.query(RUNS, {"filter": {"pipelineName": job}})["runsOrError"]["results"]
    return [{**r, "tags": {t["key"]: t["value"] for t in r["tags"]}} for r in results]


def finished_run(gql: GraphQL, job: str) -> dict[str, Any] | None:
    """The newest run of ``job`` once it has succeeded; a failure is an error."""
    found = runs(gql, job)
    if not found:
        return None
    run = found[0]
    if run["status"] in ("FAILURE", "CANCELED"):
        raise AssertionError(f"{job} run {run['runId']} ended {run['status']}")
    return run if run["status"] == "SUCCESS" else None


@dataclass
class Servers:
    """What the test talks to, and the groups it must see gone at the end."""

    gql: GraphQL
    port: int
    env: dict[str, str]
    groups: list[Group]


@contextmanager
def dagster_servers(
    dagster_dir: Path, corpus_home: Path, config: Path, logs: Path
) -> Iterator[Servers]:
    """``dagster-webserver`` and ``dagster-daemon`` on a free loopback port, stopped afterwards
    by process group whatever happens; yields the GraphQL client once the location is loaded."""
    env = server_env(dagster_home(dagster_dir), corpus_home, config)
    port = free_port()
    workspace = str(REPO / "workspace.yaml")
    web = [str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port), "-w", workspace]
    daemon = [str(BIN / "dagster-daemon"), "run", "-w", workspace]
    groups: list[Group] = []
    with ExitStack() as stack:
        stack.callback(stop_groups, groups)  # whatever was started, even if the second fails
        for name, argv in (("webserver", web), ("daemon", daemon)):
            groups.append(start_group(name, argv, env, logs))
        gql = GraphQL(port)
        wait_for("the webserver and its code location", lambda: location_loaded(gql), 180)
        yield Servers(gql, port, env, groups)


RUN = """query Run($runId: ID!) { runOrError(runId: $runId) { __typename
  ... on Run { runId jobName status tags { key value } } } }"""

PARTITION_KEYS = """{ assetNodeOrError(assetKey: {path: ["manifest"]}) {
  ... on AssetNode { partitionKeys } } }"""


def run_succeeded(gql: GraphQL, run_id: str) -> dict[str, Any] | None:
    """The run once it succeeded, None while it is on its way; a failure is an error."""
    run = gql.query(RUN, {"runId": run_id})["runOrError"]
    if run["__typename"] != "Run":
        return None  # launched from the UI: may not be stored yet
    if run["status"] in ("FAILURE", "CANCELED"):
        raise AssertionError(f"run {run_id} of {run['jobName']} ended {run['status']}")
    return run if run["status"] == "SUCCESS" else None


def partition_keys(gql: GraphQL) -> list[str]:
    """The ``snapshots`` partitions as the UI lists them on ``manifest``."""
    return gql.query(PARTITION_KEYS)["assetNodeOrError"]["partitionKeys"]


def corpus_status(env: dict[str, str]) -> dict[str, Any]:
    """``corpus-assets status --json`` against the test's homes: the catalog's own word."""
    out = subprocess.run(
        [str(BIN / "corpus-assets"), "status", "--json"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


BUILD_RUNS = """{ runsOrError(filter: {pipelineName: "build_snapshot"}) { ... on Runs { results {
  runId status creationTime startTime endTime tags { key value } } } } }"""

LATEST_INFO = """query Latest($keys: [AssetKeyInput!]!) { assetsLatestInfo(assetKeys: $keys) {
  assetKey { path } latestRun { runId status } } }"""


def build_runs(gql: GraphQL) -> list[dict[str, Any]]:
    """Every ``build_snapshot`` run with its times (seconds) and tags as a dict, newest first."""
    results = gql.query(BUILD_RUNS)["runsOrError"]["results"]
    return [{**r, "tags": {t["key"]: t["value"] for t in r["tags"]}} for r in results]


def latest_runs(gql: GraphQL, assets: list[str]) -> dict[str, str | None]:
    """Each asset's latest run status, as the asset graph colours it (FAILURE: red)."""
    keys = [{"path": [a]} for a in assets]
    infos = gql.query(LATEST_INFO, {"keys": keys})["assetsLatestInfo"]
    return {i["assetKey"]["path"][0]: (i["latestRun"] or {}).get("status") for i in infos}


STARTING = """query Logs($runId: ID!) { logsForRun(runId: $runId) { ... on EventConnection {
  events { __typename ... on MessageEvent { timestamp } } } } }"""


def launched_at(gql: GraphQL, run_id: str) -> float:
    """When the daemon's run queue launched the run (seconds): its RUN_STARTING event."""
    events = gql.query(STARTING, {"runId": run_id})["logsForRun"]["events"]
    (stamp,) = [e["timestamp"] for e in events if e["__typename"] == "RunStartingEvent"]
    return int(stamp) / 1000  # milliseconds, as a string


@contextmanager
def demo_servers(tmp_path: Path) -> Iterator[Servers]:
    """``dagster_servers`` on a demo CORPUS_HOME whose sources no build has seen yet (only the
    sensor or a launch turns them into a run); every process group they started is gone
    afterwards, checked by group id."""
    from corpus_assets.demo import write_demo

    home = tmp_path / "corpus"
    config = write_demo(home)
    logs = tmp_path / "logs"
    logs.mkdir()
    with dagster_servers(tmp_path / "dagster", home, config, logs) as started:
        print(f"Dagster logs: {logs}")
        yield started
    for group in started.groups:
        assert not group_alive(group.pgid), f"{group.name}'s process group {group.pgid} remains"
