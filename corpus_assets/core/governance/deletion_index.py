"""Deletion index: per snapshot, every key a tombstone can name, sorted, in small CAS shards.

Answering a tombstone by scanning every snapshot's members, dedup and spans tables reads (and
re-hashes) hundreds of MB per snapshot. The index (``deletion_rows``: its keys, rows and
out-of-core build) puts everything a target reaches - members, removed duplicates and the
packed spans of both - under adjacent keys, in Parquet shards of ``SHARD_ROWS`` rows. The
directory is a small Arrow IPC table (each shard's first and last key and digest; the header -
schema, manifest, code - in its metadata), which hashes and decodes in well under a
millisecond, so a tombstone costs a snapshot the directory and usually one shard, each
verified by its digest like every CAS read.

The index is a function of the manifest and this code: the catalog's memo table maps (manifest
digest, ``CODE``) to the directory's digest, and the directory names both again, so a fix to
the builder builds a new index and a memo row pointing elsewhere is refused. The snapshotId is
untouched: the index is a side table, built when the manifest is (``release.manifest``), or on
first use for a snapshot built before.
"""

import io
import json
from bisect import bisect_left, bisect_right
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
from sqlalchemy import select

from corpus_assets.core.governance.deletion_rows import (  # re-exported: the index's API
    CARRIED,
    COLUMN,
    ROWS,
    SPANS,
    DeletionIndexError,
    Relation,
    carried_key,
    member_key,
    put_shards,
    reach_key,
    span_key,
)
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layers import load_index
from corpus_assets.core.storage import duck
from corpus_assets.core.storage.artifacts import get_json, put_bytes
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, layer_memo
from corpus_assets.core.storage.digests import json_digest

__all__ = [  # the keys and row format, from deletion_rows, are part of this module's API
    "CARRIED",
    "COLUMN",
    "ROWS",
    "SPANS",
    "DeletionIndex",
    "DeletionIndexError",
    "build",
    "carried_key",
    "ensure",
    "for_snapshot",
    "for_snapshots",
    "member_key",
    "reach_key",
    "span_key",
]
CODE = stage_code("governance.deletion_index", __name__)  # its closure: deletion_rows too
SCHEMA = "corpus.deletion-index.v2"
SHARD_ROWS = 1 << 12  # ~10-40 KB of Parquet: a lookup hashes and decodes one or two
FANOUT = pa.schema([("first", pa.string()), ("last", pa.string()), ("digest", pa.string())])
HEADER = b"corpus.deletion-index"  # the directory's metadata key holding its JSON header


class DeletionIndex:
    """Lookups in one snapshot's index; each shard read is verified and decoded once."""

    def __init__(self, cas: ContentStore, directory: dict[str, Any], fanout: pa.Table) -> None:
        self.cas = cas
        self.directory = directory
        self.fanout = fanout
        self._bounds: tuple[list[str], list[str]] | None = None
        self._decoded: dict[int, pa.Table] = {}

    def rows(self, keys: list[str]) -> pa.Table:
        """The index rows under any of ``keys``, in index order."""
        wanted = sorted({i for key in keys for i in self._holding(key, len(keys))})
        value_set = pa.array(keys, pa.string())
        found = [self._shard(i) for i in wanted]
        found = [t.filter(pc.is_in(t.column("key"), value_set=value_set)) for t in found]
        return pa.concat_tables(found) if found else ROWS.empty_table()

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
            self._decoded[i] = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
        return self._decoded[i]


def _py(scalar: pa.Scalar) -> Any:
    return scalar.as_py()


def memo_key(manifest_digest: str) -> str:
    return json_digest(
        {"table": "governance.deletion_index", "code": CODE, "manifest": manifest_digest}
    )


def for_snapshot(cas: ContentStore, catalog: Catalog, manifest_digest: str) -> DeletionIndex:
    """The snapshot's index, built and remembered if it was not (a snapshot built before)."""
    return for_snapshots(cas, catalog, [manifest_digest])[0]


def for_snapshots(
    cas: ContentStore, catalog: Catalog, manifest_digests: list[str]
) -> list[DeletionIndex]:
    """Each snapshot's index, their memo rows read in one query (a lookup over a hundred
    snapshots is a few ms of catalog, not a round trip each)."""
    known = _remembered(catalog, [memo_key(d) for d in manifest_digests])
    return [load(cas, d, ensure(cas, catalog, d, known.get(memo_key(d)))) for d in manifest_digests]


def ensure(
    cas: ContentStore, catalog: Catalog, manifest_digest: str, remembered: str | None = None
) -> str:
    """The index directory's digest: the remembered one if its object is present, else built
    now and remembered (what the manifest build calls, so the first lookup finds it)."""
    if remembered is None:
        hit = catalog.memo(memo_key(manifest_digest))
        remembered = None if hit is None else hit[0]
    if remembered is not None and cas.contains(remembered):
        return remembered
    digest = build(cas, manifest_digest)
    catalog.remember(memo_key(manifest_digest), "governance.deletion_index", digest, "{}")
    return digest


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
    data = cas.get_bytes(digest, "deletion index")
    try:
        fanout = ipc.open_file(pa.BufferReader(data)).read_all()
        header = json.loads((fanout.schema.metadata or {})[HEADER])
    except (pa.ArrowInvalid, KeyError, ValueError) as error:
        raise DeletionIndexError(
            f"deletion index {digest} remembered for manifest {manifest_digest} is not a "
            f"{SCHEMA} directory: {error}"
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


def build(cas: ContentStore, manifest_digest: str, shard_rows: int = SHARD_ROWS) -> str:
    """The snapshot's members, dedup clusters and spans, read from their verified CAS files and
    sorted out of core; the index directory's digest."""
    manifest = get_json(cas, manifest_digest, "manifest")
    dedup = load_index(cas, manifest["layers"]["dedup_clusters"], "dedup_clusters")
    packed = load_index(cas, manifest["layers"]["packed_blocks"], "packed_blocks")
    files = duck.VerifiedFiles(cas)
    tables = {
        "members": manifest["members"]["digest"],
        "clusters": dedup.output("clusters")["digest"],
        "spans": packed.output("spans")["digest"],
    }
    relations: dict[str, Relation] = {
        name: files.path(digest, f"{name} table") for name, digest in tables.items()
    }
    shards = [ref["digest"] for ref in packed.outputs.get("shards", [])]
    return _put(cas, manifest_digest, relations, shards, shard_rows)


def build_tables(
    cas: ContentStore,
    manifest_digest: str,
    members: pa.Table,
    clusters: pa.Table | None,
    spans: pa.Table | None,
    shards: list[str],
    shard_rows: int = SHARD_ROWS,
) -> str:
    """``build`` over tables in memory (tests and the bench): the same query and bytes."""
    relations = {"members": members, "clusters": clusters, "spans": spans}
    return _put(cas, manifest_digest, relations, shards, shard_rows)


def _put(
    cas: ContentStore,
    manifest_digest: str,
    relations: dict[str, Relation],
    shards: list[str],
    shard_rows: int,
) -> str:
    """The shards, then the directory naming them; its digest."""
    fanout, rows, span_columns = put_shards(cas, manifest_digest, relations, shards, shard_rows)
    header = {
        "schema": SCHEMA,
        "manifest": manifest_digest,
        "code": CODE,
        "spanColumns": span_columns,
        "rows": rows,
    }
    columns = [pa.array([shard[i] for shard in fanout], pa.string()) for i in range(3)]
    schema = FANOUT.with_metadata({HEADER: json.dumps(header, sort_keys=True)})
    sink = io.BytesIO()  # Arrow IPC bytes are a function of the table, like pinned Parquet
    with ipc.new_file(sink, schema) as writer:
        writer.write_table(pa.Table.from_arrays(columns, schema=schema))
    return put_bytes(cas, sink.getvalue())["digest"]
