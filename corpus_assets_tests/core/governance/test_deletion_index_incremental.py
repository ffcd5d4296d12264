"""A child snapshot's deletion index is built over its parent's.

A real demo parent is built and activated, ~1% new essays are added and the child is built (the
packing test's homes: shards of ~10 blocks, so most are kept). The child's index names the
parent's as its base and holds only the keys the new inputs reach; tombstone hits on a record in
a kept shard and on a new one agree with the table scan and with a whole build of the child; a
rebuild gives the same bytes; a parent indexed by other code gives a whole build saying why.
The child's members table is joined from the parent's narrowed canonical chunks and its new one.
"""

import re
from pathlib import Path

import duckdb
import pytest
from sqlalchemy import delete, select

from corpus_assets.core.governance import deletion_build, deletion_index, states
from corpus_assets.core.governance.deletion_reach import hits, scan_hits
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication import gc, manifest, manifest_deletion, narrowed
from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.publication.publish import activate, approve
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import LAYERS, load_index, read_layer_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import read_manifest
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage import cas_queries
from corpus_assets.core.storage.artifacts import get_json, get_table
from corpus_assets.core.storage.cas import CorruptObjectError
from corpus_assets.core.storage.catalog import layer_memo, verified_files
from corpus_assets.core.storage.table_lookup import TrustedFiles
from corpus_assets_tests.core.publication.test_member_parts import _clusters_as_parts
from corpus_assets_tests.core.training_view.test_packing_incremental import (  # noqa: F401 (an autouse fixture)
    _active,
    _add_essays,
    _home,
    _no_env_catalog,
)


def _child(tmp_path: Path) -> tuple[Path, str, str]:
    """A home with an active parent and its child built: (config, parent, child manifests)."""
    config = _home(tmp_path / "home")
    with open_workspace(config) as ws:
        parent = _active(ws, "p1")
        new = _add_essays(tmp_path / "home")
        child = build_all(ws, "p2")["manifest"].digests["snapshotId"]
        assert new  # the essays are records of the child only
        digests = [states.get(ws.catalog, s).manifest_digest for s in (parent, child)]
    return config, *digests


def _header(ws: Workspace, manifest: str) -> dict:
    hit = ws.catalog.memo(deletion_index.memo_key(manifest))
    assert hit is not None
    return deletion_build.read_header(ws.cas, hit[0])


def _spans(ws: Workspace, manifest: str) -> list[dict]:
    packed = get_json(ws.cas, manifest, "manifest")["layers"]["packed_blocks"]
    index = load_index(ws.cas, packed, "packed_blocks")
    return get_table(ws.cas, index.output("spans")).to_pylist()


def test_a_child_index_over_its_parent_answers_tombstones_as_the_scan(tmp_path: Path) -> None:
    config, parent, child = _child(tmp_path)
    with open_workspace(config) as ws:
        header = _header(ws, child)
        remembered = ws.catalog.memo(deletion_index.memo_key(parent))
        assert header["base"] == {"index": remembered[0], "manifest": parent}
        assert 0 < header["rows"] < _header(ws, parent)["rows"] / 4  # the delta only
        spans = _spans(ws, child)
        last = max(s["shard"] for s in spans)
        old = next(s["record_id"] for s in spans if s["shard"] == 0)  # a kept shard
        new = next(s["record_id"] for s in spans if s["record_id"].startswith("essays/n"))
        assert next(s["shard"] for s in spans if s["record_id"] == new) == last
        whole = deletion_index.load(ws.cas, child, deletion_index.build(ws.cas, child))
        assert "base" not in whole.directory
        over = deletion_index.for_snapshot(ws.cas, ws.catalog, child)
        members = read_members(ws.cas, get_json(ws.cas, child, "manifest")["members"]).to_pylist()
        by_id = {m["record_id"]: m for m in members}
        for record in (old, new):
            targets = [("record", record), ("object", by_id[record]["object"])]
            targets.append(("group", by_id[record]["group_id"]))
            for kind, target in targets:
                found = hits(ws.cas, ws.catalog, kind, target)
                assert found == scan_hits(ws.cas, ws.catalog, kind, target), (kind, target)
                assert any(h["spans"] for h in found)
                keys = [f(kind, target) for f in FACTS] + [deletion_index.span_key(record)]
                assert over.rows(keys).to_pylist() == whole.rows(keys).to_pylist()
        again = deletion_index.build(
            ws.cas, child, base=deletion_index.parent_index(ws.cas, ws.catalog, child)
        )
        assert again == ws.catalog.memo(deletion_index.memo_key(child))[0]  # the same bytes


FACTS = (deletion_index.member_key, deletion_index.carried_key, deletion_index.reach_key)


def test_a_parent_without_an_index_by_this_code_gives_a_whole_build(tmp_path: Path) -> None:
    config, parent, child = _child(tmp_path)
    with open_workspace(config) as ws:
        with ws.catalog.begin() as conn:  # as if the parent's index were another code's
            conn.execute(
                delete(layer_memo).where(
                    layer_memo.c.memo_key.in_(
                        [
                            deletion_index.memo_key(parent),
                            deletion_index.memo_key(child),
                            deletion_index.inputs_key(ws.cas, child),  # by its inputs, too
                        ]
                    )
                )
            )
        sid = get_json(ws.cas, parent, "manifest")["snapshotId"]
        reason = deletion_index.parent_index(ws.cas, ws.catalog, child)
        assert reason == f"parent {sid} has no deletion index by this code"
        header = deletion_build.read_header(
            ws.cas, deletion_index.ensure(ws.cas, ws.catalog, child)
        )
        assert "base" not in header
        assert header["full"] == reason


def test_a_child_members_table_reuses_the_parents_narrowed_chunks(tmp_path: Path) -> None:
    """The child adds one narrowed chunk to the parent's (the others are the parent's, by
    records digest); its table is the same bytes from the cache, without it, and with a cached
    chunk corrupt (narrowed again into a scratch file, never trusted)."""
    config = _home(tmp_path / "home")
    with open_workspace(config) as ws:
        _active(ws, "p1")
        before = _narrowed_rows(ws)
        _add_essays(tmp_path / "home")
        child = build_all(ws, "p2")["manifest"].digest
        after = _narrowed_rows(ws)
        assert before < after and len(after - before) == 1  # the new essays' chunk
        indexes = {layer: read_layer_index(ws, "p2", layer) for layer in LAYERS[:-1]}
        assert len(CanonicalIndex(ws.cas, indexes["canonical_records"][1]).chunks()) == len(after)
        built = get_json(ws.cas, child, "manifest")["members"]["digest"]
        victim = ws.cas.path(sorted(before)[0])
        original = victim.read_bytes()
        victim.write_bytes(original[:-9] + bytes(9))
        assert manifest.put_members(ws, indexes).ref["digest"] == built
        victim.write_bytes(original)
        with ws.catalog.begin() as conn:
            conn.execute(delete(layer_memo).where(layer_memo.c.layer == narrowed.NARROWED))
        assert manifest.put_members(ws, indexes).ref["digest"] == built
        assert _narrowed_rows(ws) == after  # the same chunks, the same bytes


def _narrowed_rows(ws: Workspace) -> set[str]:
    with ws.catalog.begin() as conn:
        query = select(layer_memo.c.index_digest).where(layer_memo.c.layer == narrowed.NARROWED)
        return {digest for (digest,) in conn.execute(query)}


def test_gc_of_the_parent_keeps_the_index_chain_its_served_child_reads(tmp_path: Path) -> None:
    """The child becomes the alias's one kept generation; gc drops the parent snapshot, whose
    index is the child's base: the chain's objects stay, and tombstone hits on a record of a
    kept shard (answered by the base) still agree with the table scan, with nothing rebuilt."""
    config, parent, child = _child(tmp_path)
    with open_workspace(config) as ws:
        sid = get_json(ws.cas, child, "manifest")["snapshotId"]
        approve(ws, sid, by="reviewer")
        activate(ws, sid, actor="test")
        directory = ws.catalog.memo(deletion_index.memo_key(child))[0]
        with ws.cas_lock(exclusive=True):
            planned = gc.plan(ws.cas, ws.catalog, ws.config.alias, keep=1)
            assert planned.dropped == [get_json(ws.cas, parent, "manifest")["snapshotId"]]
            gc.expire(ws.catalog, planned)
            gc.collect(ws.cas, planned)
        assert not ws.cas.contains(parent)  # the parent's manifest is gone with it
        spans = _spans(ws, child)
        old = next(s["record_id"] for s in spans if s["shard"] == 0)
        found = hits(ws.cas, ws.catalog, "record", old)
        assert found == scan_hits(ws.cas, ws.catalog, "record", old)
        assert [h["snapshotId"] for h in found if h["spans"]] == [sid]
        assert ws.catalog.memo(deletion_index.memo_key(child))[0] == directory  # not rebuilt


def test_tombstone_hits_after_gc_skip_an_expired_snapshot_whose_index_is_gone(
    tmp_path: Path,
) -> None:
    """gc expires the parent and removes its objects, its index with them (no chain keeps it
    here: neither index was remembered): tombstone hits search the snapshots that still have
    their content, as the table scan does, instead of failing on the expired one's manifest."""
    config, parent, child = _child(tmp_path)
    with open_workspace(config) as ws:
        sid = get_json(ws.cas, child, "manifest")["snapshotId"]
        approve(ws, sid, by="reviewer")
        activate(ws, sid, actor="test")
        with ws.catalog.begin() as conn:
            memos = [deletion_index.memo_key(parent), deletion_index.memo_key(child)]
            conn.execute(delete(layer_memo).where(layer_memo.c.memo_key.in_(memos)))
        with ws.cas_lock(exclusive=True):
            planned = gc.plan(ws.cas, ws.catalog, ws.config.alias, keep=1)
            gc.expire(ws.catalog, planned)
            gc.collect(ws.cas, planned)
        old = next(s["record_id"] for s in _spans(ws, child) if s["shard"] == 0)
        found = hits(ws.cas, ws.catalog, "record", old)
        assert found == scan_hits(ws.cas, ws.catalog, "record", old)
        assert [h["snapshotId"] for h in found] == [sid]


def test_a_rebuild_over_unchanged_sources_readdresses_the_index_it_already_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second partition over the same bytes (no parent: nothing activated) has the same
    members, clusters, spans and shards: its index is the first one's shards under a new
    directory naming its own manifest (nothing sorted: writing shards would fail), and answers
    as the table scan does."""
    config = _home(tmp_path / "home")
    with open_workspace(config) as ws:
        first = build_all(ws, "p1")["manifest"].digests["snapshotId"]

        def no_sorting(*_args: object, **_kwargs: object) -> None:
            raise AssertionError("the unchanged snapshot's index was sorted again")

        monkeypatch.setattr(deletion_build, "put_shards", no_sorting)
        second = build_all(ws, "p2")["manifest"].digests["snapshotId"]
        manifests = [states.get(ws.catalog, s).manifest_digest for s in (first, second)]
        (fanout_1, header_1), (fanout_2, header_2) = (
            deletion_build.read_directory(ws.cas, ws.catalog.memo(deletion_index.memo_key(m))[0])
            for m in manifests
        )
        assert header_2["manifest"] == manifests[1] and header_1["manifest"] == manifests[0]
        assert fanout_2 == fanout_1  # the same shards, none sorted or written again
        assert {k: v for k, v in header_2.items() if k != "manifest"} == {
            k: v for k, v in header_1.items() if k != "manifest"
        }
        record = _spans(ws, manifests[1])[0]["record_id"]
        found = hits(ws.cas, ws.catalog, "record", record)
        assert found == scan_hits(ws.cas, ws.catalog, "record", record)
        assert {h["snapshotId"] for h in found if h["spans"]} == {first, second}


def test_a_child_index_records_the_tables_it_hashed_and_still_finds_a_corrupt_one(
    tmp_path: Path,
) -> None:
    """Built over its parent's, a child's index hashes its inputs through the stat trust: the
    tables it hashed are recorded (the build's check need not read them again); a parent's
    table corrupt since it was recorded is hashed again and refused."""
    config, parent, child = _child(tmp_path)
    with open_workspace(config) as ws:
        tables = deletion_build.input_digests(ws.cas, child)
        with ws.catalog.begin() as conn:
            conn.execute(delete(verified_files))
            conn.execute(
                delete(layer_memo).where(layer_memo.c.layer == "governance.deletion_index")
            )
        deletion_index.ensure(ws.cas, ws.catalog, child)
        with ws.catalog.begin() as conn:
            recorded = {d for (d,) in conn.execute(select(verified_files.c.digest))}
        parts = {ref["digest"] for ref in read_manifest(ws.cas, child).members.part_refs(ws.cas)}
        dedup = load_index(ws.cas, read_manifest(ws.cas, child).layers["dedup_clusters"], "d")
        parts |= {r["digest"] for r in PartedTable.read(ws.cas, dedup.output("clusters"), "c").refs}
        assert {tables["spans"]} | parts <= recorded
        with ws.catalog.begin() as conn:
            conn.execute(
                delete(layer_memo).where(layer_memo.c.layer == "governance.deletion_index")
            )
        deletion_index.ensure(ws.cas, ws.catalog, parent)
        victim = ws.cas.path(read_manifest(ws.cas, parent).members.part_refs(ws.cas)[-1]["digest"])
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
        with ws.catalog.begin() as conn:
            conn.execute(
                delete(layer_memo).where(
                    layer_memo.c.memo_key.in_(
                        [deletion_index.memo_key(child), deletion_index.inputs_key(ws.cas, child)]
                    )
                )
            )
        with pytest.raises(CorruptObjectError):
            deletion_index.ensure(ws.cas, ws.catalog, child)


def test_an_index_build_that_runs_out_of_memory_at_the_cap_runs_again_with_headroom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's diffs with its parent ran out of DuckDB's 128 MB about one build in four at
    1.1 GB of raw text, and the build failed; the build now runs again under a larger cap (the
    delta's own cap set as low, so that it runs out first)."""
    config, _parent, child = _child(tmp_path)
    with open_workspace(config) as ws:
        expected = ws.catalog.memo(deletion_index.memo_key(child))[0]
        base = deletion_index.parent_index(ws.cas, ws.catalog, child)
        monkeypatch.setattr(deletion_build, "MEMORY_MB", 1)  # every statement runs out here
        monkeypatch.setattr(deletion_build, "DELTA_MB", 1)
        assert deletion_index.build(ws.cas, child, base=base) == expected
        monkeypatch.setattr(deletion_build, "HEADROOM_MB", (1,))  # no room on the retry either
        with pytest.raises(duckdb.OutOfMemoryException):  # so the first try did run out
            deletion_index.build(ws.cas, child, base=base)


def test_a_whole_build_whose_sorted_pass_runs_out_of_memory_while_streaming_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole index's passes stream out of DuckDB sorted: running out of the cap while a pass's
    rows stream (the sort reading its spilled runs back) surfaces from Arrow's reader as an
    ``OSError`` (the form ``test_sorted_batches`` sees DuckDB give), not as a statement's
    ``OutOfMemoryException``. The build runs again under more memory for both (it ran again
    for the statement's only); with no headroom left the error is raised."""
    config, _parent, child = _child(tmp_path)
    streamed = cas_queries.batches
    failed: list[str] = []

    def running_out_once(con: duckdb.DuckDBPyConnection, sql: str, rows: int) -> object:
        reader = streamed(con, sql, rows)
        if failed or "ORDER BY" not in sql:
            return reader
        failed.append(sql)

        def first_batch_then_out() -> object:
            yield next(iter(reader))
            reader.close()  # a result that failed is gone, as DuckDB's is
            raise OSError("Out of Memory Error: failed to pin block of size 256.0 KiB")

        return first_batch_then_out()

    with open_workspace(config) as ws:
        expected = deletion_build.build(ws.cas, child, base=None)
        monkeypatch.setattr(cas_queries, "batches", running_out_once)
        assert deletion_build.build(ws.cas, child, base=None) == expected
        assert len(failed) == 1
        failed.clear()
        monkeypatch.setattr(deletion_build, "HEADROOM_MB", ())
        with pytest.raises(OSError, match=r"^Out of Memory Error"):
            deletion_build.build(ws.cas, child, base=None)


class _Logged:
    """A DuckDB connection whose ``execute`` calls are appended to ``statements``."""

    def __init__(self, con: duckdb.DuckDBPyConnection, statements: list[str]) -> None:
        self.con, self.statements = con, statements

    def __getattr__(self, name: str) -> object:
        return getattr(self.con, name)

    def execute(self, sql: str, *args: object) -> object:
        self.statements.append(sql)
        return self.con.execute(sql, *args)


def _logged_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements every ``Spilling`` connection opened from now on executes, in order."""
    statements: list[str] = []
    spilling = cas_queries.Spilling.__enter__
    monkeypatch.setattr(
        cas_queries.Spilling, "__enter__", lambda s: _Logged(spilling(s), statements)
    )
    return statements


def test_a_child_index_scans_each_whole_input_once_a_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delta reads the child's whole members, clusters and spans only to diff them and to
    stage the rows its affected keys need (each once), not once for every kind of target: the
    same directory's rows as before, with two scans of the members, two of the clusters
    (their difference with the representatives of changed spans, the rows naming an affected
    target) and two of the spans."""
    config, _parent, child = _child(tmp_path)
    statements = _logged_statements(monkeypatch)
    with open_workspace(config) as ws:
        expected = ws.catalog.memo(deletion_index.memo_key(child))[0]
        base = deletion_index.parent_index(ws.cas, ws.catalog, child)
        assert deletion_index.build(ws.cas, child, base=base) == expected
    run = [s for s in statements if not s.lstrip().startswith("CREATE VIEW")]
    scans = {
        name: sum(len(re.findall(rf"(?<![\w.])FROM {name}\b", s)) for s in run)
        for name in ("members", "clusters", "spanrows")
    }
    assert scans == {"members": 2, "clusters": 2, "spanrows": 2}


def test_the_removed_duplicates_difference_reads_only_the_objects_of_unshared_clusters_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both snapshots' clusters tables as chunk parts (as the dedup writer stores them): the
    delta diffs the removed duplicates of the objects of the parts the two do not share only
    (no difference of the whole tables runs) and gives the directory a difference of the
    whole tables gives; without those objects it diffs the whole tables."""
    config, parent, child = _child(tmp_path)
    statements = _logged_statements(monkeypatch)
    with open_workspace(config) as ws:
        expected = ws.catalog.memo(deletion_index.memo_key(child))[0]  # built by ensure
        files = TrustedFiles(ws.cas, ws.catalog)
        ours, theirs = _clusters_as_parts(ws, files, "p2"), _clusters_as_parts(ws, files, "p1")
        objects = manifest_deletion.unshared_objects(files, ours, theirs)
        every = get_json(ws.cas, child, "manifest")["sources"]
        assert objects and len(objects) < sum(int(s["objects"]) for s in every)
        base = deletion_index.parent_index(ws.cas, ws.catalog, child)
        statements[:] = []
        assert deletion_index.build(ws.cas, child, base=base, objects=objects) == expected
        narrowed, statements[:] = list(statements), []
        assert deletion_index.build(ws.cas, child, base=base) == expected
        # the build's own narrowing: the objects of the parts the two do not share
        assert manifest_deletion.changed_objects(ws.cas, ws.catalog, child, parent) == objects
    assert not any("staging.cboth" in s for s in narrowed)
    assert any("staging.cdiff" in s and objects[0] in s for s in narrowed)
    assert any("staging.cboth" in s for s in statements)


def test_shared_clusters_parts_name_no_object() -> None:
    """Only the parts one document names more often than the other are read for objects: a
    part both name (as often) is never opened; a table stored whole gives None."""

    class Files:
        def __init__(self) -> None:
            self.read: list[str] = []

        def paths(self, digests: list[str], what: str) -> list[str]:
            self.read += digests
            return []

    def table(*digests: str) -> PartedTable:
        refs = tuple({"digest": d, "media": "m", "size": 1} for d in digests)
        return PartedTable(refs, (1,) * len(refs))

    files = Files()
    found = manifest_deletion.unshared_objects(files, table("a", "b", "b"), table("b", "c"))
    assert found == [] and files.read == ["a", "b", "c"]
    whole = PartedTable(({"digest": "a", "media": "m", "size": 1},), None)
    assert manifest_deletion.unshared_objects(files, whole, table("a")) is None
