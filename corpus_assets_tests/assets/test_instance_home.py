"""The Dagster instance of a checkout is its root ``dagster.yaml``: ``dagster dev`` (``make ui``)
started there warns about no stray instance file, and the CLI run there uses the same instance.

The checkout is a throwaway folder holding the repository's ``dagster.yaml`` and
``workspace.yaml`` (the repository's own ``.dagster`` is somebody's work), with
``DAGSTER_HOME`` set as the Makefile sets it: to that folder.
"""

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from corpus_assets.assets.instance import NEW_SNAPSHOT_TAG
from corpus_assets.cli.instance import DAGSTER_YAML, dagster_instance
from corpus_assets.core.runtime.keys import is_valid_partition_key
from corpus_assets.demo import write_demo
from corpus_assets_tests.ui_servers import (
    BIN,
    REPO,
    GraphQL,
    Servers,
    free_port,
    location_loaded,
    start_group,
    stop_groups,
    wait_for,
)

STRAY_WARNING = "Found a dagster instance configuration"
# folders Dagster's webserver makes in $DAGSTER_HOME whatever the config (telemetry upload, the
# first-visit notice), empty with telemetry off; ignored by git at the repository root
TELEMETRY_DIRS = {"logs", ".logs_queue", ".nux"}
STORAGE_KEYS = ("storage", "local_artifact_storage", "compute_logs")
ADD_PARTITION = """mutation($key: String!) { addDynamicPartition(partitionsDefName: "snapshots",
  partitionKey: $key, repositorySelector: {repositoryName: "__repository__",
  repositoryLocationName: "corpus_assets"}) { __typename ... on PythonError { message } } }"""


def checkout_env(checkout: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    return {**env, "CORPUS_HOME": str(checkout / ".corpus"), "PYTHONUNBUFFERED": "1", **extra}


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Servers]]:
    """``dagster dev -w workspace.yaml`` in a checkout, ``DAGSTER_HOME`` = that folder."""
    checkout = tmp_path_factory.mktemp("checkout")
    for name in ("dagster.yaml", "workspace.yaml"):
        shutil.copy(REPO / name, checkout / name)
    write_demo(checkout / ".corpus")
    env = checkout_env(checkout, DAGSTER_HOME=str(checkout))
    port = free_port()
    argv = [str(BIN / "dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]
    logs = checkout.parent / f"{checkout.name}-logs"
    logs.mkdir()
    groups = []
    try:
        group = start_group("dagster-dev", argv, env, logs, cwd=checkout)
        groups.append(group)
        gql = GraphQL(port)
        wait_for("dagster dev and its code location", lambda: location_loaded(gql), 180)
        yield checkout, Servers(gql, port, env, groups)
    finally:
        stop_groups(groups, grace=30)


def test_dagster_dev_in_the_checkout_warns_of_no_stray_dagster_yaml(
    dev: tuple[Path, Servers],
) -> None:
    checkout, servers = dev
    log = servers.groups[0].log.read_text()
    assert "Launching Dagster services" in log, log
    assert STRAY_WARNING not in log, log
    assert "Using temporary directory" not in log, log
    assert (checkout / ".dagster" / "history" / "runs.db").exists()
    made = {p.name for p in checkout.iterdir()} - {".corpus", "dagster.yaml", "workspace.yaml"}
    assert ".dagster" in made and made <= {".dagster", *TELEMETRY_DIRS}, made
    assert all(not any((checkout / d).iterdir()) for d in made & TELEMETRY_DIRS)
    ignored = (REPO / ".gitignore").read_text().split()
    assert all(f"/{d}/" in ignored for d in TELEMETRY_DIRS)


def test_the_cli_in_the_checkout_uses_the_instance_dagster_dev_shows(
    dev: tuple[Path, Servers],
) -> None:
    checkout, servers = dev
    done = servers.gql.query(ADD_PARTITION, {"key": "snap-20260101-000000"})
    assert done["addDynamicPartition"]["__typename"] == "AddDynamicPartitionSuccess", done
    listed = subprocess.run(
        [str(BIN / "corpus-assets"), "partition", "list"],
        cwd=checkout,
        env=checkout_env(checkout),  # no DAGSTER_HOME: the folder's dagster.yaml is the instance
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert "snap-20260101-000000  dagster" in listed.stdout, listed.stdout
    assert not (checkout / ".dagster" / "dagster.yaml").exists()  # no second instance
    # from another folder, DAGSTER_HOME naming the checkout: its .dagster, not ./.dagster
    elsewhere = checkout.parent / f"{checkout.name}-elsewhere"
    elsewhere.mkdir()
    listed = subprocess.run(
        [str(BIN / "corpus-assets"), "partition", "list"],
        cwd=elsewhere,
        env=checkout_env(checkout, DAGSTER_HOME=str(checkout)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert "snap-20260101-000000  dagster" in listed.stdout, listed.stdout
    assert list(elsewhere.iterdir()) == []


def test_the_cli_elsewhere_keeps_its_own_instance_in_dot_dagster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh folder without dagster.yaml: the CLI's copy of the config in ./.dagster."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    with dagster_instance() as instance:
        assert type(instance).__name__ == "CorpusInstance"
        assert instance.get_runs() == []
    assert (tmp_path / ".dagster" / "dagster.yaml").read_text() == DAGSTER_YAML
    assert (tmp_path / ".dagster" / "history" / "runs.db").exists()


def test_the_cli_copy_is_the_root_config_with_storage_in_dagster_home() -> None:
    root = yaml.safe_load((REPO / "dagster.yaml").read_text())
    copy = yaml.safe_load(DAGSTER_YAML)
    assert {k: v for k, v in root.items() if k not in STORAGE_KEYS} == {
        k: v for k, v in copy.items() if k != "storage"
    }
    assert root["storage"] == {"sqlite": {"base_dir": ".dagster"}}
    assert copy["storage"] == {"sqlite": {"base_dir": {"env": "DAGSTER_HOME"}}}
    for key in STORAGE_KEYS[1:]:
        assert root[key]["config"]["base_dir"].startswith(".dagster"), root[key]


@pytest.mark.parametrize("config", ["root", "cli copy"])
def test_no_instance_opens_the_community_dialog_over_the_ui(
    config: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The "Join the Dagster community" dialog opens a second after a page loads and closes the
    menu the user had open (a browser test's partition picker, once): every instance we ship
    turns it off."""
    text = (REPO / "dagster.yaml").read_text() if config == "root" else DAGSTER_YAML
    (tmp_path / "dagster.yaml").write_text(text)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with dagster_instance() as instance:
        assert instance.nux_enabled is False
    assert yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())["nux"] == {
        "enabled": False
    }


def test_the_root_instance_limits_build_runs_to_one_and_every_build_run_is_tagged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run queue's limit is loaded from the root dagster.yaml; the tag is a run tag of the
    job, so launched runs and the CLI's in-process build (execute_in_process merges the job's run
    tags) carry it, and the queue counts a CLI build while it runs."""
    from corpus_assets.definitions import defs

    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with dagster_instance() as instance:
        limits = instance.get_concurrency_config().run_queue_config.tag_concurrency_limits
    assert defs.resolve_job_def("build_snapshot").run_tags["corpus/build"] == "snapshot"
    assert limits == [{"key": "corpus/build", "limit": 1}]


@pytest.fixture
def corpus_instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The CLI's instance (CorpusInstance) in a throwaway DAGSTER_HOME."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    with dagster_instance() as instance:
        yield instance


def test_a_partitionless_build_run_is_created_for_a_new_valid_partition(
    corpus_instance: Any,
) -> None:
    from corpus_assets.definitions import defs

    job = defs.resolve_job_def("build_snapshot")
    run = corpus_instance.create_run_for_job(job)
    key = run.tags["dagster/partition"]
    assert is_valid_partition_key(key) and run.tags[NEW_SNAPSHOT_TAG] == "true"
    assert corpus_instance.get_dynamic_partitions("snapshots") == [key]
    planned = corpus_instance.get_records_for_run(
        run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
    ).records
    assert len(planned) == 7  # what Dagster records at creation names the new partition
    for record in planned:
        data = record.event_log_entry.dagster_event.event_specific_data
        subset = data.partitions_subset
        assert (list(subset.get_partition_keys()) if subset else [data.partition]) == [key], data


@pytest.mark.parametrize(
    "tags",
    [{"dagster/partition": "snap-20260101-000000"}, {"dagster/backfill": "abcd"}],
    ids=["partition", "backfill"],
)
def test_a_build_run_that_names_its_partition_is_left_alone(
    corpus_instance: Any, tags: dict[str, str]
) -> None:
    from corpus_assets.definitions import defs

    run = corpus_instance.create_run_for_job(defs.resolve_job_def("build_snapshot"), tags=tags)
    assert NEW_SNAPSHOT_TAG not in run.tags and run.tags.get("dagster/partition") == tags.get(
        "dagster/partition"
    )
    assert corpus_instance.get_dynamic_partitions("snapshots") == []


def test_the_sensor_counts_a_ui_launched_new_snapshot_as_in_flight(
    demo_home: Path, corpus_instance: Any
) -> None:
    """A UI launch made before the sensor's tick: the sensor does not build the same sources
    again while that run waits (it is tagged like any build, fingerprint unknown)."""
    from corpus_assets.assets.resources import CorpusResource
    from corpus_assets.assets.sensors import source_discovery
    from corpus_assets.definitions import defs

    run = corpus_instance.create_run_for_job(defs.resolve_job_def("build_snapshot"))
    assert run.status == dg.DagsterRunStatus.NOT_STARTED  # created, not yet running
    key = run.tags["dagster/partition"]
    context = dg.build_sensor_context(
        instance=corpus_instance, resources={"corpus": CorpusResource()}
    )
    result = source_discovery(context)
    assert not result.run_requests
    assert f"partition {key} is requested for this source state" in str(result.skip_reason)
