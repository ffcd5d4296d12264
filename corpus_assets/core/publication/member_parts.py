"""The members table as parts: one Parquet table per canonical chunk holding members.

A member row is a function of its chunk's records (the narrowed table), the dedup clusters
row that made it a representative and its splits row. A +1% child keeps most chunks and most
verdicts and splits, so its members table is mostly its parent's: stored as one table it would
be joined, sorted and written whole (3 CPU-s at 1.1 GB of raw text) for a handful of changed
rows, and every reader diffing two snapshots (shadow diff, deletion index) would read both
whole. As parts, a child names its parent's part for every chunk whose rows are unchanged, and
two snapshots share the digests of every such part.

The manifest's ``members`` entry names a ``ChunkParts`` document (chunk key, the chunk's
records digest, the part's digest, size and row count), in the canonical index's chunk order;
each part is sorted by record id. The document records this module's code identity
(``MEMBERS_CODE``): a part is reused only under the code that wrote it.
"""

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.publication import manifest_queries
from corpus_assets.core.publication.narrowed import NARROW
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import (
    MEMBER_PARTS_SCHEMA,
    ChunkPart,
    ChunkParts,
    MembersEntry,
)
from corpus_assets.core.storage import cas_queries
from corpus_assets.core.storage.artifacts import Ref, get_table, put_json
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import sql_list, sql_path
from corpus_assets.core.storage.parquet_sink import put_table_batches

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

MEMBERS_CODE = stage_code("release.member_parts", __name__)  # what writes a part's bytes
MEMBER_BATCH = 65536  # rows of the joined members read and written at a time
PREVIEW_ROWS = 10  # the first rows a layer result shows

MEMBERS_SCHEMA = pa.schema(
    [
        ("record_id", pa.string()),
        ("source_id", pa.string()),
        ("object", pa.string()),
        ("line", pa.int64()),
        ("record_digest", pa.string()),
        ("dedup_key", pa.string()),
        ("text_bytes", pa.int32()),
        ("group_id", pa.string()),
        ("split", pa.string()),
    ]
)
MEMBERS_QUERY = """
SELECT r.part, r.record_id, r.source_id, r.object, r.line, r.record_digest, c.dedup_key,
       r.text_bytes, s.group_id, s.split
FROM ({records}) r
JOIN (SELECT record_id, object, line, dedup_key FROM {clusters}
      WHERE is_representative) c USING (record_id, object, line)
JOIN read_parquet('{splits}') s USING (record_id)
ORDER BY r.part, r.record_id, r.object, r.line
"""


@dataclass(frozen=True)
class Chunk:
    """A canonical chunk as the members see it: its key, records digest and narrowed table."""

    key: str
    records: str
    narrowed: str


@dataclass
class Written:
    """The parts document's ref, the member count, the first rows and how many parts were
    joined now (the others are a parent's)."""

    ref: Ref
    count: int
    preview: list[dict[str, Any]] = field(default_factory=list)
    joined: int = 0


@dataclass(frozen=True)
class Parent:
    """A parent snapshot's members parts (by chunk key) and the clusters and splits tables
    they were joined from: the clusters table as a DuckDB FROM item over its verified files
    (one table or chunk parts, ``PartedTable.relation``), the splits table's verified file."""

    parts: dict[str, ChunkPart]
    clusters: str
    splits: str
    # the keys of the chunks whose clusters part the child's and the parent's parts documents
    # share (``same_clusters_parts``); None: either table is stored whole
    clusters_same: frozenset[str] | None = None


def same_clusters_parts(child: PartedTable, parent: PartedTable) -> frozenset[str] | None:
    """The keys of the chunks whose clusters part is the same object (and the same records)
    in both tables, or None when either is stored whole. A chunk's members are joined from
    its own clusters part alone (``MEMBERS_QUERY`` joins on the record's object and line,
    which are its chunk's), so a shared part leaves only the splits rows to compare."""
    if child.counts is None or parent.counts is None:
        return None
    theirs = {(part.chunk, part.records): part.digest for part in parent.parts}
    return frozenset(
        part.chunk for part in child.parts if theirs.get((part.chunk, part.records)) == part.digest
    )


# The record ids whose splits rows differ between the two snapshots, staged in
# ``splits_changed``: a full join on the id (at 1.1 GB ~0.2 CPU-s, the multiset difference's
# aggregate over three strings ~0.45) grouped by the changed id (one NULL group for the rest),
# counting each side's rows. It is that difference exactly when every id both tables hold is
# once in each: then the join gives each side's rows once, so the counts equal the tables'.
SPLITS_JOINED = """
CREATE OR REPLACE TEMP TABLE splits_changed AS
SELECT CASE WHEN c.here AND p.here AND c.group_id IS NOT DISTINCT FROM p.group_id
                 AND c.split IS NOT DISTINCT FROM p.split THEN NULL
            ELSE coalesce(c.record_id, p.record_id) END AS record_id,
       count(c.here) AS child_rows, count(p.here) AS parent_rows
FROM (SELECT record_id, group_id, split, true AS here FROM read_parquet({splits})) c
FULL JOIN (SELECT record_id, group_id, split, true AS here FROM read_parquet({parent_splits})) p
USING (record_id) GROUP BY 1
"""
SPLITS_COUNTED = """
SELECT coalesce(sum(child_rows), 0) = (SELECT count(*) FROM read_parquet({splits}))
   AND coalesce(sum(parent_rows), 0) = (SELECT count(*) FROM read_parquet({parent_splits}))
FROM splits_changed
"""
# else (an id repeated): the exact multiset difference
SPLITS_DIFFERENCE = """
CREATE OR REPLACE TEMP TABLE splits_changed AS SELECT record_id FROM
    (SELECT record_id, group_id, split, 1 AS side FROM read_parquet({splits})
     UNION ALL
     SELECT record_id, group_id, split, -1 FROM read_parquet({parent_splits}))
GROUP BY record_id, group_id, split HAVING sum(side) <> 0
"""
# then the (source, object) of the child's representatives among them
_SPLITS_CHANGED = """
     splits AS (SELECT record_id FROM splits_changed WHERE record_id IS NOT NULL)
SELECT source_id, object FROM child SEMI JOIN splits USING (record_id)
"""
TOUCHED = (
    """
CREATE TEMP TABLE touched AS
WITH child AS (SELECT source_id, object, record_id, line, dedup_key
               FROM {clusters} WHERE is_representative),
     parent AS (SELECT source_id, object, record_id, line, dedup_key
                FROM {parent_clusters} WHERE is_representative),
     verdicts AS (SELECT source_id, object FROM
                  (SELECT *, 1 AS side FROM child UNION ALL SELECT *, -1 FROM parent)
                  GROUP BY source_id, object, record_id, line, dedup_key
                  HAVING sum(side) <> 0),"""
    + _SPLITS_CHANGED
    + "UNION SELECT source_id, object FROM verdicts"
)
# The same when both clusters tables are parts and only chunks whose part the two share are
# candidates (``Parent.clusters_same``): only the splits tables are compared.
TOUCHED_BY_SPLITS = (
    """
CREATE TEMP TABLE touched AS
WITH child AS (SELECT source_id, object, record_id FROM {clusters}
               WHERE is_representative),"""
    + _SPLITS_CHANGED
)


def put_member_parts(
    cas: ContentStore,
    chunks: list[Chunk],
    clusters: str,
    splits: str,
    tmp: Path,
    parent: Parent | None = None,
) -> Written:
    """Join every chunk's records with their verdicts and splits (DuckDB, out of core, sorted
    by chunk then record id) and put each chunk's members as its part (an empty table for a
    chunk without members; one empty part named "" when there is no chunk); the parts
    document. ``clusters`` is a DuckDB FROM item over the dedup clusters table (one table or
    chunk parts: ``PartedTable.relation``), ``splits`` the splits table's file. With a
    ``parent``, a chunk whose rows the joins give unchanged (``reusable``) is its parent's
    part, not joined again."""
    chunks = chunks or [Chunk("", "", "")]
    with manifest_queries.connect(
        cas, manifest_queries.MEMBERS_THREADS, manifest_queries.MEMBERS_MB
    ) as con:
        reused = reusable(con, chunks, clusters, splits, parent, tmp) if parent else {}
        todo = [n for n, chunk in enumerate(chunks) if n not in reused]
        written = _join(con, cas, chunks, todo, clusters, splits, tmp)
    empty = None
    parts = []
    for number, chunk in enumerate(chunks):
        if number in reused:
            parts.append(reused[number])
            continue
        if number not in written:
            empty = empty or put_table_batches(cas, MEMBERS_SCHEMA, [], tmp)
        ref, count = written.get(number, (empty, 0))
        parts.append(_part(chunk, ref, count))
    written_now = _put_document(cas, parts, _preview(cas, parts))
    written_now.joined = len(todo)
    return written_now


def reusable(
    con: "DuckDBPyConnection",
    chunks: list[Chunk],
    clusters: str,
    splits: str,
    parent: Parent,
    tmp: Path,
) -> dict[int, ChunkPart]:
    """The parent's part of each chunk (by number) whose members rows are the parent's: the
    same records table, and no (source, object) of it among the rows where the two snapshots'
    representatives (clusters) or splits rows differ. Multiset differences over the whole
    tables, out of core; if DuckDB runs out of memory, nothing is reused (the same bytes).
    When both clusters tables are parts, a chunk whose clusters part differs (or is new) is
    joined, and for the others only the splits tables are compared."""
    import duckdb

    shared = parent.clusters_same
    same = {
        n: parent.parts[c.key]
        for n, c in enumerate(chunks)
        if c.key in parent.parts
        and parent.parts[c.key].records == c.records
        and c.narrowed
        and (shared is None or c.key in shared)
    }
    if not same:
        return {}
    named = {"clusters": clusters, "parent_clusters": parent.clusters}
    named |= {"splits": sql_path(splits), "parent_splits": sql_path(parent.splits)}
    touched_sql = TOUCHED if shared is None else TOUCHED_BY_SPLITS
    try:
        _splits_changed(con, named)
        con.execute(touched_sql.format(**named))
        numbered = _numbered([chunks[n] for n in same], tmp, list(same))
        rows = con.execute(
            f"SELECT DISTINCT part FROM ({numbered}) SEMI JOIN touched USING (source_id, object)"
        ).fetchall()
        touched = {part for (part,) in rows}
    except duckdb.OutOfMemoryException:
        return {}
    finally:
        con.execute("DROP TABLE IF EXISTS touched")
        con.execute("DROP TABLE IF EXISTS splits_changed")
    return {n: part for n, part in same.items() if n not in touched}


def _splits_changed(con: "DuckDBPyConnection", paths: dict[str, str]) -> str:
    """Stage ``splits_changed``: the ids whose splits rows differ between the child's and the
    parent's table, by the join when it proves them exact, else by the multiset difference;
    which of the two ran."""
    con.execute(SPLITS_JOINED.format(**paths))
    if con.execute(SPLITS_COUNTED.format(**paths)).fetchall()[0][0]:
        return "joined"
    con.execute(SPLITS_DIFFERENCE.format(**paths))
    return "difference"


def _join(
    con: "DuckDBPyConnection",
    cas: ContentStore,
    chunks: list[Chunk],
    todo: list[int],
    clusters: str,
    splits: str,
    tmp: Path,
) -> dict[int, tuple[Ref, int]]:
    """Each ``todo`` chunk's members put as a part: its ref and row count (a chunk without
    members has none); ``clusters`` a FROM item, ``splits`` a file (``put_member_parts``)."""
    if not todo:
        return {}
    records = _numbered([chunks[n] for n in todo], tmp, todo)
    query = MEMBERS_QUERY.format(records=records, clusters=clusters, splits=splits)
    written = {}
    batches = cas_queries.sorted_batches(con, query, tmp, MEMBER_BATCH)
    for number, rows in itertools.groupby(_by_part(batches), key=lambda pair: pair[0]):
        seen = _Seen()
        ref = put_table_batches(cas, MEMBERS_SCHEMA, seen.watch(b for _, b in rows), tmp)
        written[number] = (ref, seen.count)
    return written


def _preview(cas: ContentStore, parts: list[ChunkPart]) -> list[dict[str, Any]]:
    """The table's first rows (what a layer result shows), read from its first parts."""
    preview: list[dict[str, Any]] = []
    for part in parts:
        if len(preview) >= PREVIEW_ROWS:
            break
        if part.count:
            with pq.ParquetFile(cas.path(part.digest)) as table:
                batch = next(table.iter_batches(PREVIEW_ROWS - len(preview)))
            preview += batch.to_pylist()
    return preview


def _numbered(chunks: list[Chunk], tmp: Path, numbers: list[int] | None = None) -> str:
    """The chunks' narrowed rows, each with its chunk's number (``part``: ``numbers``, or
    its place in ``chunks``), by the scan's ``file_index``. One scan of every file: a union of
    one scan per chunk, or a ``filename`` column carried through the join, ran out of the
    128 MB cap at 1.1 GB of raw text."""
    numbers = numbers if numbers is not None else list(range(len(chunks)))
    empty = tmp / "none.parquet"  # a chunk without a narrowed table (no chunk at all)
    if not all(c.narrowed for c in chunks):
        pq.write_table(NARROW.empty_table(), empty)
    listed = sql_list([c.narrowed or str(empty) for c in chunks])
    return f"SELECT {numbers}[file_index::BIGINT + 1] AS part, * FROM read_parquet({listed})"


def _by_part(batches: Iterable[pa.RecordBatch]) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(part number, rows of that part in ``MEMBERS_SCHEMA``) cut where the number changes."""
    for batch in batches:
        numbers = np.asarray(batch.column(0).to_numpy(), dtype=np.int64)
        cuts = [0, *(np.flatnonzero(np.diff(numbers)) + 1).tolist(), len(numbers)]
        for lo, hi in itertools.pairwise(cuts):
            yield int(numbers[lo]), _typed(batch.slice(lo, hi - lo))


def _typed(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch of DuckDB's output in ``MEMBERS_SCHEMA``'s types."""
    columns = [batch.column(f.name).cast(f.type) for f in MEMBERS_SCHEMA]
    return pa.RecordBatch.from_arrays(columns, schema=MEMBERS_SCHEMA)


def _part(chunk: Chunk, ref: Ref, count: int) -> ChunkPart:
    return ChunkPart(
        chunk=chunk.key,
        records=chunk.records,
        digest=ref["digest"],
        media=ref["media"],
        size=ref["size"],
        count=count,
    )


def _put_document(
    cas: ContentStore, parts: list[ChunkPart], preview: list[dict[str, Any]]
) -> Written:
    count = sum(part.count for part in parts)
    document = ChunkParts(
        schema=MEMBER_PARTS_SCHEMA, code=MEMBERS_CODE, count=count, parts=parts
    ).document()
    ref = put_json(cas, document)
    return Written(ref, count, preview)


class _Seen:
    """The row count of a stream of batches, taken as it passes."""

    def __init__(self) -> None:
        self.count = 0

    def watch(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            self.count += batch.num_rows
            yield batch


def read_members(cas: ContentStore, members: MembersEntry | dict[str, Any]) -> pa.Table:
    """The whole members table in memory, parts concatenated in order, each verified: for
    small snapshots (tests, the self-test, an audit's few rows) - builds stream instead."""
    entry = members if isinstance(members, MembersEntry) else MembersEntry.model_validate(members)
    return pa.concat_tables([get_table(cas, ref, "members table") for ref in entry.part_refs(cas)])
