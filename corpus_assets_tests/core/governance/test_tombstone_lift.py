"""Lifting a tombstone: later builds hold its target again, nothing built before changes, every
alias is fenced, and the log keeps both rows for auditors (on both catalogs)."""

import json
import sqlite3
from pathlib import Path

import pytest

from corpus_assets.core.governance import alias_gate, states, tombstones
from corpus_assets.core.governance.deletion_reach import revoked_targets, tombstone_hits
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.publication.publish import activate, approve, rollback
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.catalog import Catalog

RECORD = "essays/e0001"


def _candidate(ws: Workspace, key: str) -> str:
    sid = build_all(ws, key)["manifest"].digests["snapshotId"]
    report = validate_snapshot(ws, sid)
    assert report.ok, report.findings
    approve(ws, sid, by="reviewer")
    return sid


def _members(ws: Workspace, sid: str) -> set[str]:
    manifest = json.loads(ws.cas.get_bytes(states.get(ws.catalog, sid).manifest_digest))
    table = read_members(ws.cas, manifest["members"])
    return set(table.column("record_id").to_pylist())


def test_a_lift_gives_the_target_back_to_later_builds_only(workspace: Workspace) -> None:
    first = _candidate(workspace, "p1")
    activate(workspace, first, actor="test")
    revoked = tombstones.add_tombstone(workspace.catalog, "record", RECORD, "erasure request")
    excluded = _candidate(workspace, "p2")
    assert RECORD not in _members(workspace, excluded)

    lift = tombstones.lift_tombstone(workspace.catalog, revoked, "request withdrawn", actor="bob")
    assert lift > revoked
    assert alias_gate.read_alias_gate(workspace.catalog, "demo").tombstone_watermark == lift
    with pytest.raises(
        alias_gate.AliasGateError, match=f"gate is at tombstone {lift}, .* built at {revoked}"
    ):
        activate(workspace, excluded, actor="test")  # built before the lift: fenced
    assert revoked_targets(workspace.catalog, lift - 1) == {
        "record": {RECORD: f"tombstone {revoked} (record {RECORD!r})"}
    }  # what a build frozen before the lift excluded, read again
    assert revoked_targets(workspace.catalog, lift) == {}

    back = _candidate(workspace, "p3")  # validation's no-tombstone-hit rule passes with it
    activate(workspace, back, actor="test")
    assert RECORD in _members(workspace, back)
    assert RECORD not in _members(workspace, excluded)
    with pytest.raises(alias_gate.AliasGateError, match=f"the gate is at {lift}"):
        rollback(workspace.cas, workspace.catalog, first, actor="test")

    audit = tombstone_hits(workspace.cas, workspace.catalog, revoked)
    assert (audit["action"], audit["lifted_by"]) == ("add", lift)
    assert {s["snapshotId"] for s in audit["snapshots"]} == {first, back}
    shown = tombstone_hits(workspace.cas, workspace.catalog, lift)
    assert (shown["action"], shown["lifts"], shown["actor"]) == ("lift", revoked, "bob")
    assert (shown["target"], shown["reason"]) == (RECORD, "request withdrawn")


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return Catalog(f"sqlite:///{tmp_path / 'catalog.sqlite'}")


def _rows(catalog: Catalog) -> int:
    with catalog.begin() as conn:
        return len(conn.exec_driver_sql("select seq from tombstones").all())


@pytest.mark.parametrize(
    ("which", "said"),
    [
        (lambda seqs: 99, "there is no tombstone 99; nothing lifted"),
        (lambda seqs: seqs[2], "tombstone 3 is itself the lift of tombstone 1; nothing lifted"),
        (lambda seqs: seqs[0], "tombstone 1 was lifted already by 3; nothing lifted"),
    ],
    ids=["unknown", "a-lift", "lifted-twice"],
)
def test_a_lift_of_no_tombstone_in_force_is_refused_and_writes_nothing(
    catalog: Catalog, which, said: str
) -> None:
    alias_gate.read_alias_gate(
        catalog, "demo"
    )  # the alias exists before the tombstones: it is fenced
    seqs = [tombstones.add_tombstone(catalog, "record", f"r/{n}", "x") for n in range(2)]
    seqs.append(tombstones.lift_tombstone(catalog, seqs[0], "mistake"))
    with pytest.raises(alias_gate.AliasGateError) as refused:
        tombstones.lift_tombstone(catalog, which(seqs), "again")
    assert str(refused.value) == said
    assert _rows(catalog) == 3
    assert alias_gate.read_alias_gate(catalog, "demo").tombstone_watermark == 3


def test_a_target_revoked_twice_stays_revoked_until_both_are_lifted(catalog: Catalog) -> None:
    one = tombstones.add_tombstone(catalog, "group", "g/7", "legal hold")
    two = tombstones.add_tombstone(catalog, "group", "g/7", "erasure")
    lifted = tombstones.lift_tombstone(catalog, one, "hold released")
    assert [t.seq for t in tombstones.in_force(catalog, lifted)] == [two]
    assert revoked_targets(catalog, lifted) == {"group": {"g/7": "tombstone 2 (group 'g/7')"}}
    last = tombstones.lift_tombstone(catalog, two, "erasure withdrawn")
    assert tombstones.in_force(catalog, last) == []


def test_a_catalog_from_before_lifts_gains_the_columns_and_keeps_its_tombstones(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as old:  # the table as earlier versions created it
        old.execute(
            "CREATE TABLE tombstones (seq INTEGER PRIMARY KEY AUTOINCREMENT, kind VARCHAR(16) "
            "NOT NULL, record_id VARCHAR(512) NOT NULL, reason TEXT NOT NULL, at FLOAT NOT NULL)"
        )
        old.execute("INSERT INTO tombstones VALUES (1, 'record', 'r/old', 'erase', 1.0)")
    catalog = Catalog(f"sqlite:///{path}")
    assert [(t.seq, t.target) for t in tombstones.in_force(catalog, 1)] == [(1, "r/old")]
    lift = tombstones.lift_tombstone(catalog, 1, "restored")
    assert tombstones.in_force(catalog, lift) == []
    assert tombstones.entry(catalog, 1)["lifted_by"] == lift
