"""The deletion index answers a tombstone exactly as scanning every snapshot's tables does."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import update

from corpus_assets.core.governance import deletion_build, deletion_index, states
from corpus_assets.core.governance.deletion_reach import hits, scan_hits
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import layer_memo


def _targets(ws: Workspace, sid: str) -> list[tuple[str, str]]:
    """Some members' record, object and group, the demo's near copy, and targets in no
    snapshot."""
    manifest = json.loads(ws.cas.get_bytes(states.get(ws.catalog, sid).manifest_digest))
    members = read_members(ws.cas, manifest["members"]).slice(0, 40).to_pylist()
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


def test_the_build_remembers_each_index_and_a_memo_row_naming_another_is_refused(
    demo_home: Path,
) -> None:
    with open_workspace() as ws:
        build_all(ws, "p1")
        build_all(ws, "p2")
        a, b = (s.manifest_digest for s in states.find(ws.catalog))
        # Built with the manifest: no lookup has happened, yet both indexes are remembered.
        remembered = [ws.catalog.memo(deletion_index.memo_key(d)) for d in (a, b)]
        assert all(hit is not None and ws.cas.contains(hit[0]) for hit in remembered)
        base = deletion_index.parent_index(ws.cas, ws.catalog, b)
        other = deletion_index.build(ws.cas, b, base=base)
        assert other == remembered[1][0]  # rebuilt from the same snapshot: the same bytes
        with ws.catalog.begin() as conn:
            conn.execute(
                update(layer_memo)
                .where(layer_memo.c.memo_key == deletion_index.memo_key(a))
                .values(index_digest=other)
            )
        with pytest.raises(deletion_index.DeletionIndexError, match=f"describes manifest {b}"):
            deletion_index.for_snapshot(ws.cas, ws.catalog, a)


KEYS = st.sampled_from(["a", "b", "é", "", "a\x00", "a\x00b"])  # SEP inside a target too
SHARDS = ["sha256:" + "a" * 64, "sha256:" + "b" * 64]
MEMBER = st.tuples(
    KEYS,  # record id prefix
    KEYS,  # object
    st.one_of(st.none(), KEYS),  # group
    st.integers(0, 2),  # packed spans
    st.one_of(st.none(), st.tuples(KEYS, KEYS)),  # a removed duplicate's (object, group)
)
CLUSTERS = pa.schema(
    [(c, pa.string()) for c in ("record_id", "object", "group_id", "verdict")]
    + [("representative_id", pa.string()), ("match_id", pa.string())]
    + [("match_jaccard", pa.float64())]
)
Member = tuple[str, str, str | None, int, tuple[str, str] | None]


def _inputs(members: list[Member]) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Members, dedup clusters (each member kept, some with a removed near copy) and spans."""
    ids = [f"{r}{i % 3}" for i, (r, *_) in enumerate(members)]  # a repeated id too
    table = pa.table(
        {
            "record_id": pa.array(ids, pa.string()),
            "object": pa.array([m[1] for m in members], pa.string()),
            "group_id": pa.array([m[2] for m in members], pa.string()),
        }
    )
    copies = [(f"x{i % 2}", *m[4], ids[i]) for i, m in enumerate(members) if m[4] is not None]
    clusters = pa.concat_tables(
        [
            table.append_column("verdict", pa.array(["keep"] * len(ids), pa.string()))
            .append_column("representative_id", pa.nulls(len(ids), pa.string()))
            .append_column("match_id", pa.nulls(len(ids), pa.string()))
            .append_column("match_jaccard", pa.nulls(len(ids), pa.float64())),
            pa.table(
                {
                    "record_id": [c[0] for c in copies],
                    "object": [c[1] for c in copies],
                    "group_id": [c[2] for c in copies],
                    "verdict": ["near_duplicate"] * len(copies),
                    "representative_id": [c[3] for c in copies],
                    "match_id": [c[3] for c in copies],
                    "match_jaccard": [0.75] * len(copies),
                },
                schema=CLUSTERS,
            ),
        ]
    )
    placed = [(i, k) for i, m in enumerate(members) for k in range(m[3])]
    spans = pa.table(
        {
            "block": pa.array([3 * i + k for i, k in placed], pa.int64()),
            "start": pa.array([k for _, k in placed], pa.int32()),
            "end": pa.array([k + 1 for _, k in placed], pa.int32()),
            "record_id": pa.array([ids[i] for i, _ in placed], pa.string()),
            "record_offset": pa.array([k for _, k in placed], pa.int64()),
            "shard": pa.array([k % 2 for _, k in placed], pa.int32()),
        }
    )
    return table, clusters, spans


@settings(max_examples=40, deadline=None)
@given(
    members=st.lists(MEMBER, max_size=25),
    shard_rows=st.integers(1, 5),
    kind=st.sampled_from(sorted(deletion_index.COLUMN)),
    data=st.data(),
)
def test_lookup_over_any_sharding_equals_a_filter(
    tmp_path_factory: pytest.TempPathFactory,
    members: list[Member],
    shard_rows: int,
    kind: str,
    data: st.DataObject,
) -> None:
    """Keys repeated across shard boundaries, null groups, SEP inside targets: the shards a
    lookup reads hold every member, removed duplicate and span a full filter finds."""
    cas = ContentStore(tmp_path_factory.mktemp("cas"))
    table, clusters, spans = _inputs(members)
    manifest = "sha256:" + "0" * 64
    digest = deletion_index.build_tables(cas, manifest, table, clusters, spans, SHARDS, shard_rows)
    index = deletion_index.load(cas, manifest, digest)
    column = deletion_index.COLUMN[kind]
    present = clusters.column(column).drop_null().to_pylist()  # every member is in clusters
    target = data.draw(st.sampled_from([*present, "nope"]), "target")
    keys = [f(kind, target) for f in (deletion_index.member_key, deletion_index.carried_key)]
    found = index.rows([*keys, deletion_index.reach_key(kind, target)])
    by_key = {k: found.filter(pc.equal(found.column("key"), k)) for k in keys}
    hit = table.filter(pc.equal(table.column(column), target)).column("record_id")
    assert sorted(by_key[keys[0]].column("record_id").to_pylist()) == sorted(hit.to_pylist())
    copies = clusters.filter(
        pc.and_(
            pc.equal(clusters.column(column), target),
            pc.invert(pc.is_null(clusters.column("representative_id"))),
        )
    )
    order = [(c, "ascending") for c in deletion_index.CARRIED]
    carried = by_key[keys[1]].select(deletion_index.CARRIED).sort_by(order)
    assert carried.to_pylist() == copies.select(deletion_index.CARRIED).sort_by(order).to_pylist()
    reached = pa.concat_arrays(
        [hit.combine_chunks(), copies.column("representative_id").combine_chunks()]
    )
    expected = spans.filter(pc.is_in(spans.column("record_id"), value_set=reached))
    got = found.filter(pc.equal(found.column("key"), deletion_index.reach_key(kind, target)))
    assert sorted(got.column("block").to_pylist()) == sorted(expected.column("block").to_pylist())
    assert sorted(zip(got["block"].to_pylist(), got["shard"].to_pylist(), strict=True)) == sorted(
        (b, SHARDS[s])
        for b, s in zip(expected["block"].to_pylist(), expected["shard"].to_pylist(), strict=True)
    )


def test_the_index_bytes_depend_on_the_rows_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same rows in another order, fetched from DuckDB in other batch sizes: the same digest."""
    members = [
        (f"r{i % 7}", f"o{i % 5}", f"g{i % 3}", i % 3, ("o9", "g9") if i % 4 else None)
        for i in range(1500)
    ]
    table, clusters, spans = _inputs(members)
    cas = ContentStore(tmp_path / "cas")
    manifest = "sha256:" + "1" * 64
    first = deletion_index.build_tables(cas, manifest, table, clusters, spans, SHARDS, 2048)
    monkeypatch.setattr(deletion_build, "BATCH_ROWS", 7)
    shuffled = [t.take(pa.array(range(t.num_rows - 1, -1, -1))) for t in (table, clusters, spans)]
    again = deletion_index.build_tables(cas, manifest, *shuffled, SHARDS, 2048)
    assert again == first
    assert deletion_index.load(cas, manifest, first).fanout.num_rows > 2  # several shards


def test_a_span_naming_an_unlisted_packed_shard_is_refused_by_name(tmp_path: Path) -> None:
    table, clusters, spans = _inputs([("r", "o", "g", 2, None)])  # spans in shards 0 and 1
    cas = ContentStore(tmp_path / "cas")
    with pytest.raises(
        deletion_index.DeletionIndexError, match=r"packed shards 0\.\.1, .* lists 1"
    ):
        deletion_index.build_tables(cas, "sha256:" + "2" * 64, table, clusters, spans, SHARDS[:1])


CHILD_SHARDS = [SHARDS[0], "sha256:" + "c" * 64]  # the last packed shard rewritten (appended)


def _all_keys(*tables: pa.Table) -> list[str]:
    """Every key the members and clusters of these inputs can name, and every record's spans."""
    keys = set()
    for table in tables:
        for kind, column in deletion_index.COLUMN.items():
            for target in table.column(column).drop_null().to_pylist():
                keys |= {f(kind, target) for f in FACTS}
        keys |= {deletion_index.span_key(r) for r in table.column("record_id").to_pylist()}
    return sorted(keys)


FACTS = (deletion_index.member_key, deletion_index.carried_key, deletion_index.reach_key)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    parent=st.lists(MEMBER, max_size=20),
    kept=st.integers(0, 20),
    added=st.lists(MEMBER, max_size=4),
    regrouped=st.lists(st.tuples(st.integers(0, 19), st.one_of(st.none(), KEYS)), max_size=2),
    shard_rows=st.integers(1, 5),
)
def test_a_child_indexed_over_its_parent_answers_as_a_whole_build(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    parent: list[Member],
    kept: int,
    added: list[Member],
    regrouped: list[tuple[int, str | None]],
    shard_rows: int,
) -> None:
    """A child of the parent's first members, some regrouped, and new ones (new ids, spans and
    removed duplicates): every key, alone and all at once, gives the rows and order of a whole
    build of the child, its last packed shard's new digest on rows the parent's index holds."""
    monkeypatch.setattr(deletion_build, "DELTA_SHARE", 0)  # never refused as too large here
    child = [*parent[:kept], *added]
    for at, group in regrouped:
        if at < len(child):
            child[at] = (child[at][0], child[at][1], group, *child[at][3:])
    cas = ContentStore(tmp_path_factory.mktemp("cas"))
    theirs, ours = _inputs(parent), _inputs(child)
    parent_manifest, manifest = "sha256:" + "3" * 64, "sha256:" + "4" * 64
    base_digest = deletion_index.build_tables(cas, parent_manifest, *theirs, SHARDS, shard_rows)
    base = deletion_build.Base(
        base_digest,
        deletion_build.read_header(cas, base_digest),
        deletion_build.Inputs(
            parent_manifest, dict(zip(deletion_build.INPUTS, theirs, strict=True)), SHARDS
        ),
    )
    over = deletion_index.build_tables(cas, manifest, *ours, CHILD_SHARDS, shard_rows, base)
    whole = deletion_index.build_tables(cas, manifest, *ours, CHILD_SHARDS, shard_rows)
    incremental, full = (deletion_index.load(cas, manifest, d) for d in (over, whole))
    assert incremental.directory["base"] == {"index": base_digest, "manifest": parent_manifest}
    keys = [*_all_keys(theirs[0], theirs[1], ours[0], ours[1]), "record\x00nope\x00member"]
    assert incremental.rows(keys).to_pylist() == full.rows(keys).to_pylist()
    for key in keys:
        assert incremental.rows([key]).to_pylist() == full.rows([key]).to_pylist(), key


def test_a_removed_duplicate_reaches_its_representatives_moved_spans_over_the_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the kept record's spans move (repacked) and no member or removed duplicate changes:
    its removed copy's object and group (found in the same scan as the clusters' difference)
    answer the moved spans, as a whole build does."""
    monkeypatch.setattr(deletion_build, "DELTA_SHARE", 0)
    theirs = _inputs([("r", "o", "g", 1, ("copy", "cg")), ("s", "p", None, 1, None)])
    blocks = theirs[2].column("block")
    moved = theirs[2].set_column(0, "block", pc.add(blocks, pa.scalar(7, pa.int64())))
    ours = (theirs[0], theirs[1], moved)
    cas = ContentStore(tmp_path / "cas")
    parent_manifest, manifest = "sha256:" + "3" * 64, "sha256:" + "4" * 64
    base_digest = deletion_index.build_tables(cas, parent_manifest, *theirs, SHARDS)
    relations = dict(zip(deletion_build.INPUTS, theirs, strict=True))
    base = deletion_build.Base(
        base_digest,
        deletion_build.read_header(cas, base_digest),
        deletion_build.Inputs(parent_manifest, relations, SHARDS),
    )
    over = deletion_index.build_tables(cas, manifest, *ours, SHARDS, base=base)
    whole = deletion_index.build_tables(cas, manifest, *ours, SHARDS)
    incremental, full = (deletion_index.load(cas, manifest, d) for d in (over, whole))
    assert "base" in incremental.directory
    for kind, target in (("object", "copy"), ("group", "cg")):
        key = deletion_index.reach_key(kind, target)
        rows = incremental.rows([key]).to_pylist()
        assert rows == full.rows([key]).to_pylist()
        assert [row["block"] for row in rows] == [7]
