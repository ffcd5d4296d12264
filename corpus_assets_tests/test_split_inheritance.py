"""Issue 12, splits: a child snapshot inherits its parent's record -> split.

Real builds: a child of an active snapshot keeps every old record's split, names its parent in
the splits index (whose inputs then hold the parent's splits layer), moves nothing under pure
additions, and lists a bridge between two splits as a conflict that ``on_conflict`` resolves
visibly while validation still balances. Property tests run ``split_assign.assign`` on random
components.
"""

import json
import random
from pathlib import Path

import pytest

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.release.publish import activate, approve
from corpus_assets.core.release.validation import validate_snapshot
from corpus_assets.core.runtime.config import SplitPolicy
from corpus_assets.core.runtime.layers import LayerIndex, read_layer_index
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.training_view.split_assign import (
    BRIDGE,
    EXCLUDED,
    SPLITS,
    Member,
    assign,
    split_of,
)

DIALOGS = Path("demo-sources") / "dialogs"


# --- real builds --------------------------------------------------------------------------------


def _active_build(ws: Workspace, key: str) -> str:
    sid = build_all(ws, key)["manifest"].digests["snapshotId"]
    approve(ws, sid, by="reviewer")
    activate(ws, sid, actor="test")
    return sid


def _split_map(ws: Workspace, key: str) -> tuple[LayerIndex, dict[str, str]]:
    _ref, index = read_layer_index(ws, key, "splits")
    table = get_table(ws.cas, index.output("splits"), "splits")
    return index, dict(zip(table["record_id"].to_pylist(), table["split"].to_pylist(), strict=True))


def _splits(ws: Workspace, key: str) -> tuple[LayerIndex, dict[str, str], list, list]:
    index, split = _split_map(ws, key)
    moves = get_table(ws.cas, index.output("split_moves"), "moves").to_pylist()
    conflicts = get_table(ws.cas, index.output("split_conflicts"), "conflicts").to_pylist()
    return index, split, moves, conflicts


def _threads(home: Path) -> dict[str, list[dict]]:
    rows = [
        json.loads(x) for x in (home / DIALOGS / "dialogs-00000.jsonl").read_text().splitlines()
    ]
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(row["thread"], []).append(row)
    return out


def _add_dialogs(home: Path, rows: list[dict]) -> None:
    (home / DIALOGS / "dialogs-00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _two_threads_in_two_splits(home: Path, split: dict[str, str]) -> tuple[list, list]:
    """Two demo threads, all of whose records are members, in different splits; the first one
    is the smaller or equal side."""
    whole = [
        rows
        for rows in _threads(home).values()
        if all(f"dialogs/{r['id']}" in split for r in rows)
        and len({split[f"dialogs/{r['id']}"] for r in rows}) == 1
    ]
    for a in whole:
        for b in whole:
            if split[f"dialogs/{a[0]['id']}"] != split[f"dialogs/{b[0]['id']}"] and len(a) < len(b):
                return a, b
    raise AssertionError("the demo has no two threads of different size in different splits")


def _use_policy(home: Path, on_conflict: str) -> None:
    config = home / "corpus.yaml"
    text = config.read_text().replace(
        "test_percent: 10}", f"test_percent: 10, on_conflict: {on_conflict}}}"
    )
    assert "on_conflict" in text
    config.write_text(text)


def test_first_build_has_no_parent_and_moves_nothing(workspace: Workspace) -> None:
    build_all(workspace, "p1")
    index, split, moves, conflicts = _splits(workspace, "p1")
    assert index.outputs["parent"] is None and (moves, conflicts) == ([], [])
    assert (index.counts["moves"], index.counts["conflicts"], index.counts["excluded"]) == (0, 0, 0)
    assert sum(index.counts[s] for s in SPLITS) == index.counts["records"] == len(split)
    assert sum(index.counts[f"{s}_components"] for s in SPLITS) == index.counts["leakage_groups"]
    for name in SPLITS:  # deviation in basis points of records from the policy's percent
        share = index.counts[name] * 10000 // index.counts["records"]
        assert index.counts[f"{name}_deviation_bp"] == share - {"train": 8000}.get(name, 1000)


def test_a_child_with_pure_additions_keeps_every_split_and_moves_nothing(
    workspace: Workspace, demo_home: Path
) -> None:
    parent = _active_build(workspace, "p1")
    _, before, _, _ = _splits(workspace, "p1")
    rng = random.Random(12)
    _add_dialogs(
        demo_home,
        [
            {
                "id": f"new{n}",
                "thread": f"new-thread-{n % 4}",
                "text": f"fresh {rng.random()} " * 20,
            }
            for n in range(12)
        ],
    )
    child = build_all(workspace, "p2")["manifest"].digests["snapshotId"]
    index, after, moves, conflicts = _splits(workspace, "p2")
    assert index.outputs["parent"] == parent
    parent_ref = json.loads(workspace.cas.get_bytes(_manifest_digest(workspace, parent)))
    assert parent_ref["layers"]["splits"] in index.inputs  # the index's bytes depend on it
    manifest = json.loads(workspace.cas.get_bytes(_manifest_digest(workspace, child)))
    assert manifest["parents"] == [parent]  # the same parent as the freeze spec's
    assert {r: after[r] for r in before} == before
    assert len(after) == len(before) + 12
    assert (moves, conflicts) == ([], []) and index.counts["moves"] == 0
    assert validate_snapshot(workspace, child).ok


def _manifest_digest(ws: Workspace, sid: str) -> str:
    from corpus_assets.core.governance import states

    return states.get(ws.catalog, sid).manifest_digest


def test_a_renamed_component_keeps_its_split(workspace: Workspace, demo_home: Path) -> None:
    """A new exact copy in a new thread whose group id sorts first renames the component.

    The old code hashed the component's smallest group id, so the old thread moved to the
    split of the new name; we pick a name whose hash differs from the thread's split."""
    _active_build(workspace, "p1")
    _, before = _split_map(workspace, "p1")
    policy = workspace.config.policies.splits
    rows = next(
        rows
        for rows in _threads(demo_home).values()
        if all(f"dialogs/{r['id']}" in before for r in rows)
    )
    old = before[f"dialogs/{rows[0]['id']}"]
    name = next(f"a{n}" for n in range(100) if split_of(f"dialogs/a{n}", policy) != old)
    _add_dialogs(demo_home, [{"id": "zz-copy", "thread": name, "text": rows[0]["text"]}])
    build_all(workspace, "p2")
    _ref, dedup = read_layer_index(workspace, "p2", "dedup_clusters")
    clusters = get_table(workspace.cas, dedup.output("clusters"), "clusters").to_pylist()
    leakage = {r["record_id"]: r["leakage_id"] for r in clusters}
    assert leakage[f"dialogs/{rows[0]['id']}"] == f"dialogs/{name}"  # renamed
    index, after = _split_map(workspace, "p2")
    assert {after[f"dialogs/{r['id']}"] for r in rows} == {old}  # failed: the hashed new name's
    assert index.counts["moves"] == index.counts["conflicts"] == 0


@pytest.mark.parametrize("on_conflict", ["quarantine_new", "move_smaller"])
def test_a_bridge_between_two_splits_is_a_listed_conflict(
    demo_home: Path, catalog_url: str, monkeypatch: pytest.MonkeyPatch, on_conflict: str
) -> None:
    monkeypatch.setenv("CORPUS_CATALOG_URL", catalog_url)
    _use_policy(demo_home, on_conflict)
    with open_workspace() as ws:
        _active_build(ws, "p1")
        _, before, _, _ = _splits(ws, "p1")
        small, large = _two_threads_in_two_splits(demo_home, before)
        thread = small[0]["thread"]
        _add_dialogs(
            demo_home,
            [  # a copy of the large thread's first record, in the small thread: the bridge
                {"id": "zz-bridge", "thread": thread, "text": large[0]["text"]},
                {"id": "zz-new", "thread": thread, "text": "a new member " * 30},
            ],
        )
        child = build_all(ws, "p2")["manifest"].digests["snapshotId"]
        index, after, moves, conflicts = _splits(ws, "p2")
        report = validate_snapshot(ws, child)
    assert report.ok, report.findings
    small_split, large_split = (
        before[f"dialogs/{small[0]['id']}"],
        before[f"dialogs/{large[0]['id']}"],
    )
    assert len(conflicts) == 1 == index.counts["conflicts"]
    conflict = conflicts[0]
    assert (conflict["split_a"], conflict["split_b"]) == (large_split, small_split)
    assert conflict["resolution"] == on_conflict
    assert f"dialogs/zz-bridge->dialogs/{large[0]['id']}@1.0000" in conflict["evidence"]
    if on_conflict == "quarantine_new":
        assert {r: after[r] for r in before} == before  # old members stay put
        assert "dialogs/zz-new" not in after
        assert [(m["record_id"], m["to"], m["reason"]) for m in moves] == [
            ("dialogs/zz-new", EXCLUDED, BRIDGE)
        ]
        assert index.counts["excluded"] == report.gate.split_quarantined == 1
    else:
        moved = sorted(f"dialogs/{r['id']}" for r in small)
        assert (
            sorted(m["record_id"] for m in moves)
            == moved
            == sorted(r for r in before if before[r] != after[r])
        )
        assert {after[r] for r in moved} | {after["dialogs/zz-new"]} == {large_split}
        assert index.counts["moves"] == len(moved)
    assert report.gate.split_conflicts == 1
    assert report.gate.leakage_group_split_violations == 0 and report.gate.unexplained_rows == 0


# --- the pure function, random components ------------------------------------------------------

POLICIES = [SplitPolicy(salt="p", on_conflict=c) for c in ("quarantine_new", "move_smaller")]


def _components(rng: random.Random, n: int, prefix: str) -> list[list[Member]]:
    out = []
    for c in range(n):
        name = f"{prefix}{c:04d}"
        out.append(
            [Member(f"{name}-r{i}", name, f"{rng.random():.12f}") for i in range(rng.randint(1, 4))]
        )
    return out


def _flat(components: list[list[Member]]) -> list[Member]:
    return [m for c in components for m in c]


def _check_invariants(members: list[Member], result, parent: dict[str, str] | None = None) -> None:
    """No record in two splits; every component in one split, except one whose conflict was
    resolved by quarantine: its bridge records are excluded and its old members stay put."""
    quarantined = {c.component for c in result.conflicts if c.resolution == "quarantine_new"}
    by_component: dict[str, set[str]] = {}
    for m in members:
        if m.component in quarantined:
            assert result.split.get(m.record_id, EXCLUDED) == (parent or {}).get(
                m.record_id, EXCLUDED
            )
        elif m.record_id in result.split:
            by_component.setdefault(m.component, set()).add(result.split[m.record_id])
    assert all(len(s) == 1 for s in by_component.values())
    assert set(result.split) | set(result.excluded) == {m.record_id for m in members}
    assert not set(result.split) & set(result.excluded)


@pytest.mark.parametrize("seed", range(20))
def test_pure_additions_move_nothing_and_every_component_is_in_one_split(seed: int) -> None:
    rng = random.Random(seed)
    for policy in POLICIES:
        old = _components(rng, 60, "g")
        parent = assign(_flat(old), {}, policy)
        _check_invariants(_flat(old), parent)
        grown = [[*c, Member(f"{c[0].component}-new", c[0].component, "0")] for c in old]
        child_members = _flat(grown + _components(rng, 30, "h"))
        child = assign(child_members, parent.split, policy)
        _check_invariants(child_members, child)
        assert (child.moves, child.conflicts) == ([], [])
        assert {r: child.split[r] for r in parent.split} == parent.split


@pytest.mark.parametrize("seed", range(20))
def test_injected_bridges_are_all_conflicts_and_nothing_else_is(seed: int) -> None:
    rng = random.Random(seed)
    for policy in POLICIES:
        old = _components(rng, 80, "g")
        parent = assign(_flat(old), {}, policy).split
        side = {c[0].component: parent[c[0].record_id] for c in old}
        pairs = [(a, b) for a in old for b in old if side[a[0].component] < side[b[0].component]]
        bridged = rng.sample(pairs, 5)
        used: set[str] = set()
        merged: dict[str, str] = {}  # component -> the bridge's new name
        expected = set()
        for a, b in bridged:
            if {a[0].component, b[0].component} & used:
                continue
            used |= {a[0].component, b[0].component}
            name = f"a-{a[0].component}"  # renamed, as a new smallest group id does
            merged[a[0].component] = merged[b[0].component] = name
            expected.add(name)
        members = [
            Member(m.record_id, merged.get(m.component, m.component), m.content_key)
            for m in _flat(old)
        ]
        members += [Member(f"{n}-bridge", n, "b") for n in sorted(expected) if seed % 2]
        result = assign(members, parent, policy)
        _check_invariants(members, result, parent)
        assert {c.component for c in result.conflicts} == expected
        if policy.on_conflict == "quarantine_new" and seed % 2:
            assert sorted(result.excluded) == sorted(f"{n}-bridge" for n in expected)
            assert {r: result.split[r] for r in parent} == parent
        else:
            assert all(m.reason != BRIDGE for m in result.moves)
            assert {m.record_id for m in result.moves} == {
                r for r in parent if result.split[r] != parent[r]
            }


def test_a_renamed_component_keeps_its_split_in_the_pure_function() -> None:
    policy = POLICIES[0]
    old = [Member(f"r{i}", "g-9", f"k{i}") for i in range(3)]
    parent = assign(old, {}, policy).split
    target = parent["r0"]
    name = next(f"a{n}" for n in range(100) if split_of(f"a{n}", policy) != target)
    renamed = [Member(m.record_id, name, m.content_key) for m in old]
    child = assign([*renamed, Member("new", name, "k")], parent, policy)
    assert set(child.split.values()) == {target} and child.moves == []
