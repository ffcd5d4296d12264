"""Deletion index: per snapshot, every key a tombstone can name, sorted, in small CAS shards.

Answering a tombstone by scanning every snapshot's members, dedup and spans tables reads (and
re-hashes) hundreds of MB per snapshot. The index holds one row per (key, fact), keyed by the
target first so that everything one tombstone needs is adjacent, usually in one shard:

- ``<kind>/<target>/carried``: a removed duplicate (verdict, kept representative, match);
- ``<kind>/<target>/member``: a member (its record id);
- ``<kind>/<target>/spans``: every packed span of those members and representatives, so a
  group or object whose records are scattered over the record-id order is one read, not one
  per record;
- ``span/<record id>``: a record's packed spans (for callers asking about one record).

The rows, sorted by every column, are cut into Parquet shards of ``SHARD_ROWS`` rows. The
directory is a small Arrow IPC table (each shard's first and last key and digest; the header -
schema, manifest, code - in its metadata), so a lookup hashes and decodes it in well under a
millisecond, then reads only the shards whose range holds a key, each verified by its digest
like every CAS read.

The build streams: DuckDB reads the verified CAS files, joins and sorts out of core under
``MEMORY_MB`` and the sorted rows are cut into shards as they arrive. The index is a function
of the manifest and this code: the catalog's memo table maps (manifest digest, ``CODE``) to the
directory's digest, and the directory names both again, so a fix to the builder builds a new
index and a memo row pointing elsewhere is refused. The snapshotId is untouched: the index is a
side table, built when the manifest is (``release.manifest``), or on first use for a snapshot
built before.
"""

import io
import json
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
from sqlalchemy import select

from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layers import load_index
from corpus_assets.core.storage import duck
from corpus_assets.core.storage.artifacts import get_json, put_bytes, put_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, layer_memo
from corpus_assets.core.storage.digests import json_digest

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

CODE = stage_code("governance.deletion_index", __name__)
SCHEMA = "corpus.deletion-index.v2"
SHARD_ROWS = 1 << 12  # ~10-40 KB of Parquet: a lookup hashes and decodes one or two
SEP = "\x00"  # the smallest code point: "a" + SEP sorts before "ab", as the tuples would
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
FANOUT = pa.schema([("first", pa.string()), ("last", pa.string()), ("digest", pa.string())])
HEADER = b"corpus.deletion-index"  # the directory's metadata key holding its JSON header
MEMORY_MB, THREADS = 256, 2  # DuckDB's cap for the build's join and sort; beyond it, it spills
BATCH_ROWS = 1 << 16  # sorted rows fetched from DuckDB at a time


class DeletionIndexError(RuntimeError):
    """An index directory that does not describe the snapshot it was looked up for."""


def member_key(kind: str, target: str) -> str:
    return SEP.join((kind, target, "member"))


def carried_key(kind: str, target: str) -> str:
    return SEP.join((kind, target, "carried"))


def reach_key(kind: str, target: str) -> str:
    """The packed spans of every member and carrying representative the target names."""
    return SEP.join((kind, target, "spans"))


def span_key(record_id: str) -> str:
    return SEP.join(("span", record_id))


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
    shards = [ref["digest"] for ref in packed.outputs.get("shards", [])]
    with _connection(cas) as con:
        for name, digest in tables.items():
            path = duck.sql_path(files.path(digest, f"{name} table"))
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet({path})")
        return _write(cas, con, set(tables), manifest_digest, shards, shard_rows)


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
    given = {"members": members, "clusters": clusters, "spans": spans}
    present = {name for name, table in given.items() if table is not None}
    with _connection(cas) as con:
        for name in present:
            con.register(name, given[name])
        return _write(cas, con, present, manifest_digest, shards, shard_rows)


def _connection(cas: ContentStore) -> duck.Spilling:
    return duck.Spilling(cas.root.parent / "tmp", f"{MEMORY_MB}MB", THREADS)


def _write(
    cas: ContentStore,
    con: "DuckDBPyConnection",
    present: set[str],
    manifest_digest: str,
    shards: list[str],
    shard_rows: int,
) -> str:
    """Shard the sorted rows of the ``members`` / ``clusters`` / ``spans`` relations into the
    CAS, then the directory; its digest."""
    columns = {name: _columns(con, name, present) for name in ("members", "clusters", "spans")}
    span_columns = [c for c in SPANS if c in columns["spans"]]
    if "shard" in columns["spans"]:  # an index written before shards has none
        con.register("packed_shards", _shard_names(con, manifest_digest, shards))
    sql = rows_query(columns)
    fanout: list[tuple[str, str, str]] = []
    rows = 0
    for part in _cut(duck.batches(con, sql, BATCH_ROWS), shard_rows):
        keys = part.column("key")
        if (fanout and keys[0].as_py() < fanout[-1][1]) or not _ascending(keys):
            raise DeletionIndexError(f"deletion index of {manifest_digest}: keys out of order")
        fanout.append((keys[0].as_py(), keys[-1].as_py(), put_table(cas, part)["digest"]))
        rows += part.num_rows
    header = {
        "schema": SCHEMA,
        "manifest": manifest_digest,
        "code": CODE,
        "spanColumns": span_columns,
        "rows": rows,
    }
    return put_bytes(cas, _directory_bytes(header, fanout))["digest"]


def _columns(con: "DuckDBPyConnection", name: str, present: set[str]) -> list[str]:
    """The relation's columns; none if it was not given (a test's index of members alone)."""
    if name not in present:
        return []
    return [row[0] for row in con.execute(f"DESCRIBE {name}").fetchall()]


def _shard_names(con: "DuckDBPyConnection", manifest_digest: str, shards: list[str]) -> pa.Table:
    """Packed shard number -> digest; a span naming a shard the index does not list is an
    error (the lookup would report a shard that does not exist)."""
    low, high = con.execute("SELECT min(shard), max(shard) FROM spans").fetchall()[0]
    if low is not None and (low < 0 or high >= len(shards)):
        raise DeletionIndexError(
            f"deletion index of {manifest_digest}: spans name packed shards {low}..{high}, "
            f"the packed_blocks index lists {len(shards)}"
        )
    return pa.table({"number": pa.array(range(len(shards)), pa.int64()), "digest": shards})


def rows_query(columns: dict[str, list[str]]) -> str:
    """Every index row, sorted by every column (so equal inputs give equal bytes)."""
    sep = "chr(0)"
    member_cols, cluster_cols, span_cols = columns["members"], columns["clusters"], columns["spans"]
    targets = [
        f"SELECT '{kind}' AS kind, CAST({col} AS VARCHAR) AS target, record_id FROM members "
        f"WHERE {col} IS NOT NULL"
        for kind, col in COLUMN.items()
        if col in member_cols
    ] or ["SELECT NULL AS kind, NULL AS target, NULL AS record_id WHERE false"]
    carried = ["SELECT NULL AS kind, NULL AS target, " + _nulls(CARRIED) + " WHERE false"]
    if "verdict" in cluster_cols:  # else: before near-dedup
        duplicates = ", ".join(f"'{d}'" for d in DUPLICATES)
        carried += [
            f"SELECT '{kind}', CAST({col} AS VARCHAR), {', '.join(CARRIED)} FROM clusters "
            f"WHERE {col} IS NOT NULL AND verdict IN ({duplicates})"
            for kind, col in COLUMN.items()
            if col in cluster_cols
        ]
    spans = "SELECT " + _nulls(SPANS) + " WHERE false"
    if span_cols:
        shard = "p.digest" if "shard" in span_cols else "NULL"
        picked = [f's."{c}"' if c in span_cols else "NULL" for c in SPANS if c != "shard"]
        spans = f"SELECT {', '.join(picked[:2])}, {shard}, {', '.join(picked[2:])} FROM spans s" + (
            " JOIN packed_shards p ON p.number = s.shard" if "shard" in span_cols else ""
        )
    fields = ", ".join(f'"{f.name}"' for f in ROWS if f.name != "key")
    return f"""
WITH targets AS ({" UNION ALL ".join(targets)}),
carried AS ({" UNION ALL ".join(carried)}),
spanrows ({", ".join(f'"{c}"' for c in SPANS)}) AS ({spans}),
reached AS (SELECT kind, target, record_id AS rid FROM targets
            UNION SELECT kind, target, representative_id FROM carried
            WHERE representative_id IS NOT NULL),
everything AS (
  SELECT kind || {sep} || target || {sep} || 'member' AS key, record_id,
         NULL AS verdict, NULL AS representative_id, NULL AS match_id, NULL AS match_jaccard,
         NULL AS record_offset, NULL AS shard, NULL AS block, NULL AS "start", NULL AS "end"
  FROM targets
  UNION ALL
  SELECT kind || {sep} || target || {sep} || 'carried', record_id, verdict, representative_id,
         match_id, match_jaccard, NULL, NULL, NULL, NULL, NULL
  FROM carried
  UNION ALL
  SELECT r.kind || {sep} || r.target || {sep} || 'spans', s.record_id, NULL, NULL, NULL, NULL,
         s.record_offset, s.shard, s.block, s."start", s."end"
  FROM reached r JOIN spanrows s ON s.record_id = r.rid
  UNION ALL
  SELECT 'span' || {sep} || record_id, record_id, NULL, NULL, NULL, NULL,
         record_offset, shard, block, "start", "end"
  FROM spanrows WHERE record_id IS NOT NULL
)
SELECT key, {fields} FROM everything
ORDER BY {", ".join(f'"{f.name}" ASC NULLS FIRST' for f in ROWS)}
"""


def _nulls(names: list[str]) -> str:
    return ", ".join(f'NULL AS "{n}"' for n in names)


def _cut(reader: pa.RecordBatchReader, rows: int) -> Iterator[pa.Table]:
    """The stream as contiguous tables of exactly ``rows`` rows (the last may be shorter) in
    ``ROWS``'s types, however DuckDB chunked it: the shard bytes depend on the rows alone."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in reader:
        while batch.num_rows:
            take = min(rows - count, batch.num_rows)
            held.append(batch.slice(0, take))
            batch, count = batch.slice(take), count + take
            if count == rows:
                yield _typed(held)
                held, count = [], 0
    if count:
        yield _typed(held)


def _typed(batches: list[pa.RecordBatch]) -> pa.Table:
    table = pa.Table.from_batches(batches).combine_chunks()
    return pa.Table.from_arrays(
        [table.column(f.name).cast(f.type) for f in ROWS], schema=ROWS
    ).combine_chunks()


def _ascending(keys: pa.ChunkedArray) -> bool:
    """True if ``keys`` never decrease (the order bisecting the directory relies on)."""
    if len(keys) < 2:
        return True
    return not pc.any(pc.less(keys[1:], keys[:-1])).as_py()


def _directory_bytes(header: dict[str, Any], fanout: list[tuple[str, str, str]]) -> bytes:
    """The directory as an Arrow IPC file: (first, last, digest) per shard, the header in the
    schema's metadata (Arrow IPC bytes are a function of the table, like pinned Parquet)."""
    columns = [pa.array([row[i] for row in fanout], pa.string()) for i in range(3)]
    schema = FANOUT.with_metadata({HEADER: json.dumps(header, sort_keys=True)})
    table = pa.Table.from_arrays(columns, schema=schema)
    sink = io.BytesIO()
    with ipc.new_file(sink, schema) as writer:
        writer.write_table(table)
    return sink.getvalue()
