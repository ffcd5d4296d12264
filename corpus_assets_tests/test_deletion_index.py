"""The deletion index answers a tombstone exactly as scanning every snapshot's tables does."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus_assets.core.governance import deletion_index, states
from corpus_assets.core.governance.lineage import hits, scan_hits
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.storage.cas import ContentStore


def _targets(ws: Workspace, sid: str) -> list[tuple[str, str]]:
    """Some members' record, object and group, the demo's near copy, and targets in no
    snapshot."""
    manifest = json.loads(ws.cas.get_bytes(states.get(ws.catalog, sid).manifest_digest))
    members = get_table(ws.cas, manifest["members"], "members").slice(0, 40).to_pylist()
    picked = {
        (kind, row[column])
        for row in members[::7]
        for kind, column in deletion_index.COLUMN.items()
        if row[column] is not None
    }
    picked |= {("record", "essays/e0020"), ("record", "essays/e0123"), ("record", "nope")}
    picked |= {("object", "nope"), ("group", "nope")}
    return sorted(picked)


def test_hits_agree_with_the_scan_for_every_kind(demo_home: Path) -> None:
    with open_workspace() as ws:
        first = build_all(ws, "p1")["manifest"].digests["snapshotId"]
        build_all(ws, "p2")
        targets = _targets(ws, first)
        assert {kind for kind, _ in targets} == {"record", "object", "group"}
        answers = []
        for kind, target in targets:
            answers += hits(ws.cas, ws.catalog, kind, target)
            assert hits(ws.cas, ws.catalog, kind, target) == scan_hits(
                ws.cas, ws.catalog, kind, target
            ), (kind, target)
    # Not vacuous: members, removed duplicates and spans were all among the answers.
    assert all(any(a[field] for a in answers) for field in ("members", "carried_by", "spans"))


def test_a_memo_row_naming_another_snapshots_index_is_refused(demo_home: Path) -> None:
    with open_workspace() as ws:
        build_all(ws, "p1")
        build_all(ws, "p2")
        a, b = (s.manifest_digest for s in states.find(ws.catalog))
        other = deletion_index.build(ws.cas, b)
        ws.catalog.remember(deletion_index.memo_key(a), "governance.deletion_index", other, "{}")
        with pytest.raises(deletion_index.DeletionIndexError, match=f"describes manifest {b}"):
            deletion_index.for_snapshot(ws.cas, ws.catalog, a)


KEYS = st.sampled_from(["a", "b", "c", "d", "é", ""])


@settings(max_examples=30, deadline=None)
@given(
    members=st.lists(st.tuples(KEYS, KEYS, st.one_of(st.none(), KEYS)), max_size=30),
    shard_rows=st.integers(1, 5),
    probe=st.tuples(st.sampled_from(sorted(deletion_index.COLUMN)), KEYS),
)
def test_lookup_over_any_sharding_equals_a_filter(
    tmp_path_factory: pytest.TempPathFactory,
    members: list[tuple[str, str, str | None]],
    shard_rows: int,
    probe: tuple[str, str],
) -> None:
    """Keys repeated across shard boundaries and null groups: the shards a lookup reads hold
    every row a full filter finds."""
    cas = ContentStore(tmp_path_factory.mktemp("cas"))
    table = pa.table(
        {
            "record_id": [f"{r}{i}" for i, (r, _, _) in enumerate(members)],
            "object": [o for _, o, _ in members],
            "group_id": pa.array([g for _, _, g in members], pa.string()),
        }
    )
    rows = deletion_index.index_rows(table, None, None, [])
    digest = deletion_index.put_index(cas, "sha256:" + "0" * 64, rows, [], shard_rows)
    index = deletion_index.DeletionIndex(cas, json.loads(cas.get_bytes(digest)))
    kind, target = probe
    found = index.rows([deletion_index.member_key(kind, target)]).column("record_id")
    column = table.column(deletion_index.COLUMN[kind])
    assert sorted(found.to_pylist()) == sorted(
        table.filter(pc.equal(column, target)).column("record_id").to_pylist()
    )
