"""The deletion index's bytes: its keys and rows, the DuckDB passes that sort them, the shards
and the directory (``deletion_index`` reads them).

One row per (key, fact), keyed by the target first so that everything one tombstone needs is
adjacent, usually in one shard:

- ``<kind>/<target>/carried``: a removed duplicate (verdict, kept representative, match);
- ``<kind>/<target>/member``: a member (its record id);
- ``<kind>/<target>/spans``: every packed span of those members and representatives, so a
  group or object whose records are scattered over the record-id order is one read, not one
  per record;
- ``span/<record id>``: a record's packed spans (for callers asking about one record).

The build streams and its memory is bounded: DuckDB reads the inputs (verified CAS files, or
tables a test registers), and makes one pass per kind, then one for the ``span`` rows. A pass
first stages its rows (a join and a DISTINCT) in a table of a database file in the spill
directory, then sorts them by every column, so that each statement holds one large operator
under ``MEMORY_MB`` and spills beyond it (one statement doing both ran out of memory at 256 MB
on a million members, an in-memory staging table at 128 MB on three million); a build peaks
at ~400 MB RSS at 1M and at 3M members. As every key begins with its
kind, or ``span`` after every kind, the passes' concatenation is sorted; it is cut into
Parquet shards of ``SHARD_ROWS`` rows as it arrives, so the bytes depend on the rows alone.
The directory lists each shard's first and last key and digest as an Arrow IPC table (a
lookup decodes it without parsing), its header (schema, manifest, ``CODE``) in the metadata.
"""

import io
import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layers import load_index
from corpus_assets.core.storage import duck
from corpus_assets.core.storage.artifacts import get_json, put_bytes, put_table
from corpus_assets.core.storage.cas import ContentStore

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

CODE = stage_code("governance.deletion_index", __name__)  # the builder's closure, not the reader's
SCHEMA = "corpus.deletion-index.v2"
SHARD_ROWS = 1 << 12  # ~35 KB of Parquet: a lookup hashes and decodes one or two
FANOUT = pa.schema([("first", pa.string()), ("last", pa.string()), ("digest", pa.string())])
HEADER = b"corpus.deletion-index"  # the directory's metadata key holding its JSON header
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
        ("shard", pa.string()),  # the packed shard's digest (sorted by its number)
        ("block", pa.int64()),
        ("start", pa.int64()),
        ("end", pa.int64()),
    ]
)
SQL_TYPES = {"key": "VARCHAR", "record_id": "VARCHAR", "verdict": "VARCHAR"}
SQL_TYPES |= {"representative_id": "VARCHAR", "match_id": "VARCHAR", "match_jaccard": "DOUBLE"}
SQL_TYPES |= {c: "BIGINT" for c in ("record_offset", "shard", "block", "start", "end")}
MEMORY_MB, THREADS = 128, 2  # DuckDB's cap (the process: ~400 MB at 1M and 3M members)
BATCH_ROWS = 1 << 16  # sorted rows fetched from DuckDB at a time
Relation = str | pa.Table | None  # a Parquet file's path, a table in memory, or absent
Shard = tuple[str, str, str]  # its first key, last key and digest


class DeletionIndexError(RuntimeError):
    """An index that cannot be built as asked, or a directory that does not describe the
    snapshot it was looked up for."""


def member_key(kind: str, target: str) -> str:
    return SEP.join((kind, target, "member"))


def carried_key(kind: str, target: str) -> str:
    return SEP.join((kind, target, "carried"))


def reach_key(kind: str, target: str) -> str:
    """The packed spans of every member and carrying representative the target names."""
    return SEP.join((kind, target, "spans"))


def span_key(record_id: str) -> str:
    return SEP.join(("span", record_id))


def put_shards(
    cas: ContentStore,
    what: str,
    relations: dict[str, Relation],
    packed_shards: list[str],
    shard_rows: int,
) -> tuple[list[Shard], int, list[str]]:
    """Sort the rows of the ``members``, ``clusters`` and ``spans`` relations, put them in the
    CAS in shards of ``shard_rows``; (first key, last key, digest) a shard, rows, span columns."""
    spilling = duck.Spilling(cas.root.parent / "tmp", f"{MEMORY_MB}MB", THREADS)
    with spilling as con:
        con.execute("SET enable_progress_bar = false")  # a long sort drew one on stdout
        # staged rows go to a database file (removed with the spill directory): an in-memory
        # table of a pass ran out of memory at 128 MB on 3M members, a file's blocks are evicted
        con.execute(f"ATTACH {duck.sql_path(str(spilling.dir / 'staged.duckdb'))} AS staging")
        columns = _relations(con, relations)
        _check_shard_numbers(con, what, columns["spans"], len(packed_shards))
        con.execute(_span_rows(columns["spans"]))
        digests = pa.array(packed_shards, pa.string())
        fanout, rows = _put_sorted(cas, what, _passes(con, columns), shard_rows, digests)
    return fanout, rows, [c for c in SPANS if c in columns["spans"]]


def _relations(con: "DuckDBPyConnection", relations: dict[str, Relation]) -> dict[str, list[str]]:
    """Each input as a view or registered table; the columns of each (none if absent)."""
    for name, relation in relations.items():
        if isinstance(relation, str):
            con.execute(
                f"CREATE VIEW {name} AS SELECT * FROM read_parquet({duck.sql_path(relation)})"
            )
        elif relation is not None:
            con.register(name, relation)
    return {
        name: _columns(con, name) if relations.get(name) is not None else []
        for name in ("members", "clusters", "spans")
    }


def _put_sorted(
    cas: ContentStore,
    what: str,
    batches: Iterable[pa.RecordBatch],
    shard_rows: int,
    digests: pa.Array,
) -> tuple[list[Shard], int]:
    """The sorted stream put in the CAS shard by shard; each shard's bounds and digest."""
    fanout: list[Shard] = []
    rows = 0
    for part in _cut(batches, shard_rows, digests):
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


def _span_rows(span_columns: list[str]) -> str:
    """The ``spanrows`` view: the spans' ``SPANS`` columns (an absent one null)."""
    names = ", ".join(f'"{c}"' for c in SPANS)
    picked = [f'"{c}"' if c in span_columns else "NULL" for c in SPANS]
    source = f"SELECT {', '.join(picked)} FROM spans" if span_columns else _empty(SPANS)
    return f"CREATE TEMP VIEW spanrows ({names}) AS {source}"


def _passes(con: "DuckDBPyConnection", columns: dict[str, list[str]]) -> Iterator[pa.RecordBatch]:
    """Every row, sorted: each pass staged into a table on disk, then streamed in order."""
    fields = ", ".join(f'"{f.name}"' for f in ROWS)
    order = ", ".join(f'"{f.name}" ASC NULLS FIRST' for f in ROWS)
    typed = ", ".join(f'CAST(NULL AS {SQL_TYPES[f.name]}) AS "{f.name}"' for f in ROWS)
    spans = ", ".join(f'"{c}"' for c in SPANS)
    last = f"SELECT 'span' || chr(0) || record_id AS key, {spans} FROM spanrows"
    for query in [*(_kind_rows(kind, columns) for kind in sorted(COLUMN)), last]:
        con.execute(
            f"CREATE OR REPLACE TABLE staging.staged AS SELECT {fields} FROM (SELECT {typed} "
            f"WHERE false UNION ALL BY NAME (SELECT * FROM ({query}) WHERE key IS NOT NULL))"
        )
        yield from duck.batches(con, f"SELECT * FROM staging.staged ORDER BY {order}", BATCH_ROWS)
    con.execute("DROP TABLE IF EXISTS staging.staged")


def _kind_rows(kind: str, columns: dict[str, list[str]]) -> str:
    """The member, carried and spans rows of one kind's targets (a null target names nothing,
    its key is null)."""
    col = COLUMN[kind]
    if col not in columns["members"]:
        return "SELECT NULL AS key"

    def key(target: str, fact: str) -> str:
        return f"'{kind}' || chr(0) || CAST({target} AS VARCHAR) || chr(0) || '{fact}' AS key"

    parts = [f"SELECT {key('m.' + col, 'member')}, m.record_id FROM members m"]
    reached = (
        f"SELECT m.{col} AS target, m.record_id AS rid FROM members m WHERE m.{col} IS NOT NULL"
    )
    if "verdict" in columns["clusters"] and col in columns["clusters"]:  # else: before near-dedup
        duplicates = f"c.verdict IN ({', '.join(repr(d) for d in DUPLICATES)})"
        carried = ", ".join(f"c.{c}" for c in CARRIED)
        parts.append(
            f"SELECT {key('c.' + col, 'carried')}, {carried} FROM clusters c WHERE {duplicates}"
        )
        reached += (
            f" UNION ALL SELECT c.{col}, c.representative_id FROM clusters c WHERE {duplicates}"
            f" AND c.{col} IS NOT NULL AND c.representative_id IS NOT NULL"
        )
    if columns["spans"]:
        spans = ", ".join(f's."{c}"' for c in SPANS)
        parts.append(
            f"SELECT {key('r.target', 'spans')}, {spans} FROM spanrows s JOIN "
            f"(SELECT DISTINCT target, rid FROM ({reached})) r ON s.record_id = r.rid"
        )
    return " UNION ALL BY NAME ".join(f"({p})" for p in parts)


def _empty(names: list[str]) -> str:
    return "SELECT " + ", ".join(f'NULL AS "{n}"' for n in names) + " WHERE false"


def _cut(batches: Iterable[pa.RecordBatch], rows: int, digests: pa.Array) -> Iterator[pa.Table]:
    """The stream as contiguous tables of exactly ``rows`` rows (the last may be shorter) in
    ``ROWS``'s types, however DuckDB chunked it: the shard bytes depend on the rows alone."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        while batch.num_rows:
            take = min(rows - count, batch.num_rows)
            held.append(batch.slice(0, take))
            batch, count = batch.slice(take), count + take
            if count == rows:
                yield _typed(held, digests)
                held, count = [], 0
    if count:
        yield _typed(held, digests)


def _typed(batches: list[pa.RecordBatch], digests: pa.Array) -> pa.Table:
    """One contiguous table in ``ROWS``'s types, each shard number replaced by its digest."""
    table = pa.Table.from_batches(batches).combine_chunks()
    arrays = [
        pc.take(digests, table.column(f.name)) if f.name == "shard" else table.column(f.name)
        for f in ROWS
    ]
    return pa.Table.from_arrays(
        [a.cast(f.type) for a, f in zip(arrays, ROWS, strict=True)], schema=ROWS
    ).combine_chunks()


def _ascending(keys: pa.ChunkedArray) -> bool:
    """True if ``keys`` never decrease (the order bisecting the directory relies on)."""
    if len(keys) < 2:
        return True
    return not pc.any(pc.less(keys[1:], keys[:-1])).as_py()


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
