"""A run of a partition key that breaks the rule is refused where Dagster creates it
(``CorpusInstance``), with ``launch_refusal``'s one line, before anything of it is recorded: no
run, no event (so no asset is drawn red), no partition added. Through the instance, and through
the GraphQL ``launchRun`` the UI's Launchpad sends to a real webserver.
"""

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from corpus_assets.cli.instance import dagster_instance
from corpus_assets.core.runtime.keys import PartitionKeyError, launch_refusal
from corpus_assets.core.runtime.layer_index import LAYERS
from corpus_assets.definitions import defs
from corpus_assets.demo import write_demo
from corpus_assets_tests.ui_servers import (
    BIN,
    GraphQL,
    dagster_home,
    free_port,
    latest_runs,
    location_loaded,
    partition_keys,
    runs,
    server_env,
    start_group,
    stop_groups,
    wait_for,
)

BAD = "Bad_Key!"  # the UI's "Add partition" takes it; the rule does not
ASSET_JOB = "__ASSET_JOB"  # what the UI's Materialize button launches
JOBS = ["build_snapshot", "check_snapshot", "approve_snapshot", ASSET_JOB]
# every other argument of DagsterInstance.create_run (keyword-only, no defaults)
CREATE_RUN_ARGS = [
    "run_id",
    "run_config",
    "status",
    "root_run_id",
    "parent_run_id",
    "step_keys_to_execute",
    "execution_plan_snapshot",
    "job_snapshot",
    "parent_job_snapshot",
    "asset_selection",
    "asset_check_selection",
    "resolved_op_selection",
    "op_selection",
    "remote_job_origin",
    "job_code_origin",
    "asset_graph",
]


def _job(name: str) -> dg.JobDefinition:
    if name == ASSET_JOB:
        return defs.resolve_implicit_global_asset_job_def()
    return defs.resolve_job_def(name)


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The project's instance (CorpusInstance) in a throwaway DAGSTER_HOME, holding the bad key
    as the UI's "Add partition" leaves it."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    with dagster_instance() as made:
        assert type(made).__name__ == "CorpusInstance"
        made.add_dynamic_partitions("snapshots", [BAD])
        yield made


def _nothing_recorded(instance: Any) -> None:
    assert instance.get_runs() == []
    assert instance.event_log_storage.get_maximum_record_id() is None  # not one event
    assert instance.get_dynamic_partitions("snapshots") == [BAD]  # and no new partition


def test_every_job_of_an_invalid_key_is_refused_before_its_run_exists(instance: Any) -> None:
    refusal = launch_refusal(BAD)
    assert refusal is not None and "\n" not in refusal
    assert {j.partitions_def for j in defs.resolve_all_job_defs()} - {None} == {
        _job("build_snapshot").partitions_def
    }  # one partitioning in this code location: every partition key is a snapshots key
    for name in JOBS:
        with pytest.raises(PartitionKeyError) as refused:
            instance.create_run_for_job(_job(name), tags={"dagster/partition": BAD})
        assert str(refused.value) == refusal, name
    range_tags = {
        "dagster/asset_partition_range_start": "snap-1",
        "dagster/asset_partition_range_end": BAD,
    }
    with pytest.raises(PartitionKeyError, match="Bad_Key!"):
        instance.create_run_for_job(_job(ASSET_JOB), tags=range_tags)
    # the path the webserver, the daemon's sensors, schedules and backfills take
    with pytest.raises(PartitionKeyError, match=r"^refused: partition key 'Bad_Key!'"):
        instance.create_run(
            job_name="build_snapshot",
            tags={"dagster/partition": BAD},
            **dict.fromkeys(CREATE_RUN_ARGS),
        )
    _nothing_recorded(instance)


def test_a_valid_key_and_no_key_still_make_runs(instance: Any) -> None:
    instance.add_dynamic_partitions("snapshots", ["snap-1"])
    named = instance.create_run_for_job(
        _job("check_snapshot"), tags={"dagster/partition": "snap-1"}
    )
    assert named.tags["dagster/partition"] == "snap-1"
    unnamed = instance.create_run_for_job(_job("approve_snapshot"))
    assert "dagster/partition" not in unnamed.tags


LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
ADD_PARTITION = """mutation($key: String!) { addDynamicPartition(partitionsDefName: "snapshots",
  partitionKey: $key, repositorySelector: {repositoryName: "__repository__",
  repositoryLocationName: "corpus_assets"}) { __typename } }"""


def _launch(gql: GraphQL, params: dict[str, Any]) -> dict[str, Any]:
    """``launchRun``'s answer. The webserver may send a captured PythonError with HTTP status
    500 (seen under pytest only); the UI reads the body either way, and so does this."""
    body = json.dumps({"query": LAUNCH, "variables": {"params": params}}).encode()
    request = urllib.request.Request(
        f"{gql.base}/graphql", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)["data"]["launchRun"]
    except urllib.error.HTTPError as error:
        return json.load(error)["data"]["launchRun"]


def test_the_launchpads_graphql_launch_of_an_invalid_key_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    """A webserver only (no daemon: nothing else moves the partitions meanwhile)."""
    home = tmp_path / "corpus"
    config = write_demo(home)
    env = server_env(dagster_home(tmp_path / "dagster"), home, config)
    port = free_port()
    web = [str(BIN / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port)]
    groups = [start_group("webserver", [*web, "-w", "workspace.yaml"], env, tmp_path)]
    try:
        gql = GraphQL(port)
        wait_for("the webserver and its code location", lambda: location_loaded(gql), 180)
        added = gql.query(ADD_PARTITION, {"key": BAD})["addDynamicPartition"]
        assert added["__typename"] == "AddDynamicPartitionSuccess", added
        selector = {
            "repositoryLocationName": "corpus_assets",
            "repositoryName": "__repository__",
            "jobName": "build_snapshot",
        }
        tags = [{"key": "dagster/partition", "value": BAD}]
        params = {"selector": selector, "executionMetadata": {"tags": tags}}
        answer = _launch(gql, params)
        assert answer["__typename"] == "PythonError", answer
        # what the Launchpad's error dialog says: the exception's type, then the one line
        where = "corpus_assets.core.runtime.keys.PartitionKeyError"
        assert answer["message"] == f"{where}: {launch_refusal(BAD)}\n"
        assert runs(gql, "build_snapshot") == []
        assert latest_runs(gql, list(LAYERS)) == dict.fromkeys(LAYERS)  # no run: none red
        assert partition_keys(gql) == [BAD]
    finally:
        stop_groups(groups)
