"""Publication states on both catalogs: an alias only moves to a later freeze (older approved
snapshots end SUPERSEDED), and a snapshot that fails validation ends REJECTED with the failed
rules in its history, through the real sensor, Dagster check and CLI."""

import json
import re
from pathlib import Path

import dagster as dg
import pytest
from sqlalchemy import insert, select

from corpus_assets.assets.checks import snapshot_validates
from corpus_assets.assets.layer_assets import LAYER_ASSETS, manifest
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.assets.sensors import publication
from corpus_assets.cli.main import main
from corpus_assets.core.governance import alias_gate, states
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.publish import next_to_activate
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.catalog import snapshot_events, tombstones
from corpus_assets.definitions import defs
from corpus_assets_tests.conftest import POSTGRES_IN_SLOW_TIER

pytestmark = POSTGRES_IN_SLOW_TIER  # each test builds and publishes through the CLI and Dagster
RESOURCES = {"corpus": CorpusResource()}


def _validated(ws: Workspace, key: str) -> str:
    sid = build_all(ws, key)["manifest"].digests["snapshotId"]
    report = validate_snapshot(ws, sid)
    assert report.ok, report.findings
    return sid


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The real entry point, in-process: exit code, stdout, stderr."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _status(capsys: pytest.CaptureFixture[str]) -> dict[str, dict]:
    code, out, err = _cli(capsys, "status", "--json")
    assert code == 0, err
    return {s["snapshotId"]: s for s in json.loads(out)["snapshots"]}


def _history(ws: Workspace, sid: str) -> list[tuple[str | None, str, str | None]]:
    """The snapshot's audit rows, oldest first: (from, to, detail)."""
    with ws.catalog.begin() as conn:
        rows = conn.execute(
            select(
                snapshot_events.c.from_state, snapshot_events.c.to_state, snapshot_events.c.detail
            )
            .where(snapshot_events.c.snapshot_id == sid)
            .order_by(snapshot_events.c.id)
        ).all()
    return [tuple(row) for row in rows]


def _run_publication_until_idle(instance: dg.DagsterInstance) -> int:
    """Tick the real sensor and execute each run it requests, as the daemon would, until it
    requests nothing; returns how many activations ran."""
    job = defs.resolve_job_def("activate_snapshot")
    ran = 0
    for _tick in range(6):
        result = publication(dg.build_sensor_context(instance=instance, resources=RESOURCES))
        if not result.run_requests:
            return ran
        for run in result.run_requests:
            assert job.execute_in_process(run_config=run.run_config, instance=instance).success
            ran += 1
    pytest.fail("the publication sensor kept requesting activations")


def test_the_sensor_leaves_the_alias_on_the_newer_snapshot(workspace: Workspace) -> None:
    older, newer = _validated(workspace, "p1"), _validated(workspace, "p2")
    for sid in (older, newer):
        states.approve(workspace.catalog, sid, by="reviewer")
    with dg.instance_for_test() as instance:
        activations = _run_publication_until_idle(instance)
    row = alias_gate.read_alias_gate(workspace.catalog, "demo")
    assert (row.active_snapshot, row.generation) == (newer, 1), f"older is {older}"
    assert activations == 1
    assert states.get(workspace.catalog, newer).state == states.ACTIVE
    assert states.get(workspace.catalog, older).state == states.SUPERSEDED
    (last,) = _history(workspace, older)[-1:]
    assert last[:2] == (states.APPROVED, states.SUPERSEDED) and newer in (last[2] or "")
    assert next_to_activate(workspace.catalog) == []


def test_the_cli_refuses_to_move_an_alias_to_an_older_freeze(
    workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    older, newer = _validated(workspace, "p1"), _validated(workspace, "p2")
    for sid in (older, newer):
        assert _cli(capsys, "approve", sid, "--by", "alice")[0] == 0
    code, out, err = _cli(capsys, "activate", newer)
    assert code == 0, err
    assert out == f"alias demo -> {newer} generation 1\n"

    code, out, err = _cli(capsys, "activate", older)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert older in err and newer in err and "an alias only moves to a later freeze" in err, err
    row = alias_gate.read_alias_gate(workspace.catalog, "demo")
    assert (row.active_snapshot, row.generation) == (newer, 1)
    shown = _status(capsys)
    assert (shown[older]["state"], shown[newer]["state"]) == ("SUPERSEDED", "ACTIVE")
    assert newer in shown[older]["reason"]
    code, out, _err = _cli(capsys, "status")
    assert re.search(rf"p1 +SUPERSEDED +{older}$", out, re.MULTILINE), out


def test_a_snapshot_older_than_the_active_one_is_not_approved(
    workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    """Still BUILDING when a newer freeze went live, it could never be activated: approving it
    would leave an APPROVED snapshot that nothing will ever publish."""
    older = build_all(workspace, "p1")["manifest"].digests["snapshotId"]  # not validated yet
    newer = _validated(workspace, "p2")
    assert _cli(capsys, "approve", newer, "--by", "alice")[0] == 0
    assert _cli(capsys, "activate", newer)[0] == 0

    code, _out, err = _cli(capsys, "approve", older, "--by", "alice")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"refusing to approve {older}" in err and newer in err, err
    assert "an alias only moves to a later freeze" in err, err
    assert states.get(workspace.catalog, older).state != states.APPROVED
    assert next_to_activate(workspace.catalog) == []


def test_rollback_to_an_earlier_active_snapshot_still_works(
    workspace: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _validated(workspace, "p1")
    assert _cli(capsys, "approve", first, "--by", "alice")[0] == 0
    assert _cli(capsys, "activate", first)[0] == 0
    second = _validated(workspace, "p2")
    assert _cli(capsys, "approve", second, "--by", "alice")[0] == 0
    assert _cli(capsys, "activate", second)[0] == 0

    code, out, err = _cli(capsys, "rollback", first)
    assert code == 0, err
    assert out == f"alias demo -> {first} generation 3 (rollback)\n"
    assert next_to_activate(workspace.catalog) == []  # nothing rolls it forward behind our back
    # a later freeze still activates after the rollback
    third = _validated(workspace, "p3")
    assert _cli(capsys, "approve", third, "--by", "alice")[0] == 0
    assert [s.snapshot_id for s in next_to_activate(workspace.catalog)] == [third]
    assert _cli(capsys, "activate", third)[1] == f"alias demo -> {third} generation 4\n"


def _rejection(ws: Workspace, sid: str) -> str:
    """The detail of the event that rejected ``sid`` (its last), asserting it is REJECTED."""
    assert states.get(ws.catalog, sid).state == states.REJECTED
    source, target, detail = _history(ws, sid)[-1]
    assert (source, target) == (states.BUILDING, states.REJECTED)
    return detail or ""


def test_a_failed_dagster_check_rejects_the_snapshot_naming_the_rule(
    workspace: Workspace,
) -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("snapshots", ["p1"])
        built = dg.materialize(
            LAYER_ASSETS, partition_key="p1", instance=instance, resources=RESOURCES
        )
        sid = built.asset_materializations_for_node("manifest")[0].metadata["snapshotId"].value
        assert states.get(workspace.catalog, sid).state == states.BUILDING
        with workspace.catalog.begin() as conn:  # a revocation at the freeze's watermark
            conn.execute(
                insert(tombstones).values(seq=0, record_id="essays/e0001", reason="erase", at=0.0)
            )
        checked = dg.materialize(
            [*LAYER_ASSETS, snapshot_validates],
            selection=dg.AssetSelection.assets(manifest),  # the manifest and its check only
            partition_key="p1",
            instance=instance,
            resources=RESOURCES,
            raise_on_error=False,
        )
    (evaluation,) = checked.get_asset_check_evaluations()
    assert not evaluation.passed
    assert evaluation.metadata["state"].value == states.REJECTED
    detail = _rejection(workspace, sid)
    assert "no_tombstone_hits: tombstone 0 (record 'essays/e0001') hits this snapshot" in detail


def test_a_snapshot_rejected_through_the_cli_is_rebuilt_as_a_new_attempt(
    workspace: Workspace, demo_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = build_all(workspace, "p1")["manifest"].digests["snapshotId"]
    config = demo_home / "corpus.yaml"
    original = config.read_text()
    config.write_text(original + "  quality: {min_chars: 200}\n")  # the canary no longer replays
    code, _out, err = _cli(capsys, "approve", sid, "--by", "alice")
    assert code == 1 and "canary replay of" in err, err
    assert "canary_reproduces: canary replay of" in _rejection(workspace, sid)
    assert _status(capsys)[sid]["state"] == "REJECTED"

    config.write_text(original)  # the fix; a REJECTED snapshot is not approved as it stands
    code, _out, err = _cli(capsys, "approve", sid, "--by", "alice")
    assert code == 1 and "REJECTED" in err and "--partition p1" in err, err

    code, out, err = _cli(capsys, "build", "--partition", "p1")  # the same content, again
    assert code == 0, err
    assert f"snapshotId {sid} state VALIDATED" in out
    moves = [(source, target) for source, target, _detail in _history(workspace, sid)]
    assert moves == [
        (None, states.BUILDING),
        (states.BUILDING, states.REJECTED),
        (states.REJECTED, states.BUILDING),
        (states.BUILDING, states.VALIDATED),
    ]
    assert "attempt 2" in (_history(workspace, sid)[2][2] or "")
    assert _cli(capsys, "approve", sid, "--by", "alice")[0] == 0
