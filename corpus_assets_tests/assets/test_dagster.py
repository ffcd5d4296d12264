"""Through Dagster: all seven assets + the blocking check for a partition, and both sensors."""

from pathlib import Path

import dagster as dg
import pytest
from sqlalchemy import select

from corpus_assets.assets.jobs import approval_run_config
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.assets.sensors import publication, source_discovery
from corpus_assets.core.governance import alias_gate, deletion_index, states
from corpus_assets.core.runtime.keys import validate_partition_key
from corpus_assets.core.runtime.layer_index import LAYERS
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.catalog import freezes
from corpus_assets.definitions import defs

RESOURCES = {"corpus": CorpusResource()}


def _materialize(instance: dg.DagsterInstance, key: str) -> dg.ExecuteInProcessResult:
    instance.add_dynamic_partitions("snapshots", [key])
    return defs.resolve_job_def("build_snapshot").execute_in_process(
        partition_key=key, instance=instance, raise_on_error=False
    )


def _gate_check(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    (evaluation,) = [
        e for e in result.get_asset_check_evaluations() if e.check_name == "snapshot_validates"
    ]
    return evaluation


@pytest.mark.parametrize(  # the PostgreSQL run repeats the seven-layer build: the slow tier
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.heavy)]
)
def test_materialize_all_seven_layers(
    demo_home: Path, backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend == "postgres":
        monkeypatch.setenv("CORPUS_CATALOG_URL", request.getfixturevalue("postgres_url"))
    with dg.instance_for_test() as instance:
        result = _materialize(instance, "p1")
        assert result.success
        events = result.get_asset_materialization_events()
        by_layer = {e.asset_key.path[-1]: e.materialization for e in events}
        assert set(by_layer) == set(LAYERS)
        assert all(m.partition == "p1" for m in by_layer.values())
        checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
        layer_checks = {f"{layer}_invariants" for layer in LAYERS[:-1]}
        assert checks == dict.fromkeys({"snapshot_validates", *layer_checks}, True)
        sid = _gate_check(result).metadata["snapshotId"].value
        gate_report = _gate_check(result).metadata["gate_report"].value
        assert gate_report["lineage_completeness"] == "100%"
        assert gate_report["canary_chunks"] == 3 and gate_report["set_difference"] == 0
        assert gate_report["transform_replay_hash"].startswith("sha256:")
        assert (gate_report["tombstone_hits"], gate_report["unexplained_rows"]) == (0, 0)
        assert by_layer["manifest"].metadata["snapshotId"].value == sid
        lineage = by_layer["manifest"].metadata["lineage"].value  # Markdown the UI renders
        assert lineage.startswith("```mermaid\nflowchart LR\n") and lineage.endswith("```\n")
        assert sid[:19] in lineage and lineage.count("-->|input of|") >= 6
        assert by_layer["canonical_records"].metadata["records"].value == 289
        dedup = by_layer["dedup_clusters"].metadata
        assert (dedup["exact_duplicates"].value, dedup["near_duplicates"].value) == (4, 1)
        assert dedup["removed"].value == 5
        # counts and output digests of the same name both show, the digest with a suffix
        assert isinstance(dedup["clusters"].value, int)
        assert dedup["clusters_digest"].value.startswith("sha256:")
        assert isinstance(by_layer["packed_blocks"].metadata["tokens"].value, int)
        curve = {r.data["s"]: r.data["p"] for r in dedup["s_curve"].records}  # a table
        assert curve[0.8] == 0.947049 and len(curve) == 10  # typed float columns
        bands = [r.data for r in dedup["bucket_stats"].records]  # a table: class x band
        assert [b["band"] for b in bands if b["class"] == "document/prose"] == list(range(16))
        classes = dedup["classes"].value["document/prose"]
        assert classes["near_duplicates"] == 1 and classes["bands"]["capped_buckets"] == 0
        assert len(by_layer["packed_blocks"].metadata["preview"].value.records) == 10
        splits = by_layer["splits"].metadata  # the per-split report is a table
        per_split = {r.data["split"]: r.data for r in splits["split_report"].value.records}
        assert sum(r["records"] for r in per_split.values()) == splits["records"].value
        assert per_split["train"]["records"] == splits["train"].value
        assert splits["moves"].value == 0 and splits["split_moves"].value == []
        raw = by_layer["raw_snapshot"].metadata
        assert raw["deferred_changes"].value == 0
        sources = {r.data["source"]: r.data for r in raw["preview"].value.records}
        assert sources["essays"]["objects"] == 2 and sources["essays"]["new"] == 2
        assert sources["dialogs"]["unchanged"] == 0 and sources["dialogs"]["removed"] == 0

        with open_workspace() as ws:
            assert states.get(ws.catalog, sid).state == states.VALIDATED
            digests = {layer: ws.catalog.layer_output("p1", layer) for layer in LAYERS}
            # the manifest asset built the snapshot's deletion index, so a lookup finds it
            assert ws.catalog.memo(deletion_index.memo_key(digests["manifest"])) is not None
        assert {k: by_layer[k].tags["dagster/data_version"] for k in LAYERS} == digests

        again = _materialize(instance, "p1")
        assert _gate_check(again).metadata["snapshotId"].value == sid


def test_invalid_partition_key_fails_the_run_with_a_clear_message(demo_home: Path) -> None:
    with dg.instance_for_test() as instance:
        result = _materialize(instance, "Bad Key!")
        assert not result.success
        failure = next(e for e in result.all_events if e.is_step_failure)
        error = failure.step_failure_data.error
        while error.cause is not None:
            error = error.cause
        assert error.cls_name == "PartitionKeyError"
        assert "partition key 'Bad Key!' is invalid" in error.message


def _discover(instance: dg.DagsterInstance, cursor: str | None) -> dg.SensorResult:
    """One daemon-less evaluation of the discovery sensor against the real instance."""
    return source_discovery(
        dg.build_sensor_context(instance=instance, resources=RESOURCES, cursor=cursor)
    )


def _requested(result: dg.SensorResult) -> dg.RunRequest:
    """The one run the evaluation requested, whose partition it also adds."""
    (request,) = result.run_requests
    (add,) = result.dynamic_partitions_requests
    assert add.partition_keys == [request.partition_key]
    assert validate_partition_key(request.partition_key) == request.partition_key
    return request


def test_discovery_sensor_adds_one_partition_per_source_change(demo_home: Path) -> None:
    """A -> B -> A with a build in between: three partitions, three runs, three run keys, each
    naming its partition (a run key naming the source state would repeat A's and be dropped)."""
    late = demo_home / "demo-sources" / "essays" / "essays-00002.jsonl"
    requests, cursor = [], None
    with dg.instance_for_test() as instance:
        for change in (None, "add", "remove"):
            if change == "add":
                late.write_text('{"id": "late", "text": "A late essay arrives."}\n')
            elif change == "remove":
                late.unlink()
            found = _discover(instance, cursor)
            requests.append(_requested(found))
            cursor = found.cursor
            # the same source state is not requested twice while its build is pending
            pending = _discover(instance, cursor)
            assert not pending.run_requests
            assert requests[-1].partition_key in str(pending.skip_reason)
            assert _materialize(instance, requests[-1].partition_key).success
            # after the build froze it, an unchanged source is skipped
            unchanged = _discover(instance, cursor)
            assert not unchanged.run_requests and "unchanged" in str(unchanged.skip_reason)

        keys = [r.partition_key for r in requests]
        assert len(set(keys)) == 3
        assert sorted(instance.get_dynamic_partitions("snapshots")) == sorted(keys)
        run_keys = [r.run_key for r in requests]
        assert len(set(run_keys)) == 3, run_keys
        assert run_keys == [f"build:{key}" for key in keys]
    with open_workspace() as ws, ws.catalog.begin() as conn:
        rows = conn.execute(select(freezes.c.partition_key, freezes.c.fingerprint)).all()
    frozen = {key: fingerprint for key, fingerprint in rows}
    assert frozen[keys[0]] == frozen[keys[2]] != frozen[keys[1]]


def test_discovery_sensor_requests_a_state_its_pending_build_froze_past(demo_home: Path) -> None:
    """Requested at A, the build froze B (the sources moved meanwhile), then they went back to A:
    A is not frozen anywhere, so the sensor requests it rather than waiting on a build that is done.
    """
    late = demo_home / "demo-sources" / "essays" / "essays-00002.jsonl"
    with dg.instance_for_test() as instance:
        first = _discover(instance, None)
        late.write_text('{"id": "late", "text": "A late essay arrives."}\n')
        assert _materialize(instance, _requested(first).partition_key).success
        late.unlink()
        again = _discover(instance, first.cursor)
        assert _requested(again).partition_key != _requested(first).partition_key
        assert not _discover(instance, again.cursor).run_requests


def test_publication_sensor_requests_activation_of_approved_snapshot(demo_home: Path) -> None:
    with dg.instance_for_test() as instance:
        result = _materialize(instance, "p1")
        sid = _gate_check(result).metadata["snapshotId"].value
        context = dg.build_sensor_context(instance=instance, resources=RESOURCES)
        assert not publication(context).run_requests  # VALIDATED is not enough

        approval = defs.resolve_job_def("approve_snapshot").execute_in_process(
            run_config=approval_run_config("p1", sid, "reviewer"), instance=instance
        )
        assert approval.success  # approval bound to the digest, launched as a job with config
        (run,) = publication(
            dg.build_sensor_context(instance=instance, resources=RESOURCES)
        ).run_requests
        assert run.run_key == f"activate:{sid}:generation:0"  # retries of this pair are no-ops

        job = defs.resolve_job_def("activate_snapshot")
        assert job.execute_in_process(run_config=run.run_config, instance=instance).success
        with open_workspace() as ws:
            row = alias_gate.read_alias_gate(ws.catalog, "demo")
            assert (row.generation, row.active_snapshot) == (1, sid)
            assert states.get(ws.catalog, sid).state == states.ACTIVE
        assert not publication(
            dg.build_sensor_context(instance=instance, resources=RESOURCES)
        ).run_requests
