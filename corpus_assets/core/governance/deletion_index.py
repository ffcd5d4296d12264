"""Deletion index: per snapshot, every key a tombstone can name, sorted, in small CAS shards.

Answering a tombstone by scanning every snapshot's members, dedup and spans tables reads (and
re-hashes) hundreds of MB per snapshot. The index (``deletion_build``: its keys, rows, the
out-of-core build and the bytes) puts everything a target reaches - members, removed
duplicates and the packed spans of both - under adjacent keys, in Parquet shards of 4,096 rows
behind a directory: an Arrow IPC table of each shard's first and last key and digest, with the
header (schema, manifest, builder code) in its metadata. It hashes and decodes in a fraction of
a millisecond, so a tombstone costs a snapshot the directory and usually one shard, each
verified by its digest like every CAS read.

The index is a function of the manifest and the builder's code (``CODE``, the closure of
``deletion_build``: a change to this reader rebuilds nothing): the catalog's memo table maps
(manifest digest, ``CODE``) to the directory's digest, and the directory names both again, so
a fix to the builder builds a new index and a memo row pointing elsewhere is refused. The
snapshotId is untouched: the index is a side table, built when the manifest is
(``publication.manifest`` calls ``ensure``), or on first use for a snapshot built before.

A child snapshot is indexed over its parent's index when this code built that one
(``deletion_build``): the child's directory names the parent's as its base and holds only the keys
the new inputs change; a lookup reads the chain and gives the rows a whole build would. A parent
without such an index: the child is built whole, its header saying why.
"""

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from sqlalchemy import select

from corpus_assets.core.governance import deletion_build, states
from corpus_assets.core.governance.deletion_build import (  # re-exported: the index's API
    CODE,
    SCHEMA,
    DeletionIndexError,
    build,
    build_tables,
    read_directory,
)
from corpus_assets.core.governance.deletion_sql import (  # re-exported: the index's API
    CARRIED,
    COLUMN,
    ROWS,
    SPANS,
    STORED,
    carried_key,
    member_key,
    reach_key,
    span_key,
)
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import read_manifest
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, layer_memo
from corpus_assets.core.storage.digests import json_digest

__all__ = [  # the keys, row format and build, from deletion_build, are part of this API
    "CARRIED",
    "CODE",
    "COLUMN",
    "ROWS",
    "SCHEMA",
    "SPANS",
    "DeletionIndex",
    "DeletionIndexError",
    "build",
    "build_tables",
    "carried_key",
    "ensure",
    "for_snapshot",
    "for_snapshots",
    "member_key",
    "parent_index",
    "reach_key",
    "span_key",
]


class DeletionIndex:
    """Lookups in one snapshot's index; each shard read is verified and decoded once."""

    def __init__(self, cas: ContentStore, directory: dict[str, Any], fanout: pa.Table) -> None:
        self.cas = cas
        self.directory = directory
        self.fanout = fanout
        self._bounds: tuple[list[str], list[str]] | None = None
        self._decoded: dict[int, pa.Table] = {}
        self._base: DeletionIndex | None = None
        self._gone = set(directory.get("gone", []))  # affected keys the child has no rows for

    def rows(self, keys: list[str]) -> pa.Table:
        """The index rows under any of ``keys``, in index order, each span's packed shard by
        its digest."""
        found = self.stored_rows(keys)
        shards = found.column("shard")
        digests = pc.take(pa.array(self.directory["shards"], pa.string()), shards)
        return found.set_column(found.schema.get_field_index("shard"), "shard", digests).cast(ROWS)

    def stored_rows(self, keys: list[str]) -> pa.Table:
        """The rows under ``keys`` as stored (shards by number), in index order: a key this
        index holds or lists as gone is answered here, any other by its base (the parent's
        index, whose rows the child's inputs give unchanged, shard numbers included)."""
        own = self._own(keys)
        base = self.directory.get("base")
        if base is None:
            return own
        answered = set(own.column("key").to_pylist()) | self._gone
        rest = [key for key in dict.fromkeys(keys) if key not in answered]
        if not rest:
            return own
        if self._base is None:
            self._base = load(self.cas, base["manifest"], base["index"])
        found = pa.concat_tables([own, self._base.stored_rows(rest)])
        order = [(f.name, "ascending", "at_start") for f in STORED]  # DuckDB's NULLS FIRST
        return found.take(pc.sort_indices(found, sort_keys=order))

    def objects(self) -> list[tuple[str, str]]:
        """(manifest, directory digest) of each base this index chains to, nearest first (a
        base missing from the CAS ends the chain with a DeletionIndexError)."""
        found, header = [], self.directory
        while header.get("base") is not None:
            base = header["base"]
            found.append((base["manifest"], base["index"]))
            if not self.cas.contains(base["index"]):
                raise DeletionIndexError(f"deletion index base {base['index']} is not stored")
            header = read_directory(self.cas, base["index"])[1]
        return found

    def _own(self, keys: list[str]) -> pa.Table:
        """The rows under any of ``keys`` in this directory's own shards."""
        wanted = sorted({i for key in keys for i in self._holding(key, len(keys))})
        value_set = pa.array(keys, pa.string())
        found = [self._shard(i) for i in wanted]
        found = [t.filter(pc.is_in(t.column("key"), value_set=value_set)) for t in found]
        return pa.concat_tables(found) if found else STORED.empty_table()

    def _holding(self, key: str, many: int) -> range:
        """Shards whose [first, last] holds ``key``: both bounds ascend, so a contiguous run.
        A few keys bisect the Arrow columns; many convert them to lists once."""
        if many > 8 and self._bounds is None:
            self._bounds = (self.fanout["first"].to_pylist(), self.fanout["last"].to_pylist())
        if self._bounds is not None:
            firsts, lasts = self._bounds
            return range(bisect_left(lasts, key), bisect_right(firsts, key))
        firsts, lasts = self.fanout["first"], self.fanout["last"]  # O(log n) scalars decoded
        return range(bisect_left(lasts, key, key=_py), bisect_right(firsts, key, key=_py))

    def _shard(self, i: int) -> pa.Table:
        if i not in self._decoded:
            digest = self.fanout.column("digest")[i].as_py()
            data = self.cas.get_bytes(digest, f"deletion index shard {i}")
            shard = pq.ParquetFile(pa.BufferReader(data), pre_buffer=False)  # one row group
            self._decoded[i] = shard.read(use_threads=False)
        return self._decoded[i]


def _py(scalar: pa.Scalar) -> Any:
    return scalar.as_py()


def memo_key(manifest_digest: str) -> str:
    return json_digest(
        {"table": "governance.deletion_index", "code": CODE, "manifest": manifest_digest}
    )


def for_snapshot(cas: ContentStore, catalog: Catalog, manifest_digest: str) -> DeletionIndex:
    """The snapshot's index, built and remembered if it was not (a snapshot built before)."""
    return next(for_snapshots(cas, catalog, [manifest_digest]))


def for_snapshots(
    cas: ContentStore, catalog: Catalog, manifest_digests: list[str]
) -> Iterator[DeletionIndex]:
    """Each snapshot's index in turn (one held at a time, with the shards it decoded), their
    memo rows read in one query: a hundred snapshots cost one catalog round trip, not one each."""
    keys = {digest: memo_key(digest) for digest in manifest_digests}
    known = _remembered(catalog, list(keys.values()))
    for digest in manifest_digests:
        yield load(cas, digest, ensure(cas, catalog, digest, known.get(keys[digest])))


def ensure(
    cas: ContentStore,
    catalog: Catalog,
    manifest_digest: str,
    remembered: str | None = None,
    objects: Callable[[str, str], list[str] | None] | None = None,
) -> str:
    """The index directory's digest: the remembered one if its object is present, else built
    now (over the parent's index when it can be) and remembered (what the manifest build calls,
    so the first lookup finds it). ``objects`` (the manifest's): of the child's and parent's
    manifests, the only objects whose clusters rows differ, or None (``deletion_build.Base``)."""
    if remembered is None:
        hit = catalog.memo(memo_key(manifest_digest))
        remembered = None if hit is None else hit[0]
    if remembered is not None and cas.contains(remembered):
        return remembered
    same = inputs_key(cas, manifest_digest)
    digest = _same_inputs(cas, catalog, same, manifest_digest)
    if digest is None:
        base = parent_index(cas, catalog, manifest_digest)
        changed = objects(manifest_digest, base[0]) if objects and isinstance(base, tuple) else None
        digest = build(cas, manifest_digest, base=base, catalog=catalog, objects=changed)
    catalog.remember(memo_key(manifest_digest), "governance.deletion_index", digest, "{}")
    catalog.remember(same, "governance.deletion_index", digest, "{}")
    return digest


def inputs_key(cas: ContentStore, manifest_digest: str) -> str:
    """The memo key of an index by its inputs (``input_digests``) and this code."""
    digests = deletion_build.input_digests(cas, manifest_digest)
    return json_digest({"table": "governance.deletion_index.inputs", "code": CODE, **digests})


def _same_inputs(cas: ContentStore, catalog: Catalog, key: str, manifest_digest: str) -> str | None:
    """An index built from the same inputs by this code, whole in the CAS, readdressed to
    ``manifest_digest`` (its rows are the same); None if there is none."""
    hit = catalog.memo(key)
    if hit is None or not cas.contains(hit[0]):
        return None
    try:
        built_for = deletion_build.read_header(cas, hit[0])["manifest"]
        if _whole(load(cas, built_for, hit[0]), hit[0]) is None:
            return None
    except (DeletionIndexError, KeyError):
        return None
    return deletion_build.readdressed(cas, hit[0], manifest_digest)


def parent_index(
    cas: ContentStore, catalog: Catalog, manifest_digest: str
) -> tuple[str, str] | str:
    """(manifest, index digest) of the parent snapshot's index by this code, whole in the CAS
    with its inputs; else why the child's index is built whole."""
    parents = read_manifest(cas, manifest_digest).parents
    if not parents:
        return "no parent snapshot"
    try:
        parent = states.get(catalog, parents[0]).manifest_digest
    except states.StateError:
        return f"parent {parents[0]} is not in the catalog"
    hit = catalog.memo(memo_key(parent))
    if hit is None or not cas.contains(hit[0]):
        return f"parent {parents[0]} has no deletion index by this code"
    try:
        index = load(cas, parent, hit[0])
        whole = _whole(index, hit[0]) is not None and _inputs_stored(cas, parent)
    except (DeletionIndexError, KeyError, ValueError) as error:
        return f"parent {parents[0]}'s deletion index cannot be read: {error}"
    if not whole:
        return f"parent {parents[0]}'s deletion index or inputs are no longer whole in the store"
    return parent, hit[0]


def _inputs_stored(cas: ContentStore, manifest_digest: str) -> bool:
    """Whether the members, clusters and spans tables an index reads are in the CAS."""
    manifest = read_manifest(cas, manifest_digest)
    refs = [
        manifest.members.ref(),
        *(manifest.layers[n] for n in ("dedup_clusters", "packed_blocks")),
    ]
    if not all(cas.contains(ref["digest"]) for ref in refs):
        return False
    if not all(cas.contains(ref["digest"]) for ref in manifest.members.part_refs(cas)):
        return False
    dedup = load_index(cas, manifest.layers["dedup_clusters"], "dedup_clusters")
    packed = load_index(cas, manifest.layers["packed_blocks"], "packed_blocks")
    tables = [dedup.output("clusters"), packed.output("spans")]
    if not all(cas.contains(ref["digest"]) for ref in tables):
        return False
    clusters = PartedTable.read(cas, tables[0], "dedup clusters")  # its parts, or itself
    return all(cas.contains(ref["digest"]) for ref in clusters.refs)


def _whole(index: DeletionIndex, digest: str) -> set[str] | None:
    """The directories and shards of the index and of every base it chains to, if all are in
    the CAS (else None)."""
    found = {digest, *index.fanout.column("digest").to_pylist()}
    for manifest, directory in index.objects():
        found |= {directory, *load(index.cas, manifest, directory).fanout["digest"].to_pylist()}
    return found if all(index.cas.contains(d) for d in found) else None


def stored_objects(cas: ContentStore, catalog: Catalog, manifest_digests: list[str]) -> set[str]:
    """The directories and shards of these snapshots' remembered indexes (with the bases they
    chain to) that are whole in the CAS: what gc keeps, so an index is built once per snapshot,
    not again after every gc."""
    found: set[str] = set()
    known = _remembered(catalog, [memo_key(d) for d in manifest_digests])
    for digest in manifest_digests:
        directory = known.get(memo_key(digest))
        if directory is None or not cas.contains(directory):
            continue
        try:
            whole = _whole(load(cas, digest, directory), directory)
        except DeletionIndexError:
            continue  # a base gone or rewritten: the index is rebuilt on its next use
        found |= whole or set()
    return found


def _remembered(catalog: Catalog, keys: list[str]) -> dict[str, str]:
    """memo key -> index digest for those of ``keys`` with a memo row."""
    found: dict[str, str] = {}
    with catalog.begin() as conn:
        for at in range(0, len(keys), 500):  # well under any backend's bound-parameter limit
            query = select(layer_memo.c.memo_key, layer_memo.c.index_digest).where(
                layer_memo.c.memo_key.in_(keys[at : at + 500])
            )
            found.update({k: d for k, d in conn.execute(query).all()})
    return found


def load(cas: ContentStore, manifest_digest: str, digest: str) -> DeletionIndex:
    """The verified directory, refused unless it names this manifest and this code."""
    try:
        fanout, header = read_directory(cas, digest)
    except DeletionIndexError as error:
        raise DeletionIndexError(
            f"deletion index {digest} remembered for manifest {manifest_digest}: {error}"
        ) from None
    if (header.get("schema"), header.get("manifest"), header.get("code")) != (
        SCHEMA,
        manifest_digest,
        CODE,
    ):
        raise DeletionIndexError(
            f"deletion index {digest} remembered for manifest {manifest_digest} describes "
            f"manifest {header.get('manifest')} built by {header.get('code')}"
        )
    return DeletionIndex(cas, header, fanout)
