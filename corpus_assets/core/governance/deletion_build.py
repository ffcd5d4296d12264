"""The deletion index's bytes: keys, rows, the DuckDB passes that sort them, shards, directory.

One row per (key, fact), keyed by the target first so that everything one tombstone needs is
adjacent, usually in one shard:

- ``<kind>/<target>/carried``: a removed duplicate (verdict, kept representative, match);
- ``<kind>/<target>/member``: a member (its record id);
- ``<kind>/<target>/spans``: every packed span of those members and representatives (a group
  or object scattered over the record-id order: one read, not one per record);
- ``span/<record id>``: a record's packed spans (for callers asking about one record).

The build streams, its memory bounded: DuckDB reads the inputs (verified CAS files, or tables
a test registers) in one pass per kind, then one for ``span`` rows. A pass stages its rows (a
join and a DISTINCT) in a table of a database file in the spill directory, then sorts them, so
each statement holds one large operator under ``MEMORY_MB`` and spills beyond it (both in one
statement ran out of memory at 256 MB on 1M members); a build peaks at ~400 MB RSS at 1M and
3M members. Every key begins with its kind (``span`` after all), so the passes' concatenation
is sorted; it is cut into Parquet shards of ``SHARD_ROWS`` rows: bytes depend on rows alone.
The directory lists each shard's first and last key and digest as an Arrow IPC table (a
lookup decodes it without parsing), its header (schema, manifest, ``CODE``) in the metadata.

Incremental: a child whose parent's index this ``CODE`` built is indexed over it. DuckDB diffs
the child's inputs with the parent's (members; removed duplicates, of the objects of the clusters
parts the two do not share when both are parts, ``Base.objects``; spans unlike the parent's at
the same position; one thread, ``DELTA_MB``); every key a changed row can reach is *affected*,
its rows staged in one scan of each input (``reached``). Spans name their packed shard by number,
the header their digests (``shards``). The child's shards hold the affected keys' rows only, its
header names the parent's directory (``base``) and the affected keys left without rows
(``gone``); a lookup answers an affected key from the child, any other from the base: the rows a
full build gives. A chain deeper than ``MAX_DEPTH``, a delta over a quarter of the base's rows,
over ``MAX_GONE`` gone keys, inputs of other columns: a full build.
"""

import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from corpus_assets.core.governance.deletion_sql import (
    ORDER,
    SPANS,
    STORED,
    affected,
    empty,
    queries,
    reached,
    span_rows,
    span_tails,
    staged,
    unshared_members,
)
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import read_manifest
from corpus_assets.core.storage import cas_queries
from corpus_assets.core.storage.artifacts import put_bytes, put_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.table_lookup import TrustedFiles

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

CODE = stage_code("governance.deletion_index", __name__)  # the builder's closure, not the reader's
SCHEMA = "corpus.deletion-index.v3"
SHARD_ROWS = 1 << 12  # ~35 KB of Parquet: a lookup hashes and decodes one or two
FANOUT = pa.schema([("first", pa.string()), ("last", pa.string()), ("digest", pa.string())])
HEADER = b"corpus.deletion-index"  # the directory's metadata key holding its JSON header
MEMORY_MB, THREADS = 128, 2  # DuckDB's cap (the process: ~400 MB at 1M and 3M members)
HEADROOM_MB = (256, 512)  # caps a build that ran out of memory is run again under, whole
DELTA_MB = 256  # a child's delta, one thread: a removed duplicates' difference outgrew 128 MB
BATCH_ROWS = 1 << 16  # sorted rows fetched from DuckDB at a time
Relation = str | list[str] | pa.Table | None  # Parquet file(s), a table in memory, or absent
Shard = tuple[str, str, str]  # its first key, last key and digest
INPUTS = ("members", "clusters", "spans")
MAX_DEPTH = 8  # directories a lookup may chain through; a deeper child is built whole
MAX_GONE = 1 << 14  # affected keys without rows the header may list; more: a full build
DELTA_SHARE = 4  # a delta over 1/DELTA_SHARE of the base's rows: a full build


@dataclass(frozen=True)
class Inputs:
    """What an index is a function of: the snapshot's three tables and its packed shards."""

    manifest: str
    relations: dict[str, Relation]
    shards: list[str]


@dataclass(frozen=True)
class Base:
    """The parent's index a child is built over: its directory's digest, header and inputs."""

    index: str
    header: dict[str, Any]
    inputs: Inputs
    objects: list[str] | None = None  # the only ones whose clusters rows differ (manifest_deletion)


class DeletionIndexError(RuntimeError):
    """An index that cannot be built as asked, or a directory that does not describe the
    snapshot it was looked up for."""


def put_shards(
    cas: ContentStore,
    what: str,
    relations: dict[str, Relation],
    packed_shards: list[str],
    shard_rows: int,
    base: Base | None = None,
) -> tuple[list[Shard], int, list[str], dict[str, Any]]:
    """Sort the rows of the ``members``, ``clusters`` and ``spans`` relations, put them in the
    CAS in shards of ``shard_rows``; (first key, last key, digest) a shard, rows, span columns
    and what the header adds (the base and gone keys of a delta, or why the build is whole).
    Run again under each of ``HEADROOM_MB`` if DuckDB runs out of memory: the shards are the
    same under any cap, and those an attempt put before it failed are put again."""
    caps = [MEMORY_MB, *HEADROOM_MB]
    while True:
        cap = caps.pop(0)
        try:
            return _put_shards(cas, what, relations, packed_shards, shard_rows, base, cap)
        except Exception as error:  # from a statement, or from a sorted pass's reader
            if not caps or not cas_queries.out_of_memory(error):
                raise


def _put_shards(
    cas: ContentStore,
    what: str,
    relations: dict[str, Relation],
    packed_shards: list[str],
    shard_rows: int,
    base: Base | None,
    cap_mb: int,
) -> tuple[list[Shard], int, list[str], dict[str, Any]]:
    spilling = cas_queries.Spilling(cas.root.parent / "tmp", f"{cap_mb}MB", THREADS)
    with spilling as con:
        con.execute("SET enable_progress_bar = false")  # a long sort drew one on stdout
        # staged rows go to a database file (removed with the spill directory): an in-memory
        # table of a pass ran out of memory at 128 MB on 3M members, a file's blocks are evicted
        con.execute(
            f"ATTACH {cas_queries.sql_path(str(spilling.dir / 'staged.duckdb'))} AS staging"
        )
        columns = _relations(con, relations)
        _check_shard_numbers(con, what, columns["spans"], len(packed_shards))
        con.execute(span_rows(columns["spans"]))
        span_columns = [c for c in SPANS if c in columns["spans"]]
        if base is not None:
            with cas_queries.tightened(con, f"{max(cap_mb, DELTA_MB)}MB", threads=1):
                delta = _put_delta(con, cas, what, relations, columns, shard_rows, base)
            if isinstance(delta[0], list):
                return delta[0], delta[1], span_columns, delta[2]
            extra: dict[str, Any] = {"depth": 0, "full": delta[0]}
        else:
            extra = {"depth": 0, "full": "no parent index named"}
        fanout, rows = _put_sorted(cas, what, _passes(con, columns, cap_mb), shard_rows)
    return fanout, rows, span_columns, extra | {"totalRows": rows}


def _relations(
    con: "DuckDBPyConnection", relations: dict[str, Relation], prefix: str = ""
) -> dict[str, list[str]]:
    """Each input as a view or registered table named ``prefix`` + its name; the columns of
    each (none if absent)."""
    for name, relation in relations.items():
        if isinstance(relation, str | list):
            paths = [relation] if isinstance(relation, str) else relation
            source = f"read_parquet({cas_queries.sql_list(paths)})"
            con.execute(f"CREATE VIEW {prefix}{name} AS SELECT * FROM {source}")
        elif relation is not None:
            con.register(prefix + name, relation)
    return {
        name: _columns(con, prefix + name) if relations.get(name) is not None else []
        for name in INPUTS
    }


def _put_sorted(
    cas: ContentStore,
    what: str,
    batches: Iterable[pa.RecordBatch],
    shard_rows: int,
) -> tuple[list[Shard], int]:
    """The sorted stream put in the CAS shard by shard; each shard's bounds and digest."""
    fanout: list[Shard] = []
    rows = 0
    for part in _cut(batches, shard_rows):
        keys = part.column("key")
        if (fanout and keys[0].as_py() < fanout[-1][1]) or not _ascending(keys):
            raise DeletionIndexError(f"deletion index of {what}: keys out of order")
        fanout.append((keys[0].as_py(), keys[-1].as_py(), put_table(cas, part)["digest"]))
        rows += part.num_rows
    return fanout, rows


def _columns(con: "DuckDBPyConnection", name: str) -> list[str]:
    return [row[0] for row in con.execute(f"DESCRIBE {name}").fetchall()]


def _check_shard_numbers(
    con: "DuckDBPyConnection", what: str, span_columns: list[str], count: int
) -> None:
    """A span naming a packed shard the packed_blocks index does not list is an error (the
    lookup would report a shard that does not exist)."""
    if "shard" not in span_columns:  # an index written before shards has none
        return
    low, high = con.execute("SELECT min(shard), max(shard) FROM spans").fetchall()[0]
    if low is not None and (low < 0 or high >= count):
        raise DeletionIndexError(
            f"deletion index of {what}: spans name packed shards {low}..{high}, "
            f"the packed_blocks index lists {count}"
        )


def _passes(
    con: "DuckDBPyConnection", columns: dict[str, list[str]], cap_mb: int
) -> Iterator[pa.RecordBatch]:
    """Every row, sorted: each pass staged into a table on disk, then streamed in order. The
    sort runs on one thread under half the cap (``cas_queries.tightened``): on two threads
    under the whole cap it was the manifest layer's peak (the order is total, so the rows
    come out the same)."""
    for query in queries(columns):
        con.execute(f"CREATE OR REPLACE TABLE staging.staged AS {staged(query)}")
        with cas_queries.tightened(con, f"{cap_mb // 2}MB"):
            yield from cas_queries.batches(
                con, f"SELECT * FROM staging.staged ORDER BY {ORDER}", BATCH_ROWS
            )
    con.execute("DROP TABLE IF EXISTS staging.staged")


def _put_delta(
    con: "DuckDBPyConnection",
    cas: ContentStore,
    what: str,
    relations: dict[str, Relation],
    columns: dict[str, list[str]],
    shard_rows: int,
    base: Base,
) -> tuple[list[Shard], int, dict[str, Any]] | tuple[str]:
    """The rows of the keys the parent's inputs and these give differently, put as shards over
    the base; or, as a 1-tuple, why this index must be built whole."""
    theirs = _relations(con, base.inputs.relations, "p_")
    refused = _refusal(base, columns, theirs)
    if refused:
        return (refused,)
    con.execute(span_rows(theirs["spans"], "p_"))
    views, members = unshared_members(relations["members"], base.inputs.relations["members"])
    views += span_tails(columns["spans"], relations["spans"], base.inputs.relations["spans"])
    for statement in [*views, *affected(columns, members, base.objects), *reached(columns)]:
        con.execute(statement)  # one at a time: one big operator each
    con.execute(f"CREATE TABLE staging.delta AS SELECT * FROM ({staged(empty(['key']))})")
    where = " AND key IN (SELECT key FROM staging.affected)"
    for query in queries(columns, narrow=True):
        con.execute(f"INSERT INTO staging.delta {staged(query, where)}")
    rows = _count(con, "staging.delta")
    if rows * DELTA_SHARE > base.header["totalRows"]:
        return (f"the delta over the parent's index is {rows} rows, over 1/{DELTA_SHARE} of its",)
    con.execute(
        "CREATE TABLE staging.gone AS SELECT key FROM staging.affected "
        "EXCEPT SELECT key FROM staging.delta"
    )
    if _count(con, "staging.gone") > MAX_GONE:
        return (f"{_count(con, 'staging.gone')} keys left the parent's index, over {MAX_GONE}",)
    gone = con.execute("SELECT key FROM staging.gone ORDER BY key").fetchall()
    ordered = cas_queries.batches(con, f"SELECT * FROM staging.delta ORDER BY {ORDER}", BATCH_ROWS)
    fanout, rows = _put_sorted(cas, what, ordered, shard_rows)
    extra = {
        "base": {"index": base.index, "manifest": base.inputs.manifest},
        "depth": base.header["depth"] + 1,
        "gone": [key for (key,) in gone],
        "affected": _count(con, "staging.affected"),
        "totalRows": base.header["totalRows"] + rows,
    }
    return fanout, rows, extra


def _refusal(base: Base, columns: dict[str, list[str]], theirs: dict[str, list[str]]) -> str | None:
    """Why the child cannot be indexed over this base (None: it can)."""
    if base.header.get("depth", 0) + 1 > MAX_DEPTH:
        return f"the parent's index chains {base.header.get('depth')} directories"
    if theirs != columns:
        return "the parent's members, clusters or spans have other columns"
    return None


def _count(con: "DuckDBPyConnection", table: str) -> int:
    return int(con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0])


def _cut(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """The stream as contiguous tables of exactly ``rows`` rows (the last may be shorter) in
    ``STORED``'s types, however DuckDB chunked it: the shard bytes depend on the rows alone."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
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
    """One contiguous table in ``STORED``'s types."""
    table = pa.Table.from_batches(batches).combine_chunks()
    arrays = [table.column(f.name).cast(f.type) for f in STORED]
    return pa.Table.from_arrays(arrays, schema=STORED).combine_chunks()


def _ascending(keys: pa.ChunkedArray) -> bool:
    """True if ``keys`` never decrease (the order bisecting the directory relies on)."""
    if len(keys) < 2:
        return True
    return not pc.any(pc.less(keys[1:], keys[:-1])).as_py()


def input_digests(cas: ContentStore, manifest_digest: str) -> dict[str, Any]:
    """What an index's rows are a function of (with this code): the digests of the snapshot's
    members, dedup clusters and spans tables (or parts documents), and of its packed shards."""
    manifest = read_manifest(cas, manifest_digest)
    dedup = load_index(cas, manifest.layers["dedup_clusters"], "dedup_clusters")
    packed = load_index(cas, manifest.layers["packed_blocks"], "packed_blocks")
    return {
        "members": manifest.members.digest,
        "clusters": dedup.output("clusters")["digest"],
        "spans": packed.output("spans")["digest"],
        "shards": [ref["digest"] for ref in packed.outputs.get("shards", [])],
    }


def inputs(cas: ContentStore, manifest_digest: str, catalog: Catalog | None = None) -> Inputs:
    """The snapshot's members, dedup clusters (parts in order) and spans as verified CAS files;
    with the ``catalog``, a file unchanged since it last hashed right (a parent's tables, which
    its check hashed) is not hashed again, and one hashed now is recorded (the check trusts it)."""
    digests = input_digests(cas, manifest_digest)
    manifest = read_manifest(cas, manifest_digest)
    dedup = load_index(cas, manifest.layers["dedup_clusters"], "dedup_clusters")
    clusters = PartedTable.read(cas, dedup.output("clusters"), "clusters table")
    files = TrustedFiles(cas, catalog) if catalog is not None else cas_queries.VerifiedFiles(cas)
    relations: dict[str, Relation] = {"members": manifest.members.paths(files)}
    relations["clusters"] = clusters.paths(files, "clusters table")
    relations["spans"] = files.path(digests["spans"], "spans table")
    return Inputs(manifest_digest, relations, digests["shards"])


def readdressed(cas: ContentStore, directory: str, manifest_digest: str) -> str:
    """The index ``directory`` (its shards and any base) as another manifest's of the same
    inputs: a new directory naming it, nothing sorted or written again (an unchanged re-build)."""
    fanout, header = read_directory(cas, directory)
    return _put_directory(cas, fanout, {**header, "manifest": manifest_digest})


def build(
    cas: ContentStore,
    manifest_digest: str,
    shard_rows: int = SHARD_ROWS,
    base: tuple[str, str] | str = "no parent index named",
    catalog: Catalog | None = None,
    objects: list[str] | None = None,
) -> str:
    """The snapshot's index, sorted out of core from its verified CAS files (``inputs``), over
    ``base`` (the parent's manifest and index digests) when given, else whole (``base`` says
    why); the index directory's digest. ``objects``: ``Base.objects`` (the same bytes)."""
    over = None
    if isinstance(base, tuple):
        parent, index = base
        over = Base(index, read_header(cas, index), inputs(cas, parent, catalog), objects)
    found = inputs(cas, manifest_digest, catalog)
    extra = {} if over else {"full": base}
    return _put(cas, found, shard_rows, over, extra)


def build_tables(
    cas: ContentStore,
    manifest_digest: str,
    members: pa.Table,
    clusters: pa.Table | None,
    spans: pa.Table | None,
    shards: list[str],
    shard_rows: int = SHARD_ROWS,
    base: Base | None = None,
) -> str:
    """``build`` over tables in memory (tests and the bench): the same query and bytes."""
    relations = {"members": members, "clusters": clusters, "spans": spans}
    found = Inputs(manifest_digest, relations, shards)
    return _put(cas, found, shard_rows, base, {} if base else {"full": "no parent index named"})


def _put(
    cas: ContentStore,
    found: Inputs,
    shard_rows: int,
    base: Base | None,
    extra: dict[str, Any],
) -> str:
    """The shards, then the directory naming them; its digest."""
    fanout, rows, span_columns, added = put_shards(
        cas, found.manifest, found.relations, found.shards, shard_rows, base
    )
    header = {
        "schema": SCHEMA,
        "manifest": found.manifest,
        "code": CODE,
        "spanColumns": span_columns,
        "rows": rows,
        "shards": found.shards,
        **added,
        **({} if "base" in added else extra),
    }
    columns = [pa.array([shard[i] for shard in fanout], pa.string()) for i in range(3)]
    return _put_directory(cas, pa.Table.from_arrays(columns, schema=FANOUT), header)


def _put_directory(cas: ContentStore, fanout: pa.Table, header: dict[str, Any]) -> str:
    """The directory object: the fanout table with the header in its schema metadata."""
    schema = FANOUT.with_metadata({HEADER: json.dumps(header, sort_keys=True)})
    sink = io.BytesIO()  # Arrow IPC bytes are a function of the table, like pinned Parquet
    with ipc.new_file(sink, schema) as writer:
        writer.write_table(pa.Table.from_arrays(fanout.columns, schema=schema))
    return put_bytes(cas, sink.getvalue())["digest"]


def read_directory(cas: ContentStore, digest: str) -> tuple[pa.Table, dict[str, Any]]:
    """A directory's fanout table and header, verified by its digest."""
    data = cas.get_bytes(digest, "deletion index")
    try:
        fanout = ipc.open_file(pa.BufferReader(data)).read_all()
        header = json.loads((fanout.schema.metadata or {})[HEADER])
    except (pa.ArrowInvalid, KeyError, ValueError) as error:
        raise DeletionIndexError(
            f"deletion index {digest} is not a {SCHEMA} directory: {error}"
        ) from None
    return fanout, header


def read_header(cas: ContentStore, digest: str) -> dict[str, Any]:
    return read_directory(cas, digest)[1]
