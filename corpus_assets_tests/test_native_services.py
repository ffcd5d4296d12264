"""The docker-compose services, run natively: the CI proof of the deployment's configuration.

No Docker engine here, so the three Dagster services of docker-compose.yml run as processes with
the commands that file gives them (only hosts, ports and the workspace path are swapped for
loopback ones), on the instance file the image installs (deploy/dagster.yaml: PostgreSQL, queued
runs, runs started by the code server) and with the catalog in its own PostgreSQL database, as
in compose. The default test waits for the webserver to list the code location's jobs and the
daemon's heartbeats to be healthy, then builds the demo corpus through GraphQL (the UI's own
API); the slow one lets the daemon's sensors build it, approves it through GraphQL and lets the
``publication`` sensor activate it. Every process is its own process group, stopped by id at
the end, also on failure.
"""

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from corpus_assets.assets.jobs import approval_run_config
from corpus_assets.core.governance import alias_gate, states
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.demo import write_demo
from corpus_assets_tests.assets.test_postgres_instance import deploy_home, pg_env
from corpus_assets_tests.conftest import PG_URL
from corpus_assets_tests.paths import REPO
from corpus_assets_tests.ui_servers import GraphQL, Group, free_port, start_group, stop_groups

BIN = Path(sys.executable).parent

REPOSITORIES = """{ repositoriesOrError { __typename ... on RepositoryConnection {
  nodes { name location { name } jobs { name } sensors { name sensorState { id status } } } }
  ... on PythonError { message } } }"""
STOP_SENSOR = """mutation($id: String!) { stopSensor(id: $id) {
  ... on StopSensorMutationResult { instigationState { status } }
  ... on PythonError { message } } }"""
ADD_PARTITION = """mutation($repo: RepositorySelector!, $name: String!, $key: String!) {
  addDynamicPartition(repositorySelector: $repo, partitionsDefName: $name, partitionKey: $key) {
  __typename ... on PythonError { message } } }"""
DAEMONS = "{ instance { daemonHealth { allDaemonStatuses { daemonType required healthy } } } }"
RUNS = """query($job: String!) { runsOrError(filter: {pipelineName: $job}) { ... on Runs {
  results { runId status tags { key value } } } } }"""
LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
  ... on RunConfigValidationInvalid { errors { message } } } }"""


def _swap(command: list[str], flag: str, value: str) -> list[str]:
    """``command`` with the argument after ``flag`` replaced (the flag must be there)."""
    index = command.index(flag)
    return [*command[: index + 1], value, *command[index + 2 :]]


class Services:
    """The compose services as native processes, each in its own process group, with logs."""

    def __init__(self, logs: Path, env: dict[str, str]) -> None:
        self.logs, self.env = logs, env
        self.procs: dict[str, Group] = {}

    def start(self, name: str, command: list[str]) -> None:
        argv = [str(BIN / command[0]), *command[1:]]
        self.procs[name] = start_group(name, argv, self.env, self.logs)

    def check_alive(self) -> None:
        for name, group in self.procs.items():
            if group.process.poll() is not None:
                pytest.fail(f"{name} exited with {group.process.returncode}:\n{self.tail(name)}")

    def tail(self, name: str) -> str:
        return self.procs[name].log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        """SIGTERM every group, then SIGKILL what is still there after 5 s."""
        stop_groups(list(self.procs.values()), grace=5.0)


def _graphql(port: int, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    return GraphQL(port).query(query, variables)


def _wait(services: Services, what: str, timeout: float, probe: Callable[[], Any]) -> Any:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` and the logs."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        services.check_alive()
        try:
            if result := probe():
                return result
        except (OSError, AssertionError) as error:  # not listening yet, or not ready
            last = error
        time.sleep(1)
    logs = "\n".join(f"--- {name}\n{services.tail(name)}" for name in services.procs)
    pytest.fail(f"timed out after {timeout} s waiting for {what} (last: {last})\n{logs}")


@pytest.fixture
def services(tmp_path: Path, make_postgres_db: Callable[[], str]) -> Iterator[Services]:
    """The environment of docker-compose.yml's x-app block, pointed at local databases."""
    corpus_home = tmp_path / "corpus"
    config = write_demo(corpus_home)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    env.update(
        pg_env(make_postgres_db()),
        DAGSTER_HOME=str(deploy_home(tmp_path / "dagster")),
        CORPUS_CATALOG_URL=f"{PG_URL}/{make_postgres_db()}",
        CORPUS_HOME=str(corpus_home),
        CORPUS_CONFIG=str(config),
    )
    running = Services(tmp_path, env)
    try:
        yield running
    finally:
        running.stop()


def _start_code_and_webserver(services: Services, tmp_path: Path) -> tuple[int, Path]:
    """Start ``code`` and ``webserver`` with compose's commands on free loopback ports; return
    the webserver's port and the workspace file (deploy/workspace.yaml pointed at ``code``)."""
    compose = _compose_services()
    code_port, web_port = free_port(), free_port()
    code = _swap(_swap(compose["code"]["command"], "-h", "127.0.0.1"), "-p", str(code_port))
    services.start("code", code)
    _wait_healthy(services, compose["code"]["healthcheck"]["test"], code_port)
    workspace = yaml.safe_load((REPO / "deploy" / "workspace.yaml").read_text())
    (location,) = workspace["load_from"]
    location["grpc_server"].update(host="127.0.0.1", port=code_port)
    path = tmp_path / "workspace.yaml"
    path.write_text(yaml.safe_dump(workspace))
    web = _swap(compose["webserver"]["command"], "-w", str(path))
    services.start("webserver", _swap(_swap(web, "-h", "127.0.0.1"), "-p", str(web_port)))
    return web_port, path


def _wait_healthy(services: Services, check: list[str], port: int) -> None:
    """Compose's ``depends_on: code: condition: service_healthy``: the webserver and daemon
    start once the code server's health check passes. Started together, both created
    Dagster's tables in the new PostgreSQL database at once, and the webserver died on
    'type "secondary_indexes" already exists' (a CI failure)."""
    assert check[0] == "CMD", check
    argv = [str(BIN / check[1]), *_swap(check[2:], "-p", str(port))]

    def healthy() -> bool:
        done = subprocess.run(argv, env=services.env, capture_output=True, timeout=60)
        return done.returncode == 0

    _wait(services, "the code server's health check", 120, healthy)


def _start_daemon(services: Services, workspace: Path, port: int) -> None:
    """Start the one ``daemon`` and wait until every required daemon heartbeats healthy."""
    services.start("daemon", _swap(_compose_services()["daemon"]["command"], "-w", str(workspace)))

    def healthy() -> list[str]:
        statuses = _graphql(port, DAEMONS)["instance"]["daemonHealth"]["allDaemonStatuses"]
        required = [s for s in statuses if s["required"]]
        return [s["daemonType"] for s in required] if all(s["healthy"] for s in required) else []

    assert {"SENSOR", "QUEUED_RUN_COORDINATOR"} <= set(
        _wait(services, "healthy daemon heartbeats", 60, healthy)
    )


def _compose_services() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]


def _repository(services: Services, port: int) -> dict[str, Any]:
    """The code location's repository as the webserver lists it (served by ``code``)."""

    def listed() -> dict[str, Any] | None:
        repositories = _graphql(port, REPOSITORIES)["repositoriesOrError"]
        assert repositories["__typename"] == "RepositoryConnection", repositories
        return next(iter(repositories["nodes"]), None)

    repository = _wait(services, "the webserver to list the code location", 60, listed)
    jobs = {job["name"] for job in repository["jobs"]}
    assert {"build_snapshot", "approve_snapshot", "activate_snapshot"} <= jobs
    return repository


def _runs(port: int, job: str) -> list[dict[str, Any]]:
    return _graphql(port, RUNS, {"job": job})["runsOrError"]["results"]


def _succeeded(services: Services, port: int, job: str) -> dict[str, Any] | None:
    """The job's run once it succeeded; fails at once when it failed."""
    for run in _runs(port, job):
        if run["status"] in ("FAILURE", "CANCELED"):
            pytest.fail(f"{job} run {run['runId']} {run['status']}:\n{services.tail('code')}")
        if run["status"] == "SUCCESS":
            return run
    return None


def _launch(port: int, repository: dict[str, Any], job: str, **params: Any) -> None:
    """Submit a run the way the UI's launchpad does (queued; the daemon launches it)."""
    selector = {
        "repositoryLocationName": repository["location"]["name"],
        "repositoryName": repository["name"],
        "jobName": job,
    }
    answer = _graphql(port, LAUNCH, {"params": {"selector": selector, **params}})["launchRun"]
    assert answer["__typename"] == "LaunchRunSuccess", answer


def _approve(services: Services, port: int, repository: dict[str, Any], key: str) -> str:
    """The partition's snapshot is VALIDATED; approve it through a GraphQL ``launchRun`` of
    ``approve_snapshot`` and return its snapshotId once the run succeeded."""
    catalog = Catalog(services.env["CORPUS_CATALOG_URL"])
    try:
        (snapshot,) = states.for_partition(catalog, key)
        assert snapshot.state == states.VALIDATED  # the blocking check ran in the build run
        config = approval_run_config(key, snapshot.snapshot_id, approver="native-ci")
        _launch(port, repository, "approve_snapshot", runConfigData=config)
        _wait(services, "approve", 60, lambda: _succeeded(services, port, "approve_snapshot"))
        approved = states.get(catalog, snapshot.snapshot_id)
        assert approved.state == states.APPROVED
        assert re.fullmatch(r"dagster-run:\S+ claimed:native-ci", approved.approved_by or "")
        return approved.snapshot_id
    finally:
        catalog.dispose()


@pytest.mark.heavy  # the Dagster webserver, daemon and code server as processes
def test_compose_services_run_natively(services: Services, tmp_path: Path) -> None:
    """Webserver and daemon on the PostgreSQL instance, code from the gRPC server: a build of the
    demo corpus submitted through GraphQL is queued, launched by the daemon on the code server,
    and validates the snapshot in the PostgreSQL catalog (approval is the slow test's)."""
    port, workspace = _start_code_and_webserver(services, tmp_path)
    repository = _repository(services, port)
    for sensor in repository["sensors"]:  # this test submits every run itself
        stopped = _graphql(port, STOP_SENSOR, {"id": sensor["sensorState"]["id"]})
        assert stopped["stopSensor"]["instigationState"]["status"] == "STOPPED", stopped
    _start_daemon(services, workspace, port)

    key = "native-ci"
    selector = {
        "repositoryLocationName": repository["location"]["name"],
        "repositoryName": repository["name"],
    }
    added = _graphql(port, ADD_PARTITION, {"repo": selector, "name": "snapshots", "key": key})
    assert added["addDynamicPartition"]["__typename"] == "AddDynamicPartitionSuccess", added
    tags = [{"key": "dagster/partition", "value": key}]
    metadata = {"tags": tags}
    _launch(port, repository, "build_snapshot", executionMetadata=metadata)
    _wait(services, "build_snapshot", 120, lambda: _succeeded(services, port, "build_snapshot"))
    catalog = Catalog(services.env["CORPUS_CATALOG_URL"])
    try:
        (snapshot,) = states.for_partition(catalog, key)
    finally:
        catalog.dispose()
    assert snapshot.state == states.VALIDATED  # the blocking check ran in that run


@pytest.mark.slow
def test_sensors_build_and_publish_natively(services: Services, tmp_path: Path) -> None:
    """The compose defaults untouched (sensors on): the daemon's
    ``source_discovery`` builds the demo, and after approval its ``publication`` sensor
    activates the alias (about 6 minutes on a loaded 2-core machine)."""
    port, workspace = _start_code_and_webserver(services, tmp_path)
    repository = _repository(services, port)
    _start_daemon(services, workspace, port)
    build = _wait(
        services, "the sensor's build", 480, lambda: _succeeded(services, port, "build_snapshot")
    )
    tags = {tag["key"]: tag["value"] for tag in build["tags"]}
    assert tags["dagster/sensor_name"] == "source_discovery"
    sid = _approve(services, port, repository, tags["dagster/partition"])
    run = _wait(
        services,
        "the sensor's activation",
        180,
        lambda: _succeeded(services, port, "activate_snapshot"),
    )
    assert {t["key"]: t["value"] for t in run["tags"]}["dagster/sensor_name"] == "publication"
    catalog = Catalog(services.env["CORPUS_CATALOG_URL"])
    try:
        row = alias_gate.read_alias_gate(catalog, "demo")
    finally:
        catalog.dispose()
    assert (row.active_snapshot, row.generation) == (sid, 1)
