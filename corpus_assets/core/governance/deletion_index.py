"""Deletion index: per snapshot, every key a tombstone can name, sorted, in small CAS shards.

Answering a tombstone by scanning every snapshot's members, dedup and spans tables reads (and
re-hashes) hundreds of MB per snapshot. The index holds one row per (key, fact): a member under
``member/<kind>/<target>``, a removed duplicate under ``carried/<kind>/<target>`` and a packed
span under ``span/<record id>``, sorted by key and cut into shards of ``SHARD_ROWS`` rows. A JSON
directory lists each shard's first and last key and digest, so a lookup reads the directory and
only the shards whose range holds the key, each verified by its digest like every CAS read.

The index is a function of the manifest and this code: the catalog's memo table maps
(manifest digest, ``CODE``) to the directory's digest, and the directory names both again, so a
fix to the builder builds a new index and a memo row pointing elsewhere is refused. The
snapshotId is untouched: the index is a side table built on first use.
"""

from bisect import bisect_left, bisect_right
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layers import load_index
from corpus_assets.core.storage.artifacts import get_json, get_table, put_json, put_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.digests import json_digest

CODE = stage_code("governance.deletion_index", __name__)
SCHEMA = "corpus.deletion-index.v1"
SHARD_ROWS = 1 << 12  # ~100 KB a shard: a lookup hashes and decodes a few, not the whole index
SEP = "\x00"  # cannot occur in a kind; keys compare by code point, as Arrow sorts UTF-8
COLUMN = {"record": "record_id", "object": "object", "group": "group_id"}
DUPLICATES = ("exact_duplicate", "near_duplicate")
CARRIED = ["record_id", "verdict", "representative_id", "match_id", "match_jaccard"]
SPANS = ["record_id", "record_offset", "shard", "block", "start", "end"]
ROWS = pa.schema(
    [
        ("key", pa.string()),
        ("record_id", pa.string()),
        ("verdict", pa.string()),
        ("representative_id", pa.string()),
        ("match_id", pa.string()),
        ("match_jaccard", pa.float64()),
        ("record_offset", pa.int64()),
        ("shard", pa.string()),
        ("block", pa.int64()),
        ("start", pa.int64()),
        ("end", pa.int64()),
    ]
)
ORDER = [("key", "ascending"), ("record_id", "ascending"), ("record_offset", "ascending")]


class DeletionIndexError(RuntimeError):
    """An index directory that does not describe the snapshot it was looked up for."""


def member_key(kind: str, target: str) -> str:
    return SEP.join(("member", kind, target))


def carried_key(kind: str, target: str) -> str:
    return SEP.join(("carried", kind, target))


def span_key(record_id: str) -> str:
    return SEP.join(("span", record_id))


def index_rows(
    members: pa.Table, clusters: pa.Table | None, spans: pa.Table | None, shards: list[str]
) -> pa.Table:
    """Every key row of one snapshot, sorted by (key, record id, record offset)."""
    parts = [_keyed("member\0" + k, members, c, ["record_id"]) for k, c in COLUMN.items()]
    if clusters is not None and "verdict" in clusters.column_names:  # else: before near-dedup
        dup = clusters.filter(pc.is_in(clusters.column("verdict"), pa.array(DUPLICATES)))
        parts += [_keyed("carried\0" + k, dup, c, CARRIED) for k, c in COLUMN.items()]
    if spans is not None:
        if "shard" in spans.column_names:  # an index written before shards has none
            digests = pc.take(pa.array(shards, pa.string()), spans.column("shard"))
            spans = spans.set_column(spans.schema.get_field_index("shard"), "shard", digests)
        parts.append(_keyed("span", spans, "record_id", SPANS))
    table = pa.concat_tables(parts).combine_chunks()
    return table.take(pc.sort_indices(table, ORDER))


def _keyed(prefix: str, table: pa.Table, column: str, keep: list[str]) -> pa.Table:
    """``table``'s rows under ``prefix + SEP + table[column]`` with the ``keep`` columns present
    (the rest null); a row whose key column is null names nothing a tombstone can target."""
    if column not in table.column_names:
        return ROWS.empty_table()
    table = table.filter(pc.is_valid(table.column(column)))
    values = table.column(column).cast(pa.string())  # an empty column may be typed null
    keys = pc.binary_join_element_wise(pa.scalar(prefix), values, SEP)
    arrays = [keys] + [
        table.column(f.name).cast(f.type)
        if f.name in keep and f.name in table.column_names
        else pa.nulls(table.num_rows, f.type)
        for f in ROWS
        if f.name != "key"
    ]
    return pa.Table.from_arrays(arrays, schema=ROWS)


def put_index(
    cas: ContentStore,
    manifest_digest: str,
    rows: pa.Table,
    span_columns: list[str],
    shard_rows: int = SHARD_ROWS,
) -> str:
    """Shard the sorted rows into the CAS; the directory's digest."""
    shards = []
    for offset in range(0, rows.num_rows, shard_rows):
        part = rows.slice(offset, shard_rows)
        keys = part.column("key")
        shards.append(
            {
                "first": keys[0].as_py(),
                "last": keys[-1].as_py(),
                "rows": part.num_rows,
                "digest": put_table(cas, part)["digest"],
            }
        )
    directory = {
        "schema": SCHEMA,
        "manifest": manifest_digest,
        "code": CODE,
        "spanColumns": span_columns,
        "rows": rows.num_rows,
        "shards": shards,
    }
    return put_json(cas, directory)["digest"]


class DeletionIndex:
    """Lookups in one snapshot's index; each shard read is verified and decoded once."""

    def __init__(self, cas: ContentStore, directory: dict[str, Any]) -> None:
        self.cas = cas
        self.directory = directory
        self.shards = directory["shards"]
        self._firsts = [s["first"] for s in self.shards]
        self._lasts = [s["last"] for s in self.shards]
        self._decoded: dict[int, pa.Table] = {}

    def rows(self, keys: list[str]) -> pa.Table:
        """The index rows under any of ``keys``, in index order."""
        wanted = sorted({i for key in keys for i in self._holding(key)})
        value_set = pa.array(keys, pa.string())
        found = [self._shard(i) for i in wanted]
        found = [t.filter(pc.is_in(t.column("key"), value_set=value_set)) for t in found]
        return pa.concat_tables(found) if found else ROWS.empty_table()

    def _holding(self, key: str) -> range:
        """Shards whose [first, last] holds ``key``: both bounds ascend, so a contiguous run."""
        return range(bisect_left(self._lasts, key), bisect_right(self._firsts, key))

    def _shard(self, i: int) -> pa.Table:
        if i not in self._decoded:
            ref = {"digest": self.shards[i]["digest"]}
            self._decoded[i] = get_table(self.cas, ref, f"deletion index shard {i}")
        return self._decoded[i]


def memo_key(manifest_digest: str) -> str:
    return json_digest(
        {"table": "governance.deletion_index", "code": CODE, "manifest": manifest_digest}
    )


def for_snapshot(cas: ContentStore, catalog: Catalog, manifest_digest: str) -> DeletionIndex:
    """The snapshot's index, built and remembered on first use."""
    key = memo_key(manifest_digest)
    hit = catalog.memo(key)
    if hit is not None and cas.contains(hit[0]):
        digest = hit[0]
    else:
        digest = build(cas, manifest_digest)
        catalog.remember(key, "governance.deletion_index", digest, "{}")
    directory = get_json(cas, digest, "deletion index")
    if (directory.get("schema"), directory.get("manifest"), directory.get("code")) != (
        SCHEMA,
        manifest_digest,
        CODE,
    ):
        raise DeletionIndexError(
            f"deletion index {digest} remembered for manifest {manifest_digest} describes "
            f"manifest {directory.get('manifest')} built by {directory.get('code')}"
        )
    return DeletionIndex(cas, directory)


def build(cas: ContentStore, manifest_digest: str) -> str:
    """Read the snapshot's members, dedup clusters and spans once; the index directory digest."""
    manifest = get_json(cas, manifest_digest, "manifest")
    members = get_table(cas, manifest["members"], "members table")
    dedup = load_index(cas, manifest["layers"]["dedup_clusters"], "dedup_clusters")
    clusters = get_table(cas, dedup.output("clusters"), "dedup clusters")
    packed = load_index(cas, manifest["layers"]["packed_blocks"], "packed_blocks")
    spans = get_table(cas, packed.output("spans"), "spans table")
    shards = [ref["digest"] for ref in packed.outputs.get("shards", [])]
    rows = index_rows(members, clusters, spans, shards)
    span_columns = [c for c in SPANS if c in spans.column_names]
    return put_index(cas, manifest_digest, rows, span_columns)
