"""The checks of one partition, run again on their own through Dagster (the ``check_snapshot``
job the UI's Launchpad launches with a partition): nothing is rebuilt, and each verdict is
recorded on its own partition only."""

from pathlib import Path

import dagster as dg

from corpus_assets.assets.checks import LAYER_CHECKS, snapshot_validates
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.definitions import defs

CHECKS = {key for c in [*LAYER_CHECKS, snapshot_validates] for key in c.check_keys}
GATE = dg.AssetCheckKey(dg.AssetKey("manifest"), "snapshot_validates")


def _history(instance: dg.DagsterInstance, key: dg.AssetCheckKey) -> dict[str, list[str]]:
    """Run ids of each partition's executions of check ``key``, newest first."""
    records = instance.event_log_storage.get_asset_check_execution_history(key, limit=50)
    by_partition: dict[str, list[str]] = {}
    for record in records:
        by_partition.setdefault(str(record.partition), []).append(record.run_id)
    return by_partition


def _gate(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    (gate,) = [e for e in result.get_asset_check_evaluations() if e.asset_check_key == GATE]
    return gate


def test_check_snapshot_rechecks_one_partition_only_and_builds_nothing(demo_home: Path) -> None:
    build, check = (defs.resolve_job_def(j) for j in ("build_snapshot", "check_snapshot"))
    with dg.instance_for_test() as instance:
        for key in ("p1", "p2"):
            instance.add_dynamic_partitions("snapshots", [key])
        built_p1, built_p2 = (
            build.execute_in_process(partition_key=key, instance=instance) for key in ("p1", "p2")
        )
        built = {"p1": built_p1.run_id, "p2": built_p2.run_id}

        result = check.execute_in_process(partition_key="p1", instance=instance)
        assert result.success and result.dagster_run.tags["dagster/partition"] == "p1"
        assert result.get_asset_materialization_events() == []  # no layer rebuilt
        started = {e.step_key for e in result.all_events if e.is_step_start}
        assert started == {c.name for c in CHECKS}
        evaluated = {
            (e.asset_check_key, e.partition, e.passed) for e in result.get_asset_check_evaluations()
        }
        assert evaluated == {(c, "p1", True) for c in CHECKS}
        trusted = {  # the build's check trusts unchanged files; a re-check re-hashes every byte
            r.run_id: _gate(r).metadata["objects_trusted"].value for r in (result, built_p1)
        }
        assert trusted[result.run_id] == 0 < trusted[built_p1.run_id]
        for key in CHECKS:  # the UI's per-partition view reads exactly this
            assert _history(instance, key) == {
                "p1": [result.run_id, built["p1"]],
                "p2": [built["p2"]],
            }

        # break p1 only: its gate fails on re-check, p2's verdict stays and re-checks green
        with open_workspace() as ws:
            manifest = ws.catalog.layer_output("p1", "manifest")
            assert manifest != ws.catalog.layer_output("p2", "manifest")
            ws.cas.local_path(manifest).unlink()
        broken = check.execute_in_process(
            partition_key="p1", instance=instance, raise_on_error=False
        )
        assert not _gate(broken).passed
        latest = instance.event_log_storage.get_asset_check_execution_history(GATE, limit=50)
        status = {}
        for record in latest:  # newest first: keep each partition's latest
            status.setdefault(record.partition, (record.run_id, record.status.value))
        assert status == {"p1": (broken.run_id, "FAILED"), "p2": (built["p2"], "SUCCEEDED")}
        again = check.execute_in_process(partition_key="p2", instance=instance)
        assert _gate(again).passed

        # without a partition (the Launchpad allows it), or for one not built yet: every check is
        # skipped saying why, none fails, so no partition turns red
        unpartitioned = check.execute_in_process(instance=instance)
        assert unpartitioned.success and unpartitioned.get_asset_check_evaluations() == []
        instance.add_dynamic_partitions("snapshots", ["p3"])
        unbuilt = check.execute_in_process(partition_key="p3", instance=instance)
        assert unbuilt.success and unbuilt.get_asset_check_evaluations() == []
        logs = [e.message for e in instance.all_logs(unbuilt.run_id) if e.message]
        assert (
            sum(m.startswith("skipped: ") and "not built for partition p3" in m for m in logs) == 7
        )
