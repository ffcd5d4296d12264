"""Deletion lineage in the UI: the ``tombstone_audit`` sensor launches ``tombstone_hits`` for each
new tombstone; the run's output is the same answer ``corpus-assets tombstone hits`` prints, and
each snapshot it reaches shows the tombstone on its ``manifest`` partition."""

import json
from pathlib import Path

import dagster as dg
import pytest

from corpus_assets.assets.deletion_audit import tombstone_audit
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.definitions import defs
from corpus_assets_tests.cli_process import output_field, run

PURPOSE = "demo-pretraining"


def _observations(instance: dg.DagsterInstance, key: str) -> list[dict]:
    records = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("manifest"), asset_partitions=[key]), limit=50
    ).records
    return [r.asset_observation.metadata for r in records]


def test_each_new_tombstone_is_traced_in_the_ui_as_the_cli_answers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = output_field(run(tmp_path, "demo").stdout, "snapshotId")
    assert run(tmp_path, "read", sid, "--run-id", "audit-1", "--purpose", PURPOSE).returncode == 0
    for record in ("essays/e0001", "essays/e0020"):  # a member; a removed near copy
        added = run(tmp_path, "tombstone", "add", "--record", record, "--reason", "erasure")
        assert added.returncode == 0, added.stderr
    cli = [json.loads(run(tmp_path, "tombstone", "hits", str(seq)).stdout) for seq in (1, 2)]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CORPUS_HOME", str(tmp_path / ".corpus"))
    monkeypatch.delenv("CORPUS_CONFIG", raising=False)
    resources = {"corpus": CorpusResource()}
    job = defs.resolve_job_def("tombstone_hits")
    with dg.instance_for_test() as instance:
        context = dg.build_sensor_context(instance=instance, resources=resources)
        ticked = tombstone_audit(context)
        assert [r.tags["corpus/tombstone"] for r in ticked.run_requests] == ["1", "2"]
        assert len({r.run_key for r in ticked.run_requests}) == 2
        cursor = ticked.cursor
        again = dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor)
        assert not tombstone_audit(again).run_requests  # each tombstone is traced once

        for request, expected in zip(ticked.run_requests, cli, strict=True):
            result = job.execute_in_process(request.run_config, instance=instance)
            (output,) = [e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT"]
            shown = output.step_output_data.metadata
            assert shown["lineage"].value == expected  # one function answers both
            (row,) = [dict(r.data) for r in shown["hits"].records]
            (hit,) = expected["snapshots"]
            assert row["snapshot_id"] == sid and row["runs"] == "audit-1"
            assert (row["members"], row["carried"]) == (len(hit["members"]), len(hit["carried_by"]))
            assert (row["spans"], row["blocks"]) == (len(hit["spans"]), len(hit["blocks"]))
        assert any(c["snapshots"][0]["spans"] for c in cli)  # not vacuous: spans were counted
        assert cli[0]["snapshots"][0]["members"] == ["essays/e0001"]
        assert cli[1]["snapshots"][0]["carried_by"][0]["record_id"] == "essays/e0020"

        key = cli[0]["snapshots"][0]["partition"]
        pages = [m for m in _observations(instance, key) if "tombstone_hits" in m]
        assert {m["tombstone"].value for m in pages} == {1, 2}
        page = next(m["tombstone_hits"].value for m in pages if m["tombstone"].value == 1)
        assert "`essays/e0001`" in page and "audit-1" in page
        newest = _observations(instance, key)[0]  # still says where the snapshot stands
        assert (newest["state"].text, newest["snapshotId"].text) == ("ACTIVE", sid)
