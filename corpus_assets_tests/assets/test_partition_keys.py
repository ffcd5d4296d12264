"""Partition keys are checked where they are created, and a bad one typed into the UI's "Add
partition" has its runs refused (or, under Dagster's stock instance, failed) with a message saying
how to delete it, which then works."""

from pathlib import Path

import dagster as dg
import pytest

from corpus_assets.assets.partition_guard import partition_key_guard
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.cli.instance import DAGSTER_YAML
from corpus_assets.cli.main import main
from corpus_assets.core.runtime.keys import (
    PartitionKeyError,
    check_new_partition_key,
    launch_refusal,
    new_partition_key,
    validate_partition_key,
)
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.definitions import defs
from corpus_assets_tests.cli_process import run

BAD = "Bad Key!"


def test_a_run_time_error_says_how_to_delete_the_partition() -> None:
    with pytest.raises(PartitionKeyError) as info:
        validate_partition_key(BAD)
    message = str(info.value)
    assert message.startswith("partition key 'Bad Key!' is invalid: use 1-64 characters")
    assert "'Delete partitions'" in message and "Materialize" in message  # the UI's way
    assert "`corpus-assets partition delete 'Bad Key!'`" in message  # shell-quoted
    assert validate_partition_key("snap-1") == "snap-1"


def test_a_key_about_to_be_created_is_refused_naming_the_rule_only() -> None:
    for key in (BAD, "", "-x", "A", "x" * 65, "a/b"):
        with pytest.raises(PartitionKeyError, match="is invalid: use 1-64") as info:
            check_new_partition_key(key)
        assert "delete" not in str(info.value)
    taken = {new_partition_key(set(), now=0)}
    assert taken == {"snap-19700101-000000"}
    assert new_partition_key(taken, now=0) == "snap-19700101-000000-2"


def test_cli_build_refuses_a_bad_key_before_touching_anything(tmp_path: Path) -> None:
    done = run(tmp_path, "build", "--partition", BAD)
    assert done.returncode == 1
    assert done.stderr == (
        "corpus-assets: error: partition key 'Bad Key!' is invalid: use 1-64 characters from "
        "[a-z0-9._-], starting with a letter or digit\n"
    )
    assert not (tmp_path / ".dagster").exists() and not (tmp_path / ".corpus").exists()


def _instance(demo_home: Path) -> dg.DagsterInstance:
    """The instance in $DAGSTER_HOME (the demo_home fixture's), as the CLI configures it."""
    home = demo_home.parent / "dagster"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    return dg.DagsterInstance.get()


def test_a_key_added_in_the_ui_fails_clearly_until_deleted(
    demo_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    instance = _instance(demo_home)
    instance.add_dynamic_partitions("snapshots", [BAD])  # what the UI's "Add partition" does
    build = defs.resolve_job_def("build_snapshot")
    # the project's instance (CorpusInstance) refuses the run before it exists, in one line
    with pytest.raises(PartitionKeyError) as refused:
        build.execute_in_process(partition_key=BAD, instance=instance)
    assert str(refused.value) == launch_refusal(BAD)
    assert "corpus-assets partition delete 'Bad Key!'" in str(refused.value)
    assert instance.get_runs() == []
    # under Dagster's stock instance the run starts, and its first step says the same
    with dg.instance_for_test() as stock:
        stock.add_dynamic_partitions("snapshots", [BAD])
        failed = build.execute_in_process(partition_key=BAD, instance=stock, raise_on_error=False)
    assert not failed.success
    error = next(e for e in failed.all_events if e.is_step_failure).step_failure_data.error
    while error.cause is not None:
        error = error.cause
    assert error.cls_name == "PartitionKeyError"
    assert "corpus-assets partition delete 'Bad Key!'" in error.message

    assert main(["partition", "list"]) == 0
    listed = capsys.readouterr().out
    assert listed == (
        "Bad Key!  dagster  not-frozen  no-snapshot  "
        "INVALID KEY: corpus-assets partition delete 'Bad Key!'\n"
    )
    assert main(["partition", "delete", BAD]) == 0
    assert capsys.readouterr().out == "deleted partition 'Bad Key!' from the Dagster instance\n"
    assert instance.get_dynamic_partitions("snapshots") == []

    assert main(["build"]) == 0  # a later run, on a valid key, works
    (key,) = instance.get_dynamic_partitions("snapshots")
    capsys.readouterr()
    assert main(["partition", "list"]) == 0
    assert capsys.readouterr().out.startswith(f"{key}  dagster  frozen  sha256:")


def test_delete_refuses_a_frozen_or_running_partition_without_force(
    demo_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    instance = _instance(demo_home)
    assert main(["build", "--partition", "p1"]) == 0
    assert main(["partition", "delete", "p1"]) == 1
    assert "partition 'p1' is frozen in the catalog" in capsys.readouterr().err
    assert main(["partition", "delete", "nope"]) == 1
    assert "partition 'nope' is not in the Dagster instance" in capsys.readouterr().err

    instance.add_dynamic_partitions("snapshots", ["p2"])
    instance.create_run_for_job(
        job_def=defs.resolve_job_def("build_snapshot"),
        tags={"dagster/partition": "p2"},
        status=dg.DagsterRunStatus.NOT_STARTED,
    )
    assert main(["partition", "delete", "p2"]) == 1
    assert "has a run queued or running" in capsys.readouterr().err

    assert main(["partition", "delete", "p1", "--force"]) == 0
    assert instance.get_dynamic_partitions("snapshots") == ["p2"]
    capsys.readouterr()
    assert main(["partition", "list"]) == 0
    p2, p1 = capsys.readouterr().out.splitlines()
    assert p2 == "p2  dagster  not-frozen  no-snapshot"
    assert p1.startswith("p1  catalog-only  frozen  sha256:")  # the catalog keeps it


def test_launch_refusal_is_one_line_naming_the_key_and_the_rule() -> None:
    refusal = launch_refusal("Bad\nKey")
    assert refusal is not None and "\n" not in refusal
    assert refusal.startswith(
        "refused: partition key 'Bad\\nKey' is invalid: use 1-64 characters from [a-z0-9._-]"
    )
    assert "Delete it: 'Delete partitions' in the UI" in refusal  # no command to paste
    typed = launch_refusal("Bad Key!")
    assert typed is not None and "`corpus-assets partition delete 'Bad Key!'`" in typed
    assert launch_refusal("snap-1") is None and launch_refusal(None) is None


def _guard(instance: dg.DagsterInstance) -> dg.SensorResult:
    """One tick of the guard, as the daemon evaluates it."""
    context = dg.build_sensor_context(instance=instance, resources={"corpus": CorpusResource()})
    return partition_key_guard(context)


def test_the_guard_removes_a_key_added_in_the_ui_and_says_why(demo_home: Path) -> None:
    """The UI's "Add partition" and GraphQL ``addDynamicPartition`` call only
    ``add_dynamic_partitions``: the guard's next tick deletes the bad key; it keeps the good one, a
    bad one whose run is queued (that run refuses itself) and one the catalog froze, saying so in
    one line each."""
    with dg.instance_for_test() as instance:
        assert _guard(instance).skip_reason.skip_message == "every snapshots partition key is valid"
        instance.add_dynamic_partitions("snapshots", ["snap-ok", BAD, "Queued Key", "Old.Key"])
        with open_workspace() as ws:  # frozen under an older rule: its snapshots stay visible
            ws.catalog.record_freeze("Old.Key", "sha256:" + "0" * 64, "fingerprint")
        instance.create_run_for_job(
            job_def=defs.resolve_job_def("check_snapshot"),
            tags={"dagster/partition": "Queued Key"},
            status=dg.DagsterRunStatus.NOT_STARTED,
        )
        result = _guard(instance)
        (request,) = result.dynamic_partitions_requests
        assert isinstance(request, dg.DeleteDynamicPartitionsRequest)
        assert (request.partitions_def_name, request.partition_keys) == ("snapshots", [BAD])
        rule = "use 1-64 characters from [a-z0-9._-], starting with a letter or digit"
        frozen, kept, removed = sorted(result.skip_reason.skip_message.split("; "))
        assert removed == f"removed partition key 'Bad Key!' is invalid: {rule}"
        assert frozen == f"kept partition key 'Old.Key' is invalid: {rule}: the catalog froze it"
        assert kept.startswith(f"kept partition key 'Queued Key' is invalid: {rule}: run ")
        assert kept.endswith(" is queued or running")
