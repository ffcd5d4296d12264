"""The members table as parts: a child names its parent's part of every unchanged chunk, joins
only the rest, and its parts are byte for byte those of a join of every chunk."""

import tempfile
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.ingest.freeze import freeze
from corpus_assets.core.publication import manifest, member_parts
from corpus_assets.core.publication.manifest_queries import connect
from corpus_assets.core.publication.member_parts import (
    MEMBERS_CODE,
    Parent,
    put_member_parts,
    reusable,
    same_clusters_parts,
)
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import LAYERS, read_layer_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import (
    CLUSTER_PARTS_SCHEMA,
    ChunkPart,
    ChunkParts,
    read_manifest,
)
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import JSON, Ref, get_json, put_json, put_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import sql_path
from corpus_assets.core.storage.table_lookup import TrustedFiles
from corpus_assets_tests.core.training_view.test_packing_incremental import (  # noqa: F401 (an autouse fixture)
    _active,
    _add_essays,
    _home,
    _no_env_catalog,
)


def _parts(ws: Workspace, key: str) -> dict[str, dict]:
    members = read_manifest(ws.cas, ws.catalog.layer_output(key, "manifest")).members
    return {part.chunk: part.document() for part in members.parts(ws.cas).parts}


def test_a_child_names_its_parents_parts_and_equals_a_join_of_every_chunk(
    child_home: Path,
) -> None:
    with open_workspace(child_home) as ws:
        parent, child = _parts(ws, "p1"), _parts(ws, "p2")
        new = set(child) - set(parent)
        assert len(new) == 1 and child[new.pop()]["count"] > 0  # the essays' chunk
        kept = [c for c in parent if c in child and child[c] == parent[c]]
        assert kept and len(kept) >= len(parent) - 1
        indexes = {layer: read_layer_index(ws, "p2", layer) for layer in LAYERS[:-1]}
        joined = manifest.put_members(ws, indexes)  # no parent: every chunk joined
        reused = manifest.put_members(ws, indexes, freeze(ws, "p2")[1].parents)
        assert joined.ref == reused.ref  # the same document, so the same parts
        assert joined.joined == len(child) and reused.joined < len(child)
        stored = ws.catalog.layer_output("p2", "manifest")
        assert get_json(ws.cas, stored, "manifest")["members"]["digest"] == reused.ref["digest"]
        assert get_json(ws.cas, reused.ref)["code"] == MEMBERS_CODE


def test_shared_clusters_parts_spare_the_clusters_difference(
    child_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both snapshots' clusters tables as chunk parts (as the dedup writer stores them): a
    chunk whose clusters part the two share needs only the splits tables compared, the new
    chunk's part is joined, the clusters difference never runs, and the parts are those of a
    join of every chunk."""
    with open_workspace(child_home) as ws, tempfile.TemporaryDirectory() as tmp:
        files = TrustedFiles(ws.cas, ws.catalog)
        ours, theirs = _clusters_as_parts(ws, files, "p2"), _clusters_as_parts(ws, files, "p1")
        chunks = _chunks(ws, files, Path(tmp))
        same = same_clusters_parts(ours, theirs)
        assert same is not None and 0 < len(same) < len(chunks)
        child_dedup = read_layer_index(ws, "p2", "dedup_clusters")[1]
        parents = freeze(ws, "p2")[1].parents
        parent = manifest.parent_members(ws, files, parents, child_dedup)
        assert parent is not None and parent.clusters_same == same  # both stored as parts
        parted = Parent(parent.parts, theirs.relation(files, "p"), parent.splits, same)
        indexes = {layer: read_layer_index(ws, "p2", layer) for layer in LAYERS[:-1]}
        joined = manifest.put_members(ws, indexes)
        monkeypatch.setattr(member_parts, "TOUCHED", "SELECT error('clusters compared')")
        splits = _tables(ws, files, "p2")[1]
        clusters = ours.relation(files, "c")
        reused = put_member_parts(ws.cas, chunks, clusters, splits, Path(tmp), parted)
    assert reused.ref == joined.ref and 0 < reused.joined < joined.joined


def test_a_chunk_whose_clusters_part_differs_is_joined_again(child_home: Path) -> None:
    """The parent's clusters parts with one old member's dedup key changed in its chunk's
    part: that chunk is no longer shared, so it is joined; every other shared chunk is not."""
    with open_workspace(child_home) as ws, tempfile.TemporaryDirectory() as tmp:
        files = TrustedFiles(ws.cas, ws.catalog)
        ours, theirs = _clusters_as_parts(ws, files, "p2"), _clusters_as_parts(ws, files, "p1")
        parent, chunks, _whole, splits = _child_and_parent(ws, Path(tmp))
        clusters = ours.relation(files, "c")
        same = same_clusters_parts(ours, theirs)
        assert same is not None
        before = _reused(ws, chunks, clusters, splits, _with(parent, theirs, files, same))
        kept = next(part for part in before.values() if part.count)
        victim = pq.read_table(ws.cas.path(kept.digest)).slice(0, 1).to_pylist()[0]
        edited = _edited_part(ws.cas, theirs, kept.chunk, victim["record_id"])
        same = same_clusters_parts(ours, edited)
        assert same is not None and kept.chunk not in same
        after = _reused(ws, chunks, clusters, splits, _with(parent, edited, files, same))
    lost = {part.chunk for part in before.values()} - {p.chunk for p in after.values()}
    assert lost == {kept.chunk}


def test_shared_clusters_parts_are_the_chunks_with_the_same_part() -> None:
    """A chunk counts as shared when both documents name the same part for the same chunk
    and records; a changed, new or moved part does not; a table stored whole gives None."""

    def table(*parts: tuple[str, str, str]) -> PartedTable:
        entries = [
            ChunkPart(chunk=c, records=r, digest=d, media="m", size=1, count=1) for c, r, d in parts
        ]
        return PartedTable(tuple(p.ref() for p in entries), (1,) * len(entries), tuple(entries))

    parent = table(("a", "ra", "d1"), ("b", "rb", "d2"), ("c", "rc", "d3"))
    child = table(("a", "ra", "d1"), ("b", "rb", "d9"), ("c", "rx", "d3"), ("n", "rn", "d4"))
    assert same_clusters_parts(child, parent) == {"a"}
    whole = PartedTable(({"digest": "d", "media": "m", "size": 1},), None)
    assert same_clusters_parts(whole, parent) is None
    assert same_clusters_parts(child, whole) is None


def _reused(ws: Workspace, chunks: list, clusters: str, splits: str, parent: Parent) -> dict:
    with tempfile.TemporaryDirectory() as tmp, connect(ws.cas, 1, 128) as con:
        return reusable(con, chunks, clusters, splits, parent, Path(tmp))


def _with(parent: Parent, clusters: PartedTable, files: TrustedFiles, same: frozenset) -> Parent:
    """``parent`` reading ``clusters`` (parts), with the chunks it shares with the child's."""
    return Parent(parent.parts, clusters.relation(files, "p"), parent.splits, same)


def _clusters_as_parts(ws: Workspace, files: TrustedFiles, key: str) -> PartedTable:
    """Snapshot ``key``'s clusters table as parts (``clusters_parts_ref``), read."""
    return PartedTable.read(ws.cas, clusters_parts_ref(ws, files, key), "dedup clusters")


def clusters_parts_ref(ws: Workspace, files: TrustedFiles, key: str) -> Ref:
    """Snapshot ``key``'s clusters table as the dedup layer stores it: one part per canonical
    chunk in order (its records' rows, sorted by record id, object and line) behind a
    ``corpus.clusters-parts.v1`` document. Equal rows give equal parts, so two snapshots share
    the part of every chunk whose rows are the same."""
    ref = read_layer_index(ws, key, "dedup_clusters")[1].output("clusters")
    assert ref["media"] == JSON  # the writer's parts document
    return ref


def _edited_part(cas: ContentStore, table: PartedTable, chunk: str, record_id: str) -> PartedTable:
    """``table`` with ``chunk``'s part replaced by a copy where ``record_id``'s dedup key is
    another."""
    parts = []
    for part in table.parts:
        if part.chunk == chunk:
            rows = pq.read_table(cas.path(part.digest))
            hit = pc.equal(rows.column("record_id"), record_id)
            values = pc.if_else(hit, "changed", rows.column("dedup_key"))
            rows = rows.set_column(rows.schema.get_field_index("dedup_key"), "dedup_key", values)
            part = part.model_copy(update=put_table(cas, rows))
        parts.append(part)
    count = sum(part.count for part in parts)
    document = ChunkParts(schema=CLUSTER_PARTS_SCHEMA, code="test", count=count, parts=parts)
    return PartedTable.read(cas, put_json(cas, document.document()), "dedup clusters")


@pytest.mark.parametrize("table", ["splits", "clusters"])
def test_a_chunk_with_a_changed_split_or_verdict_is_joined_again(
    child_home: Path, table: str
) -> None:
    """The parent's tables with one old member's split (or dedup key) changed: its chunk is
    no longer the parent's, every other unchanged chunk still is."""
    with open_workspace(child_home) as ws, tempfile.TemporaryDirectory() as tmp:
        parent, chunks, clusters, splits = _child_and_parent(ws, Path(tmp))
        with connect(ws.cas, 1, 128) as con:
            before = reusable(con, chunks, clusters, splits, parent, Path(tmp))
        kept = next(part for part in before.values() if part.count)
        victim = pq.read_table(ws.cas.path(kept.digest)).slice(0, 1).to_pylist()[0]
        whole = _tables(ws, TrustedFiles(ws.cas, ws.catalog), "p1")[0]  # the parent's clusters
        changed = _changed_copy(parent, whole, table, victim["record_id"], Path(tmp))
        with connect(ws.cas, 1, 128) as con:
            after = reusable(con, chunks, clusters, splits, changed, Path(tmp))
        lost = {part.chunk for part in before.values()} - {p.chunk for p in after.values()}
        assert lost == {kept.chunk}


def test_a_repeated_split_row_is_a_change_the_join_alone_would_miss(child_home: Path) -> None:
    """The splits difference is a join on the record id when each id is once in each table;
    the parent's table with one old member's row twice (same values: the join pairs both with
    the child's row and finds them equal) is a change the side counts catch: the multiset
    difference runs, and that member's chunk is joined again."""
    with open_workspace(child_home) as ws, tempfile.TemporaryDirectory() as tmp:
        parent, chunks, clusters, splits = _child_and_parent(ws, Path(tmp))
        with connect(ws.cas, 1, 128) as con:
            before = reusable(con, chunks, clusters, splits, parent, Path(tmp))
            paths = {"splits": sql_path(splits), "parent_splits": sql_path(parent.splits)}
            assert member_parts._splits_changed(con, paths) == "joined"
        kept = next(part for part in before.values() if part.count)
        victim = pq.read_table(ws.cas.path(kept.digest)).slice(0, 1).to_pylist()[0]
        rows = pq.read_table(parent.splits)
        hit = pc.equal(rows.column("record_id"), victim["record_id"])
        copy = Path(tmp) / "splits.parquet"
        pq.write_table(pa.concat_tables([rows, rows.filter(hit)]), copy)
        twice = Parent(parent.parts, parent.clusters, str(copy))
        with connect(ws.cas, 1, 128) as con:
            paths["parent_splits"] = sql_path(str(copy))
            assert member_parts._splits_changed(con, paths) == "difference"
            after = reusable(con, chunks, clusters, splits, twice, Path(tmp))
        lost = {part.chunk for part in before.values()} - {p.chunk for p in after.values()}
        assert lost == {kept.chunk}


def _child_and_parent(ws: Workspace, tmp: Path) -> tuple[Parent, list, str, str]:
    """Child ``p2``'s parent members, its chunks, its clusters table (a FROM item) and its
    splits table (a file)."""
    files = TrustedFiles(ws.cas, ws.catalog)
    parent = manifest.parent_members(ws, files, freeze(ws, "p2")[1].parents)
    assert parent is not None
    clusters, splits = _tables(ws, files, "p2")
    return parent, _chunks(ws, files, tmp), f"read_parquet({sql_path(clusters)})", splits


def _chunks(ws: Workspace, files: TrustedFiles, tmp: Path) -> list:
    from corpus_assets.core.publication.member_parts import Chunk
    from corpus_assets.core.publication.narrowed import narrowed

    canonical = CanonicalIndex(ws.cas, read_layer_index(ws, "p2", "canonical_records")[1])
    paths = narrowed(ws, files, canonical, tmp)
    return [
        Chunk(c.key, c.records["digest"], p) for c, p in zip(canonical.chunks(), paths, strict=True)
    ]


def _tables(ws: Workspace, files: TrustedFiles, key: str) -> tuple[str, str]:
    """Snapshot ``key``'s clusters table stored whole (its parts concatenated into one file,
    as snapshots before parts stored it) and its splits table."""
    parted = PartedTable.read(ws.cas, clusters_parts_ref(ws, files, key), "dedup clusters")
    whole = ws.home / "tmp" / f"whole-clusters-{key}.parquet"
    whole.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(parted.table(files, "dedup clusters"), whole)
    splits = read_layer_index(ws, key, "splits")[1].output("splits")["digest"]
    return str(whole), files.path(splits)


def _changed_copy(parent: Parent, clusters: str, table: str, record_id: str, tmp: Path) -> Parent:
    """The parent with a copy of its splits (or ``clusters``) table where ``record_id``'s
    split (or dedup key) is another."""
    path = parent.splits if table == "splits" else clusters
    column = "split" if table == "splits" else "dedup_key"
    rows = pq.read_table(path)
    hit = pc.equal(rows.column("record_id"), record_id)
    values = pc.if_else(hit, "changed", rows.column(column))
    rows = rows.set_column(rows.schema.get_field_index(column), column, values)
    copy = tmp / f"{table}.parquet"
    pq.write_table(rows, copy)
    if table == "splits":
        return Parent(parent.parts, parent.clusters, str(copy))
    return Parent(parent.parts, f"read_parquet({sql_path(str(copy))})", parent.splits)


def test_each_chunk_gets_its_rows_even_when_two_share_a_narrowed_file(tmp_path: Path) -> None:
    """One scan of all files numbers rows by file; a file named by two chunks (two objects
    with the same records) must still give each chunk its rows."""
    import pyarrow as pa

    from corpus_assets.core.publication.member_parts import Chunk, _numbered
    from corpus_assets.core.publication.narrowed import NARROW

    rows = {f.name: [None] for f in NARROW}
    rows |= {"record_id": ["r"], "line": [0], "text_bytes": [1]}
    one, two = tmp_path / "one.parquet", tmp_path / "two.parquet"
    pq.write_table(pa.table(rows, schema=NARROW), one)
    pq.write_table(pa.table(rows, schema=NARROW), two)
    con = duckdb.connect()
    for paths, expected in (([one, two, one], [3, 5, 7]), ([one, two], [3, 5])):
        chunks = [Chunk(f"c{n}", "", str(path)) for n, path in enumerate(paths)]
        query = f"SELECT part FROM ({_numbered(chunks, tmp_path, [3, 5, 7][: len(paths)])})"
        assert sorted(p for (p,) in con.execute(query).fetchall()) == expected
