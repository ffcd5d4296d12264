"""The check of a child snapshot (+ new objects after its parent's) reuses what its parent's
check proved of the inputs they share - the canary replay of the unchanged first chunks, the
held-out search of the records the parent searched as they are - and still fails on a tampered
shared table, a tampered new one, or a changed rule set."""

import json
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication import ids_check, lineage_check, publish, rules
from corpus_assets.core.publication.evidence import Evidence
from corpus_assets.core.publication.heldout_check import changed_records, changed_since_parent
from corpus_assets.core.publication.rules import RuleReport, canary_chunks
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.publication.verify import Report, load_manifest, resolve
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.catalog import gate_results
from corpus_assets.core.training_view.splits import HeldoutScan, searched_records
from corpus_assets.selftest.corpus import write_zstd_jsonl
from corpus_assets_tests.cas_hashing import hashed_digests

SQLITE = pytest.mark.parametrize("catalog_url", ["sqlite"], indirect=True)
CANARY = ("canary_chunks", "canary_lines", "transform_replay_hash", "set_difference")


def _parent_and_child(ws: Workspace, demo_home: Path) -> tuple[Report, str]:
    """The parent's passing build check, and the manifest digest of a child built over it
    (active): the same sources plus an object that sorts after every first chunk, of fresh
    essays and near-duplicates (one word changed) of old ones."""
    parent = build_all(ws, "p1")["manifest"].digest
    passed = validate_snapshot(ws, parent, trust_unchanged=True)
    assert passed.ok and passed.rules_reused == [], passed.findings
    publish.approve(ws, parent, by="alice")
    publish.activate(ws, parent, actor="op")
    essays = demo_home / "demo-sources/essays"
    old = [json.loads(line) for line in (essays / "essays-00001.jsonl").read_text().splitlines()]
    rows = [{"id": f"n{n:04d}", "text": f"a new essay number {n} " * 20} for n in range(30)]
    for n, row in enumerate(old[:40]):
        words = row["text"].split()
        words[len(words) // 2] = "changed"
        rows.append({"id": f"near{n:04d}", "text": " ".join(words)})
    write_zstd_jsonl(essays / "essays-00002.jsonl.zst", rows)
    child = build_all(ws, "p2")["manifest"].digest
    assert resolve(ws.catalog, child).snapshot_id != passed.snapshot_id
    return passed, child


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(0, 0))  # the mtime is no cover: the ctime moved


def _canary_records(ws: Workspace, digest: str) -> Path:
    """The records table of the snapshot's first canary chunk."""
    manifest = load_manifest(ws.cas, resolve(ws.catalog, digest))
    canonical = CanonicalIndex.load(ws.cas, manifest.layers["canonical_records"])
    entry = next(e for e in canonical.entries if e.chunk == canary_chunks(canonical)[0])
    return ws.cas.path(canonical.descriptor(entry).parts()[0].records["digest"])


@SQLITE
def test_a_child_reuses_its_parents_canary_and_runs_the_rules_its_new_objects_touch(
    workspace: Workspace, demo_home: Path
) -> None:
    parent, child = _parent_and_child(workspace, demo_home)
    report = validate_snapshot(workspace, child, trust_unchanged=True)
    assert report.ok, report.findings
    assert report.rules_reused == ["canary_reproduces"]  # every other rule reads the new rows
    narrowed = ["record_ids_unique", "lineage_complete", "rows_explained", "heldout_near_apart"]
    assert report.rules_narrowed == narrowed
    shown, before = report.gate.serialized(), parent.gate.serialized()
    assert {k: shown[k] for k in CANARY} == {k: before[k] for k in CANARY}


@SQLITE
def test_a_child_whose_shared_canary_table_was_tampered_with_fails(
    workspace: Workspace, demo_home: Path
) -> None:
    _, child = _parent_and_child(workspace, demo_home)
    shared = _canary_records(workspace, child)  # the parent's table, named by the child too
    _flip_a_byte(shared)
    report = validate_snapshot(workspace, child, trust_unchanged=True)
    assert any(shared.name in f and "corrupt" in f for f in report.findings), report.findings
    assert report.rules_reused == []


@SQLITE
def test_a_child_whose_new_table_was_tampered_with_fails(
    workspace: Workspace, demo_home: Path
) -> None:
    _, child = _parent_and_child(workspace, demo_home)
    members = workspace.cas.path(
        load_manifest(workspace.cas, resolve(workspace.catalog, child)).members.digest
    )
    _flip_a_byte(members)
    report = validate_snapshot(workspace, child, trust_unchanged=True)
    assert any(members.name in f for f in report.findings), report.findings
    assert report.rules_reused == []


@SQLITE
def test_a_child_checked_under_another_rule_set_replays_its_canary(
    workspace: Workspace, demo_home: Path
) -> None:
    """The config the canary canonicalises with is in its key: a stricter quality policy must
    replay (and differ), not reuse the parent's pass."""
    _, child = _parent_and_child(workspace, demo_home)
    config = demo_home / "corpus.yaml"
    config.write_text(config.read_text() + "  quality: {min_chars: 200}\n")
    with open_workspace() as ws:
        report = validate_snapshot(ws, child, trust_unchanged=True)
    assert "canary_reproduces" not in report.rules_reused
    assert any(f.startswith("canary replay of") for f in report.findings), report.findings


def _changed_search(workspace: Workspace, ev: Evidence) -> tuple[HeldoutScan, str, Any]:
    """The child's held-out scan, its searched members and the records changed since its
    parent (some, not every member)."""
    scan = HeldoutScan.open(workspace, ev.canonical.chunks(), ev.dedup)
    assert scan is not None
    parted = PartedTable.read(workspace.cas, ev.dedup.output("clusters"), "clusters")
    records = searched_records(parted.relation(ev.files, "clusters"), "members")
    changed = changed_since_parent(workspace, ev, records)
    assert changed is not None and 0 < len(changed) < ev.member_count
    return scan, records, changed


@SQLITE
def test_the_narrowed_heldout_search_finds_every_pair_touching_a_changed_record(
    workspace: Workspace, demo_home: Path
) -> None:
    """Against the full search of the child: exactly the pairs with a new or changed record,
    and there are pairs without one (the parent's, not searched again)."""
    _, child = _parent_and_child(workspace, demo_home)
    manifest = load_manifest(workspace.cas, resolve(workspace.catalog, child))
    with Evidence.load(workspace.cas, workspace.catalog, manifest) as ev:
        scan, records, changed = _changed_search(workspace, ev)
        full = scan.pairs(ev.con, records, keep=False)[0].to_pylist()
        part = scan.pairs(ev.con, records, keep=False, changed=changed)[0].to_pylist()
        ids = set(changed.to_pylist())
        touching = [p for p in full if p["record_a"] in ids or p["record_b"] in ids]
        assert part == touching and part and len(full) > len(part), (len(full), len(part))
        # a changed record put in train beside its unchanged held-out near twin: a leak the
        # narrowed search must find from the held-out side
        pair = next(p for p in part if (p["record_a"] in ids) != (p["record_b"] in ids))
        moved = pair["record_a"] if pair["record_a"] in ids else pair["record_b"]
        tampered = (
            "SELECT record_id, object, line, leakage_id, CASE WHEN record_id = "
            f"'{moved}' THEN 'train' ELSE split END AS split FROM ({records})"
        )
        leaks = scan.pairs(ev.con, tampered, keep=False, changed=changed)[0].to_pylist()
    assert any(
        p["split_a"] != p["split_b"] and moved in (p["record_a"], p["record_b"]) for p in leaks
    )


@SQLITE
def test_the_changed_records_from_the_unshared_parts_are_the_whole_tables_difference(
    workspace: Workspace, demo_home: Path
) -> None:
    """The child's check reads only the parts it does not share with its parent: the same
    record ids as the difference over every row of both snapshots (``changed_records``)."""
    parent, child = _parent_and_child(workspace, demo_home)
    theirs = load_manifest(workspace.cas, resolve(workspace.catalog, parent.snapshot_id))
    dedup = load_index(workspace.cas, theirs.layers["dedup_clusters"], "dedup_clusters")
    manifest = load_manifest(workspace.cas, resolve(workspace.catalog, child))
    with Evidence.load(workspace.cas, workspace.catalog, manifest) as ev:
        _, records, changed = _changed_search(workspace, ev)  # creates the view ho_parent
        table = PartedTable.read(workspace.cas, dedup.output("clusters"), "parent clusters")
        relation = table.relation(ev.files, "parent clusters")
        whole = changed_records(
            ev.con,
            records,
            searched_records(relation, "ho_parent"),
            f"SELECT object FROM {relation}",
        )
    assert sorted(changed.to_pylist()) == sorted(whole.to_pylist())


@SQLITE
def test_a_parent_whose_table_was_tampered_with_is_not_trusted_for_the_held_out_search(
    workspace: Workspace, demo_home: Path
) -> None:
    """The parent's members table (which the child does not name) corrupt: the child's check
    searches every pair and still passes on its own tables."""
    parent, child = _parent_and_child(workspace, demo_home)
    manifest = load_manifest(workspace.cas, resolve(workspace.catalog, parent.snapshot_id))
    _flip_a_byte(workspace.cas.path(manifest.members.digest))
    report = validate_snapshot(workspace, child, trust_unchanged=True)
    assert report.ok, report.findings
    assert "heldout_near_apart" not in report.rules_narrowed


@SQLITE
def test_the_child_check_does_not_hash_again_what_it_or_its_parents_check_hashed(
    workspace: Workspace, demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build's check of a child reads its parent's members and clusters tables (for the
    records changed since the parent's search) trusting them while their files are unchanged
    since they last hashed right, as it trusts its own: it hashes none of them again, nor the
    signatures its own verify hashed."""
    parent, child = _parent_and_child(workspace, demo_home)
    manifest = load_manifest(workspace.cas, resolve(workspace.catalog, parent.snapshot_id))
    dedup = load_index(workspace.cas, manifest.layers["dedup_clusters"], "dedup_clusters")
    theirs = {manifest.members.digest, dedup.output("clusters")["digest"]}
    hashed = hashed_digests(monkeypatch)
    report = validate_snapshot(workspace, child, trust_unchanged=True)
    assert report.ok and "heldout_near_apart" in report.rules_narrowed, report.findings
    assert theirs.isdisjoint(hashed), theirs & set(hashed)
    # the signatures it shares with its parent: trusted by verify, not hashed by the search
    ours = load_manifest(workspace.cas, resolve(workspace.catalog, child))
    mine = load_index(workspace.cas, ours.layers["dedup_clusters"], "dedup_clusters")
    shared = {s["signatures"]["digest"] for s in mine.outputs["signatures"]} & {
        s["signatures"]["digest"] for s in dedup.outputs["signatures"]
    }
    assert shared and shared.isdisjoint(hashed), shared & set(hashed)


@SQLITE
def test_a_child_counts_the_distinct_ids_of_its_added_chunks_over_its_parents_count(
    workspace: Workspace, demo_home: Path
) -> None:
    """The parent's check recorded how many distinct ids its canonical rows hold: the child's
    count is that plus the ids of its added chunks no kept chunk holds, the count over every
    row; a parent whose count was not recorded: every row is counted."""
    _, child = _parent_and_child(workspace, demo_home)
    manifest = load_manifest(workspace.cas, resolve(workspace.catalog, child))
    with Evidence.load(workspace.cas, workspace.catalog, manifest) as ev:
        whole = ev.scalar(f"SELECT count(DISTINCT record_id) FROM {ev.canonical_view}")
        assert ids_check.distinct_records(ev) == whole and ev.narrowed == ["rows_explained"]
    with workspace.catalog.begin() as conn:  # as if the parent's check had not counted
        conn.execute(delete(gate_results).where(gate_results.c.metrics.like('{"records":%')))
    with Evidence.load(workspace.cas, workspace.catalog, manifest) as ev:
        assert ids_check.distinct_records(ev) == whole and ev.narrowed == []


def _nonempty_parts(ws: Workspace, digest: str) -> list[str]:
    members = load_manifest(ws.cas, resolve(ws.catalog, digest)).members
    return [part.digest for part in members.parts(ws.cas).parts if part.count]


@SQLITE
def test_a_child_checks_the_lineage_of_the_members_parts_it_does_not_share_only(
    workspace: Workspace, demo_home: Path
) -> None:
    """The parent's check read every part; the child's reads only its parts the parent does
    not name (the others' pass is the rule's own, recorded under their digests)."""
    parent, child = _parent_and_child(workspace, demo_home)
    theirs = _nonempty_parts(workspace, parent.snapshot_id)
    mine = _nonempty_parts(workspace, child)
    new = [digest for digest in mine if digest not in theirs]
    assert 0 < len(new) < len(mine)
    assert parent.parts_checked == {"lineage_complete": len(theirs)}
    report = validate_snapshot(workspace, child, trust_unchanged=True)
    assert report.ok, report.findings
    # the held-out rule joins the new chunk's clusters part and its members part
    assert report.parts_checked == {
        "record_ids_unique": len(new),
        "lineage_complete": len(new),
        "heldout_near_apart": 2 * len(new),
    }


@SQLITE
def test_a_child_groups_only_the_ids_of_its_added_parts_over_its_parents_unique_ones(
    workspace: Workspace, demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's check recorded its members' ids unique: the child's looks only at the
    ids of the parts it adds (no grouping of every member's id); when those are found again,
    the whole query decides, as it always did."""
    _, child = _parent_and_child(workspace, demo_home)
    manifest = load_manifest(workspace.cas, resolve(workspace.catalog, child))
    monkeypatch.setattr(rules, "REPEATED_IDS", "SELECT error('every id grouped')")
    with Evidence.load(workspace.cas, workspace.catalog, manifest) as ev:
        report = RuleReport()
        assert rules.record_ids_unique(ev, report) == [] and report.duplicate_ids == 0
        assert ev.narrowed == ["record_ids_unique"] and ev.proven  # the child's held too
    monkeypatch.undo()
    monkeypatch.setattr(ids_check, "REPEATED_OVER", "SELECT 1")  # an id found again
    with Evidence.load(workspace.cas, workspace.catalog, manifest) as ev:
        report = RuleReport()
        assert rules.record_ids_unique(ev, report) == [] and report.duplicate_ids == 0
        assert ev.narrowed == []


@SQLITE
def test_a_recorded_part_naming_an_object_the_snapshot_does_not_pin_is_read_again(
    workspace: Workspace, demo_home: Path
) -> None:
    """A part's recorded pass assumed its objects pinned: in a snapshot that does not pin one
    of them, its rows are orphans again, exactly as the whole check over every row finds."""
    _, child = _parent_and_child(workspace, demo_home)
    assert validate_snapshot(workspace, child, trust_unchanged=True).ok
    manifest = load_manifest(workspace.cas, resolve(workspace.catalog, child))
    with Evidence.load(workspace.cas, workspace.catalog, manifest) as ev:
        first = ev.rows("SELECT object FROM members ORDER BY file_row_number LIMIT 1")[0][0]
        ev.__dict__["pinned"] = {d: s for d, s in ev.pinned.items() if d != first}
        shown, count = lineage_check.orphans(ev)
        whole = ev.rows(lineage_check.ORPHANS_OF.format(members="members", canonical="canonical"))
    assert count > 0 and ev.parts_checked["lineage_complete"] == 1
    assert (shown, count) == ([rid for rid, _ in whole], whole[0][1])
