"""The paths a UI user takes: checks per layer, approval without digests, the lifecycle on the
partition, and metadata the UI can plot."""

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from corpus_assets.assets.checks import LAYER_CHECKS, snapshot_validates
from corpus_assets.assets.deletion_audit import tombstone_audit
from corpus_assets.assets.jobs import approval_run_config, approver_identity
from corpus_assets.assets.layer_assets import LAYER_ASSETS
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.assets.schedules import tick
from corpus_assets.assets.sensors import publication, source_discovery
from corpus_assets.core.governance import alias_gate, states
from corpus_assets.core.publication.layer_checks import ERROR, WARN, layer_findings
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.definitions import defs

DEMO_COUNTS = {
    "canonical_records": {"records": 289, "rows_in": 292, "quarantined": 3, "rejected": 0,
                          "quarantined.parse.blank_line": 2, "quarantined.schema.unknown": 1,
                          "unexplained": 0, "dead_letters": 0},
    "dedup_clusters": {"records": 289, "kept": 284, "removed": 5, "exact_duplicates": 4,
                       "near_duplicates": 1, "tombstoned": 0, "duplicate_ids": 0,
                       "clusters": 284},
}  # fmt: skip


def _build(instance: dg.DagsterInstance, key: str) -> dg.ExecuteInProcessResult:
    instance.add_dynamic_partitions("snapshots", [key])
    return defs.resolve_job_def("build_snapshot").execute_in_process(
        partition_key=key, instance=instance, raise_on_error=False
    )


def _observed(instance: dg.DagsterInstance, key: str) -> dict[str, object]:
    """The newest lifecycle observation of ``manifest`` on partition ``key``."""
    records = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("manifest"), asset_partitions=[key]), limit=20
    ).records
    lifecycle = [r for r in records if "state" in r.asset_observation.metadata]
    return {k: v.value for k, v in lifecycle[0].asset_observation.metadata.items()}


def test_layer_invariants_name_what_breaks_and_how_much_it_matters() -> None:
    up = dict(DEMO_COUNTS)
    assert layer_findings("dedup_clusters", DEMO_COUNTS["dedup_clusters"], up) == []
    lost = {**DEMO_COUNTS["dedup_clusters"], "kept": 283}
    (finding,) = [f for f in layer_findings("dedup_clusters", lost, up) if "kept +" in f.text]
    assert finding.severity == ERROR and "289 != 288" in finding.text
    letters = {**DEMO_COUNTS["canonical_records"], "dead_letters": 2}
    assert [f.severity for f in layer_findings("canonical_records", letters, up)] == [WARN]
    unaccounted = {**DEMO_COUNTS["canonical_records"], "rows_in": 293}
    assert "rows_in = records" in layer_findings("canonical_records", unaccounted, up)[0].text
    (missing,) = layer_findings("splits", {"records": 1}, up)
    assert missing.severity == ERROR and "lack" in missing.text


def test_a_check_launched_without_a_partition_is_skipped_not_failed(demo_home: Path) -> None:
    """The UI's "Execute all" on a Checks tab starts a run with no partition."""
    checks = [*LAYER_CHECKS, snapshot_validates]
    job = dg.define_asset_job("checks_only", selection=dg.AssetSelection.checks(*checks))
    unpartitioned = dg.Definitions(
        assets=LAYER_ASSETS,
        asset_checks=checks,
        jobs=[job],
        resources={"corpus": CorpusResource()},
        executor=dg.in_process_executor,
    )
    with dg.instance_for_test() as instance:
        result = unpartitioned.resolve_job_def("checks_only").execute_in_process(
            instance=instance, raise_on_error=False
        )
        assert result.success
        assert result.get_asset_check_evaluations() == []  # Dagster shows them SKIPPED
        logs = [e.message for e in instance.all_logs(result.run_id) if e.message]
        assert sum("launched without a snapshot partition" in m for m in logs) == len(checks)


def test_every_layer_reports_plottable_series_typed_tables_and_a_summary(
    demo_home: Path,
) -> None:
    with dg.instance_for_test() as instance:
        result = _build(instance, "p1")
        assert result.success
        meta = {
            e.asset_key.path[-1]: e.materialization.metadata
            for e in result.get_asset_materialization_events()
        }
    assert all("summary" in m and m["summary"].value.startswith("**") for m in meta.values())
    splits = meta["splits"]
    shares = [splits[f"share.{n}"].value for n in ("train", "validation", "test")]
    assert all(isinstance(s, float) for s in shares) and abs(sum(shares) - 1) < 1e-5
    mixed = meta["mixed_samples"]
    assert isinstance(mixed["share.essays.target"], dg.FloatMetadataValue)
    target = mixed["share.essays.target"].value
    assert mixed["share.essays.realised_docs"].value == pytest.approx(target)
    packed = meta["packed_blocks"]
    assert packed["padding_fraction"].value == pytest.approx(1095 / 49408, abs=1e-6)
    dedup = meta["dedup_clusters"]
    assert dedup["removed_fraction"].value == pytest.approx(5 / 289, abs=1e-6)
    curve = dedup["s_curve"].value
    assert {c.name: c.type for c in curve.schema.columns} == {"s": "float", "p": "float"}
    assert isinstance(curve.records[0].data["p"], float)
    manifest = meta["manifest"]
    assert "state" not in manifest  # the state moves on; observations carry it (lifecycle)
    assert manifest["manifest"].value["snapshotId"] == manifest["snapshotId"].value
    spec = {s.key.path[-1]: s for s in defs.resolve_all_asset_specs()}
    assert "json" in spec["manifest"].kinds and "parquet" not in spec["manifest"].kinds
    assert spec["splits"].owners == ["team:corpus-data"] and spec["splits"].code_version


def test_ui_approval_needs_no_digest_and_the_partition_shows_each_state_move(
    demo_home: Path,
) -> None:
    approve, activate = (defs.resolve_job_def(j) for j in ("approve_snapshot", "activate_snapshot"))
    with dg.instance_for_test() as instance:
        failed = approve.execute_in_process(instance=instance, raise_on_error=False)
        assert not failed.success  # nothing VALIDATED yet: refused, naming why
        assert "no VALIDATED snapshot of alias demo" in str(failed.all_events)
        assert _build(instance, "p1").success
        assert _observed(instance, "p1")["state"] == states.VALIDATED  # from the check
        with open_workspace() as ws:
            (built,) = states.for_partition(ws.catalog, "p1")
        wrong = approval_run_config("p1", snapshot_id="sha256:" + "0" * 64)
        refused = approve.execute_in_process(wrong, instance=instance, raise_on_error=False)
        assert not refused.success and "not the reviewed" in str(refused.all_events)

        # the launchpad's default config approves the newest VALIDATED snapshot
        approved = approve.execute_in_process(
            instance=instance, tags={"dagster/user": "ada@example.com"}
        )
        assert _observed(instance, "p1")["state"] == states.APPROVED
        with open_workspace() as ws:
            snapshot = states.get(ws.catalog, built.snapshot_id)
        assert snapshot.approved_by == f"user:ada@example.com dagster-run:{approved.run_id}"

        activate.execute_in_process(
            {"ops": {"activate_alias": {"config": {"snapshot_id": built.snapshot_id}}}},
            instance=instance,
        )
        seen = _observed(instance, "p1")
        assert (seen["state"], seen["generation"], seen["serving"]) == (states.ACTIVE, 1, True)
        assert "APPROVED | ACTIVE" in str(seen["lifecycle"])
        with open_workspace() as ws:
            assert (
                alias_gate.read_alias_gate(ws.catalog, "demo").active_snapshot == built.snapshot_id
            )


def test_approver_identity_is_the_run_first_and_a_typed_name_only_as_a_claim() -> None:
    assert approver_identity("r1", {}, "") == "dagster-run:r1"
    assert approver_identity("r1", {}, " bob ") == "dagster-run:r1 claimed:bob"
    tags = {"dagster/user": "ada@example.com"}
    assert approver_identity("r1", tags, "eve") == "user:ada@example.com dagster-run:r1 claimed:eve"


def test_sensors_and_the_schedule_wait_for_a_config_on_a_fresh_data_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new compose volume has no corpus.yaml: automation skips saying so, it does not error."""
    monkeypatch.setenv("CORPUS_HOME", str(tmp_path / "fresh"))
    monkeypatch.delenv("CORPUS_CONFIG", raising=False)
    resources = {"corpus": CorpusResource()}
    with dg.instance_for_test() as instance:
        for sensor in (source_discovery, publication, tombstone_audit):
            result = sensor(dg.build_sensor_context(instance=instance, resources=resources))
            assert not result.run_requests
            assert "no corpus config at" in str(result.skip_reason)
        skipped = tick(dg.build_schedule_context(instance=instance), CorpusResource())
        assert isinstance(skipped, dg.SkipReason) and "no corpus config" in str(skipped)


def test_loading_the_code_location_prints_no_warning(tmp_path: Path) -> None:
    """`dagster dev` printed a BetaWarning per step process; loading the definitions must be
    silent (no warning about the root dagster.yaml either: test_instance_home)."""
    load = "from corpus_assets.definitions import defs; defs.get_repository_def().get_all_jobs()"
    env = {**os.environ, "CORPUS_HOME": str(tmp_path), "DAGSTER_HOME": str(tmp_path)}
    env.pop("CORPUS_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", load], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
