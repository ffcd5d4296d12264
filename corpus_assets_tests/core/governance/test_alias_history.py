"""An alias's audit trail (``core.governance.history``): approvals, activations, a rollback and
a refused activation, each with its actor, generation and fences, in the core and in the UI."""

from pathlib import Path

import dagster as dg
import pytest

from corpus_assets.assets import lifecycle
from corpus_assets.assets.jobs import activation_run_config, approval_run_config
from corpus_assets.core.governance import alias_gate, states
from corpus_assets.core.governance.history import Move, alias_moves, count_moves
from corpus_assets.core.governance.tombstones import add_tombstone
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication import publish
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.definitions import defs

Row = tuple[str, str | None, str, str, int, int | None, int | None]


def _validated(ws: Workspace, key: str) -> str:
    sid = build_all(ws, key)["manifest"].digests["snapshotId"]
    assert validate_snapshot(ws, sid).ok
    return sid


def _gate_rows(moves: list[Move]) -> list[Row]:
    """The moves past validation: (snapshot, from, to, actor, generation, tombstone, bench)."""
    return [
        (
            m.snapshot_id,
            m.from_state,
            m.to_state,
            m.actor,
            m.generation,
            m.tombstone_watermark,
            m.benchmark_fence,
        )
        for m in moves
        if m.from_state not in (None, states.BUILDING)
    ]


def test_history_shows_approvals_activation_rollback_and_a_fence_refusal(
    workspace: Workspace,
) -> None:
    ws = workspace
    assert alias_moves(ws.cas, ws.catalog, "demo") == []  # a brand-new alias: nothing yet
    p1, p2, p3 = (_validated(ws, key) for key in ("p1", "p2", "p3"))
    publish.approve(ws, p1, by="alice")
    publish.approve(ws, p2, by="bob")
    assert publish.activate(ws, p1, actor="op-1").generation == 1
    assert publish.activate(ws, p2, actor="op-2").generation == 2
    assert publish.rollback(ws.cas, ws.catalog, p1, actor="op-3").generation == 3
    publish.approve(ws, p3, by="carol")
    assert add_tombstone(ws.catalog, "record", "essays/none", "erase") == 1
    with pytest.raises(alias_gate.AliasGateError, match="gate is at tombstone 1"):
        publish.activate(ws, p3, actor="op-4")

    moves = alias_moves(ws.cas, ws.catalog, "demo")
    A, V, AP = states.ACTIVE, states.VALIDATED, states.APPROVED
    assert _gate_rows(moves) == [
        (p1, V, AP, "alice", 0, 0, 0),
        (p2, V, AP, "bob", 0, 0, 0),
        (p1, AP, A, "op-1", 1, 0, 0),
        (p2, AP, A, "op-2", 2, 0, 0),
        (p1, A, A, "op-3", 3, 0, 0),  # the rollback: a new generation, same state
        (p3, V, AP, "carol", 3, 0, 0),
        (p3, AP, AP, "op-4", 3, 0, 0),  # refused: built at 0, the gate at tombstone 1
    ]
    assert [m.at for m in moves] == sorted(m.at for m in moves)
    assert {(m.snapshot_id, m.from_state) for m in moves} >= {(p, None) for p in (p1, p2, p3)}
    assert moves[-1].detail.startswith("activation refused: alias 'demo': gate is at tombstone 1")
    assert "rollback: alias demo generation 3" in [m.detail for m in moves]
    assert (
        alias_gate.read_alias_gate(ws.catalog, "demo").active_snapshot == p1
    )  # the refusal moved nothing
    assert alias_moves(ws.cas, ws.catalog, "other") == []
    assert count_moves(ws.catalog, "demo") == len(moves)
    assert alias_moves(ws.cas, ws.catalog, "demo", last=3) == moves[-3:]  # newest, oldest first
    assert alias_moves(ws.cas, ws.catalog, "demo", last=len(moves) + 5) == moves


def _history_table(instance: dg.DagsterInstance, alias: str) -> list[dict[str, object]]:
    """The ``alias_history.ALIAS`` table of the newest observation of the ``alias`` asset: the
    aliases' one place in the UI."""
    records = instance.fetch_observations(dg.AssetKey("alias"), limit=1).records
    table = records[0].asset_observation.metadata[f"alias_history.{alias}"]
    assert isinstance(table, dg.TableMetadataValue) and table.schema is not None
    types = {c.name: c.type for c in table.schema.columns}
    assert types["generation"] == types["tombstone_watermark"] == "int"
    return [dict(record.data) for record in table.records]


def _history_moves(instance: dg.DagsterInstance, alias: str) -> int:
    records = instance.fetch_observations(dg.AssetKey("alias"), limit=1).records
    return records[0].asset_observation.metadata[f"alias_history_moves.{alias}"].value


def test_the_ui_shows_the_history_table_also_when_activation_is_refused(
    demo_home: Path,
) -> None:
    with open_workspace() as ws:
        p1, p2 = _validated(ws, "p1"), _validated(ws, "p2")
    approve, activate = (defs.resolve_job_def(j) for j in ("approve_snapshot", "activate_snapshot"))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("snapshots", ["p1", "p2"])
        approve.execute_in_process(approval_run_config("p1", approver="alice"), instance=instance)
        run = activate.execute_in_process(activation_run_config(p1), instance=instance)
        rows = _history_table(instance, "demo")
        last = rows[-1]
        assert (last["snapshot_id"], last["to_state"], last["generation"]) == (p1, "ACTIVE", 1)
        assert last["actor"] == f"run:{run.run_id}" and last["tombstone_watermark"] == 0
        assert any(r["to_state"] == "APPROVED" and "claimed:alice" in r["actor"] for r in rows)

        approve.execute_in_process(approval_run_config("p2", approver="bob"), instance=instance)
        with open_workspace() as ws:
            add_tombstone(ws.catalog, "record", "essays/none", "erase")
        refused = activate.execute_in_process(
            activation_run_config(p2), instance=instance, raise_on_error=False
        )
        assert not refused.success
        last = _history_table(instance, "demo")[-1]
        moved = (last["snapshot_id"], last["from_state"], last["to_state"])
        assert moved == (p2, "APPROVED", "APPROVED")
        assert last["actor"] == f"run:{refused.run_id}" and last["generation"] == 1
        assert "gate is at tombstone 1" in str(last["detail"])
        with open_workspace() as ws:
            total = count_moves(ws.catalog, "demo")
        assert _history_moves(instance, "demo") == total == len(_history_table(instance, "demo"))


def test_the_ui_table_holds_only_the_newest_moves(
    workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each state move refreshes the table: it reads the newest moves only, and says how many
    there are in all."""
    ws = workspace
    p1, p2 = _validated(ws, "p1"), _validated(ws, "p2")
    publish.approve(ws, p1, by="alice")
    publish.approve(ws, p2, by="bob")
    monkeypatch.setattr(lifecycle, "UI_HISTORY_ROWS", 2)
    shown = lifecycle.alias_history_metadata(ws, "demo")
    newest = alias_moves(ws.cas, ws.catalog, "demo")[-2:]
    rows = [dict(r.data) for r in shown["alias_history"].records]
    assert [(r["snapshot_id"], r["to_state"]) for r in rows] == [
        (m.snapshot_id, m.to_state) for m in newest
    ]
    assert shown["alias_history_moves"].value == count_moves(ws.catalog, "demo") > 2
