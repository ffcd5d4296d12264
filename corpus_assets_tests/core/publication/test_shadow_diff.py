"""The shadow diff a manifest records (candidate vs its alias's active snapshot): a re-build of
the same sources names the same members table, so nothing is joined to find no change."""

from pathlib import Path

import pytest

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication import publish, shadow
from corpus_assets.core.runtime.workspace import open_workspace


def test_a_rebuild_of_the_active_members_is_diffed_without_a_join(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_workspace() as ws:
        first = build_all(ws, "p1")["manifest"].digests["snapshotId"]
        publish.approve(ws, first, by="alice")
        publish.activate(ws, first, actor="op")
        joined: list[str] = []
        real = shadow.member_changes
        monkeypatch.setattr(shadow, "member_changes", lambda *a: joined.append("join") or real(*a))
        again = build_all(ws, "p2")["manifest"].digests["snapshotId"]
        assert again != first  # another partition: another snapshot, the same members
        diff = shadow.shadow_diff(ws.cas, ws.catalog, again)
    assert joined == []
    assert (diff["added"], diff["removed"], diff["split_migrations"]) == (0, 0, 0)
    assert diff["active"] == first and diff["active_profile"] == diff["candidate_profile"]
    assert diff["examples"] == {"added": [], "removed": [], "migrated": []}


def test_a_builds_member_changes_are_joined_once_and_remembered(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest and the candidate's review observation (``remembered``) join the two
    members tables once between them; ``corpus-assets diff`` and approval join afresh."""
    with open_workspace() as ws:
        first = build_all(ws, "p1")["manifest"].digests["snapshotId"]
        publish.approve(ws, first, by="alice")
        publish.activate(ws, first, actor="op")
        late = demo_home / "demo-sources" / "essays" / "essays-00002.jsonl"
        late.write_text('{"id": "late", "text": "A late essay arrives, and it is new."}\n')
        joined: list[str] = []
        real = shadow.member_changes
        monkeypatch.setattr(shadow, "member_changes", lambda *a: joined.append("join") or real(*a))
        built = build_all(ws, "p2")["manifest"]
        assert joined == ["join"]  # the manifest's diff
        candidate = built.digests["snapshotId"]
        again = shadow.shadow_diff(ws.cas, ws.catalog, candidate, remembered=True)
        assert joined == ["join"]  # the review observation's: remembered
        fresh = shadow.shadow_diff(ws.cas, ws.catalog, candidate)
        assert joined == ["join", "join"]
    assert again == fresh == built.details["shadow_diff"]
    assert fresh["added"] == 1 and fresh["removed"] == 0


def test_a_members_tables_profile_is_read_once_then_remembered(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build profiles its candidate's members; as the active snapshot of the next build
    that table is not read again, and an unchanged re-build reads no members table at all.
    The remembered diff is the one read afresh."""
    read: list[str] = []
    real = shadow._members
    monkeypatch.setattr(
        shadow, "_members", lambda files, m: read.append(m.members.digest) or real(files, m)
    )
    with open_workspace() as ws:
        first = build_all(ws, "p1")["manifest"]
        assert read == [first.digests["members"]]
        publish.approve(ws, first.digests["snapshotId"], by="alice")
        publish.activate(ws, first.digests["snapshotId"], actor="op")
        late = demo_home / "demo-sources" / "essays" / "essays-00002.jsonl"
        late.write_text('{"id": "late", "text": "A late essay arrives, and it is new."}\n')
        child = build_all(ws, "p2")["manifest"]
        assert read == [first.digests["members"], child.digests["members"]]
        again = build_all(ws, "p3")["manifest"]  # unchanged: the child's members again
        assert len(read) == 2
        fresh = shadow.shadow_diff(ws.cas, ws.catalog, again.digests["snapshotId"])
    assert again.details["shadow_diff"] == fresh
    assert fresh["candidate_profile"]["members"] == fresh["active_profile"]["members"] + 1
