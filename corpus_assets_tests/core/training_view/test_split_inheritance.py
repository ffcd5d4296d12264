"""A child snapshot inherits its parent's record -> split.

Real builds: a child of an active snapshot keeps every old record's split, names its parent in
the splits index (whose inputs then hold the parent's splits layer), moves nothing under pure
additions, and lists a bridge between two splits as a conflict that ``on_conflict`` resolves
visibly while validation still balances. Property tests run ``splits.assign.assign`` on random
components.
"""

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.publish import activate, approve
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.config import SplitPolicy
from corpus_assets.core.runtime.layer_index import LayerIndex, read_layer_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.tokens.chat_template import DEFAULT_CHAT_TEMPLATE
from corpus_assets.core.training_view.splits import assign as split_assign
from corpus_assets.core.training_view.splits import split_of
from corpus_assets.core.training_view.splits.bridges import LeakageGraph
from corpus_assets.core.training_view.splits.by_time import EventTimeError
from corpus_assets.core.training_view.splits.residual import resolve_residual
from corpus_assets.core.training_view.splits.schema import (
    BRIDGE,
    BRIDGE_COPY,
    EXCLUDED,
    SPLIT_TABLE,
    SPLITS,
    UNLINKED,
    Move,
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


def _rendered(row: dict) -> str:
    """The text utf8-bytes-v1 tokenises: a document's text, a chat's default-template render."""
    if row["kind"] == "messages":
        return DEFAULT_CHAT_TEMPLATE.render(json.loads(row["payload"])["messages"])
    return row["text"]


def test_first_build_has_no_parent_and_moves_nothing(built_workspace: Workspace) -> None:
    index, split, moves, conflicts = _splits(built_workspace, "p1")
    assert index.outputs["parent"] is None and (moves, conflicts) == ([], [])
    assert (index.counts["moves"], index.counts["conflicts"], index.counts["excluded"]) == (0, 0, 0)
    assert sum(index.counts[s] for s in SPLITS) == index.counts["records"] == len(split)
    table = get_table(built_workspace.cas, index.output("splits"), "splits")
    components = len(set(table["leakage_id"].to_pylist()))
    assert sum(index.counts[f"{s}_components"] for s in SPLITS) == components
    rows = CanonicalIndex.read(built_workspace, "p1")[1].table(
        ["record_id", "kind", "payload", "text"]
    )
    size = {r["record_id"]: len(_rendered(r).encode()) + 1 for r in rows.to_pylist()}  # + EOS
    for name in SPLITS:  # the configured tokenizer's tokens per split
        ids = [r for r, s in split.items() if s == name]
        assert index.counts[f"{name}_tokens"] == sum(size[r] for r in ids) > 0
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
    assert parent_ref["layers"]["splits"] in index.parents  # the index's bytes depend on it
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
    parted = PartedTable.read(workspace.cas, dedup.output("clusters"), "clusters")
    clusters = parted.table(VerifiedFiles(workspace.cas), "clusters").to_pylist()
    leakage = {r["record_id"]: r["leakage_id"] for r in clusters}
    assert leakage[f"dialogs/{rows[0]['id']}"] == f"dialogs/{name}"  # renamed
    index, after = _split_map(workspace, "p2")
    assert {after[f"dialogs/{r['id']}"] for r in rows} == {old}  # failed: the hashed new name's
    assert index.counts["moves"] == index.counts["conflicts"] == 0


@pytest.mark.parametrize("on_conflict", ["quarantine_new", "move_smaller", "new_eval_version"])
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
        # The bridge is the removed copy (its thread joins the large thread's text): it is
        # unlinked; the other newcomer only touches its own thread and joins its split.
        assert after["dialogs/zz-new"] == small_split
        assert [(m["record_id"], m["to"], m["reason"]) for m in moves] == [
            ("dialogs/zz-bridge", UNLINKED, BRIDGE_COPY)
        ]
        assert (index.counts["excluded"], index.counts["unlinked"]) == (0, 1)
    elif on_conflict == "new_eval_version":
        assert index.outputs["eval_version"] == index.counts["eval_version"] == 1
        changed = sorted(r for r in before if before[r] != after[r])
        assert changed and sorted(m["record_id"] for m in moves) == changed
        assert {m["reason"] for m in moves} == {"split.new_eval_version"}
        assert len({after[f"dialogs/{r['id']}"] for r in small + large}) == 1
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


@dataclass(frozen=True)
class Member:
    record_id: str
    component: str  # its group id too: a synthetic component is one group
    content_key: str


@dataclass
class Result:
    split: dict[str, str]
    moves: list[Move]
    conflicts: list
    excluded: list[str]
    rows: int = 0  # rows of the assignment's table (a member placed twice counts twice)


def _graph(members: list[Member], edges: list[tuple[str, str]], leakage: dict[str, str]):
    n = len(members)
    clusters = pa.table(
        {
            "record_id": [m.record_id for m in members],
            "group_id": [m.component for m in members],
            "leakage_id": [leakage.get(m.component, m.component) for m in members],
            "verdict": ["keep"] * n,
            "representative_id": [m.record_id for m in members],
            "is_representative": [True] * n,
        }
    )
    table = pa.table(
        {"record_a": [a for a, _ in edges], "record_b": [b for _, b in edges]},
        schema=pa.schema([("record_a", pa.string()), ("record_b", pa.string())]),
    )
    return LeakageGraph(clusters, table)


def assign(
    members: list[Member],
    parent: dict[str, str],
    policy: SplitPolicy,
    edges: list[tuple[str, str]] = (),
    leakage: dict[str, str] | None = None,
) -> Result:
    """The splits layer's assignment (assign, then the residual rule) on plain lists."""
    graph = _graph(members, list(edges), leakage or {})
    table = pa.table(
        {
            "record_id": [m.record_id for m in members],
            "component": graph.clusters["leakage_id"],
            "content_key": [m.content_key for m in members],
            "event_time": pa.nulls(len(members), pa.string()),
        }
    )
    old = pa.table({"record_id": list(parent), "split": list(parent.values())}, schema=SPLIT_TABLE)
    out = resolve_residual(split_assign.assign(table, old, policy, graph=graph), graph)
    moves = [Move(*row.values()) for row in out.moves.to_pylist()]
    return Result(out.as_dict(), moves, out.conflicts, out.excluded, out.table.num_rows)


def _oracle_components(members: list[Member], edges, dropped: set[str]) -> list[set[str]]:
    """Plain union-find over groups and edges without ``dropped``: the test's own oracle."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for m in members:
        if m.record_id not in dropped:
            parent[find(m.record_id)] = find("group:" + m.component)
    for a, b in edges:
        if a not in dropped and b not in dropped:
            parent[find(a)] = find(b)
    out: dict[str, set[str]] = {}
    for m in members:
        if m.record_id not in dropped:
            out.setdefault(find(m.record_id), set()).add(m.record_id)
    return list(out.values())


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


def _check_invariants(members: list[Member], result: Result, edges=()) -> None:
    """No record in two splits or both placed and excluded; on the graph without the excluded
    records, every component's members sit in one split (the oracle's union-find)."""
    excluded = set(result.excluded)
    for component in _oracle_components(members, edges, excluded):
        assert len({result.split[r] for r in component}) == 1, component
    assert set(result.split) | excluded == {m.record_id for m in members}
    assert not set(result.split) & excluded


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
    """Odd seeds bridge two old components through a new record (quarantine_new excludes
    exactly it), even seeds by a new edge between two old records (the smaller side moves)."""
    rng = random.Random(seed)
    for policy in POLICIES:
        old = _components(rng, 80, "g")
        parent = assign(_flat(old), {}, policy).split
        side = {c[0].component: parent[c[0].record_id] for c in old}
        pairs = [(a, b) for a in old for b in old if side[a[0].component] < side[b[0].component]]
        used: set[str] = set()
        merged: dict[str, str] = {}  # component -> the bridge's new name
        members, edges = _flat(old), []
        for a, b in rng.sample(pairs, 5):
            if {a[0].component, b[0].component} & used:
                continue
            used |= {a[0].component, b[0].component}
            name = f"a-{a[0].component}"  # renamed, as a new smallest group id does
            merged[a[0].component] = merged[b[0].component] = merged[name] = name
            if seed % 2:
                members.append(Member(f"{name}-bridge", name, "b"))
                edges += [(f"{name}-bridge", a[0].record_id), (f"{name}-bridge", b[0].record_id)]
            else:
                edges.append((a[0].record_id, b[0].record_id))
        expected = set(merged.values())
        result = assign(members, parent, policy, edges, merged)
        _check_invariants(members, result, edges)
        assert {c.component for c in result.conflicts} == expected
        if policy.on_conflict == "quarantine_new" and seed % 2:
            assert sorted(result.excluded) == sorted(f"{n}-bridge" for n in expected)
            assert {r: result.split[r] for r in parent} == parent and result.moves == [
                m for m in result.moves if m.reason == BRIDGE
            ]
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


def test_a_bridge_beside_a_direct_old_edge_is_quarantined_and_the_old_edge_moves() -> None:
    """Quarantining the bridging newcomer is not enough when two old records are also joined
    directly: the residual rule moves the smaller side, and both conflicts are listed."""
    policy = POLICIES[0]
    old = [Member("a1", "ga", "k1"), Member("a2", "ga", "k2"), Member("b1", "gb", "k3")]
    parent = {"a1": "train", "a2": "train", "b1": "test"}
    members = [*old, Member("n", "gn", "k4")]
    edges = [("n", "a1"), ("n", "b1"), ("a2", "b1")]
    leakage = {"ga": "ga", "gb": "ga", "gn": "ga"}
    result = assign(members, parent, policy, edges, leakage)
    _check_invariants(members, result, edges)
    assert result.excluded == ["n"]
    assert result.split == {"a1": "train", "a2": "train", "b1": "train"}
    assert [(m.record_id, m.from_split, m.to_split) for m in result.moves] == [
        ("b1", "test", "train"),
        ("n", "", EXCLUDED),
    ]
    assert [c.resolution for c in result.conflicts] == ["quarantine_new", "move_smaller"]


def test_new_eval_version_rehashes_everything_and_lists_every_change() -> None:
    policy = SplitPolicy(salt="p", on_conflict="new_eval_version")
    rng = random.Random(5)
    old = _components(rng, 60, "g")
    parent = assign(_flat(old), {}, policy).split
    a = next(c for c in old if parent[c[0].record_id] == "train")
    b = next(c for c in old if parent[c[0].record_id] != "train")
    edges = [(a[0].record_id, b[0].record_id)]
    leakage = {a[0].component: "a-bridge", b[0].component: "a-bridge"}
    members = _flat(old)
    graph = _graph(members, edges, leakage)
    table = pa.table(
        {
            "record_id": [m.record_id for m in members],
            "component": graph.clusters["leakage_id"],
            "content_key": [m.content_key for m in members],
            "event_time": pa.nulls(len(members), pa.string()),
        }
    )
    old_table = pa.table(
        {"record_id": list(parent), "split": list(parent.values())}, schema=SPLIT_TABLE
    )
    out = split_assign.assign(table, old_table, policy, graph=graph, parent_version=3)
    assert out.eval_version == 4
    assert [c.resolution for c in out.conflicts] == ["new_eval_version"]
    after = out.as_dict()
    changed = {r for r in parent if after[r] != parent[r]}
    assert changed and {m["record_id"] for m in out.moves.to_pylist()} == changed
    assert {m["reason"] for m in out.moves.to_pylist()} == {"split.new_eval_version"}
    assert len({after[m.record_id] for m in a + b}) == 1  # the bridged component is whole
    for m in members:  # hashed under the version-4 salt, by the component's smallest key
        if m.component not in (a[0].component, b[0].component):
            component = [x for x in members if x.component == m.component]
            key = min(x.content_key for x in component)
            assert after[m.record_id] == split_of(key, policy, version=4)


# --- the time boundary --------------------------------------------------------------------------

TIMED = SplitPolicy(
    salt="p",
    train_percent=90,
    validation_percent=10,
    test_percent=0,
    time_cutoff="2024-06-01T00:00:00Z",
    gap="P7D",
)


def _timed(rows: list[tuple[str, str, str | None]], parent: dict[str, str] | None = None):
    """rows: (record id, component, event time)."""
    table = pa.table(
        {
            "record_id": [r for r, _, _ in rows],
            "component": [c for _, c, _ in rows],
            "content_key": [f"k-{r}" for r, _, _ in rows],
            "event_time": pa.array([t for _, _, t in rows], pa.string()),
        }
    )
    parent = parent or {}
    old = pa.table({"record_id": list(parent), "split": list(parent.values())}, schema=SPLIT_TABLE)
    return split_assign.assign(table, old, TIMED)


def test_the_time_cutoff_holds_out_the_future_and_excludes_the_gap() -> None:
    out = _timed(
        [
            ("early", "c1", "2024-01-01"),
            ("late", "c2", "2024-06-01T00:00:00Z"),  # at the cutoff: held out
            ("late-zone", "c3", "2024-06-01T01:00:00+02:00"),  # 23:00 UTC the day before: gap
            ("in-gap", "c4", "2024-05-28 12:00:00"),
            ("untimed", "c5", None),
            ("s-early", "c6", "2023-01-01"),  # c6 straddles: all of it is held out
            ("s-late", "c6", "2025-01-01"),
        ],
        parent={"s-early": "train"},
    )
    split = out.as_dict()
    assert split["late"] == split["s-early"] == split["s-late"] == "test"
    assert split["early"] in ("train", "validation") and split["untimed"] != "test"
    assert "in-gap" not in split and "late-zone" not in split
    moves = {(m["record_id"], m["to"], m["reason"]) for m in out.moves.to_pylist()}
    assert moves == {
        ("in-gap", EXCLUDED, "split.time_gap"),
        ("late-zone", EXCLUDED, "split.time_gap"),
        ("s-early", "test", "split.time_cutoff"),
    }
    [conflict] = out.conflicts
    assert (conflict.component, conflict.record_a, conflict.record_b) == ("c6", "s-late", "s-early")
    assert conflict.resolution == "time_held_out"


def test_a_bad_event_time_names_the_record() -> None:
    with pytest.raises(EventTimeError, match=r"record 'r2': event_time 'yesterday'"):
        _timed([("r1", "c1", "2024-01-01"), ("r2", "c2", "yesterday")])


def test_time_cutoff_needs_test_percent_zero() -> None:
    with pytest.raises(ValueError, match="set test_percent: 0"):
        SplitPolicy(time_cutoff="2024-06-01")
    with pytest.raises(ValueError, match="gap needs time_cutoff"):
        SplitPolicy(gap="P1D")


def test_a_real_build_holds_out_records_at_or_after_the_cutoff(demo_home: Path) -> None:
    """event_time flows from the source's time_field through canonical records to splits;
    validation holds with the boundary's exclusions explained."""
    rows = [
        {"id": "t-old", "text": "an essay from long before " * 8, "ts": "2023-01-01T00:00:00Z"},
        {"id": "t-gap", "text": "an essay from just before " * 8, "ts": "2024-05-30"},
        {"id": "t-new", "text": "an essay from the future " * 8, "ts": "2024-07-01T09:30:00"},
    ]
    essays = demo_home / "demo-sources" / "essays" / "essays-00002.jsonl"
    essays.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = demo_home / "corpus.yaml"
    text = config.read_text()
    text = text.replace(
        "path: demo-sources/essays\n", "path: demo-sources/essays\n    time_field: ts\n"
    )
    text = text.replace(
        "train_percent: 80, validation_percent: 10, test_percent: 10}",
        "train_percent: 90, validation_percent: 10, test_percent: 0, "
        "time_cutoff: '2024-06-01T00:00:00Z', gap: P7D}",
    )
    assert "time_field: ts" in text and "time_cutoff" in text
    config.write_text(text)
    with open_workspace() as ws:
        sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
        index, split, moves, conflicts = _splits(ws, "p1")
        report = validate_snapshot(ws, sid)
    assert report.ok, report.findings
    assert split["essays/t-new"] == "test" and split["essays/t-old"] != "test"
    assert {s for r, s in split.items() if r != "essays/t-new"} <= {"train", "validation"}
    assert "essays/t-gap" not in split
    assert [(m["record_id"], m["to"], m["reason"]) for m in moves] == [
        ("essays/t-gap", EXCLUDED, "split.time_gap")
    ]
    assert index.counts["test"] == 1 and index.counts["excluded"] == 1 and conflicts == []


@pytest.mark.parametrize("seed", range(6))
def test_calm_components_inherit_or_hash_beside_a_conflict(seed: int) -> None:
    """Beside a bridged pair of old components, every other member is placed once: a parent
    member where it was, a newcomer with its component's parent split, a new component by the
    hash of its smallest key (the inheritance without a join on the component, the keys read
    for newcomers only)."""
    rng = random.Random(seed)
    policy = SplitPolicy(on_conflict="move_smaller")
    old = _components(rng, 40, "g")
    parent = assign(_flat(old), {}, policy).split
    side = {c[0].component: parent[c[0].record_id] for c in old}
    a, b = next((x, y) for x in old for y in old if side[x[0].component] < side[y[0].component])
    grown = [[*c, Member(f"{c[0].component}-n", c[0].component, f"{rng.random()}")] for c in old]
    fresh = _components(rng, 20, "h")
    members = _flat(grown + fresh)
    bridged = {a[0].component, b[0].component}
    leakage = {name: "a-bridged" for name in bridged}
    result = assign(members, parent, policy, [(a[0].record_id, b[0].record_id)], leakage)
    expected = {m.record_id: parent.get(m.record_id, side.get(m.component)) for m in members}
    for c in fresh:
        expected |= {m.record_id: split_of(min(x.content_key for x in c), policy) for m in c}
    calm = {m.record_id for m in members if m.component not in bridged}
    assert {r: result.split[r] for r in calm} == {r: expected[r] for r in calm}
    assert [c.component for c in result.conflicts] == ["a-bridged"]
    assert result.rows == len(members)  # none placed twice
