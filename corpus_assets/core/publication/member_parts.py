"""The members table as parts: one Parquet table per canonical chunk holding members.

A member row is a function of its chunk's records (the narrowed table), the dedup clusters
row that made it a representative and its splits row. A +1% child keeps most chunks and most
verdicts and splits, so its members table is mostly its parent's: stored as one table it would
be joined, sorted and written whole (3 CPU-s at 1.1 GB of raw text) for a handful of changed
rows, and every reader diffing two snapshots (shadow diff, deletion index) would read both
whole. As parts, a child names its parent's part for every chunk whose rows are unchanged, and
two snapshots share the digests of every such part.

The manifest's ``members`` entry names a ``MemberParts`` document (chunk key, the chunk's
records digest, the part's digest, size and row count), in the canonical index's chunk order;
each part is sorted by record id. The document records this module's code identity
(``MEMBERS_CODE``): a part is reused only under the code that wrote it.
"""

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.publication import manifest_queries
from corpus_assets.core.publication.narrowed import NARROW
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.snapshot_manifest import (
    MEMBER_PARTS_SCHEMA,
    MemberPart,
    MemberParts,
    MembersEntry,
)
from corpus_assets.core.storage import cas_queries
from corpus_assets.core.storage.artifacts import Ref, get_table, put_json
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import sql_path
from corpus_assets.core.storage.parquet_sink import put_table_batches

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
JOIN (SELECT record_id, object, line, dedup_key FROM read_parquet('{clusters}')
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
    """The parts document's ref, the member count and the first rows."""

    ref: Ref
    count: int
    preview: list[dict[str, Any]] = field(default_factory=list)


def put_member_parts(
    cas: ContentStore, chunks: list[Chunk], clusters: str, splits: str, tmp: Path
) -> Written:
    """Join every chunk's records with their verdicts and splits (DuckDB, out of core, sorted
    by chunk then record id) and put each chunk's members as its part (an empty table for a
    chunk without members; one empty part named "" when there is no chunk); the parts
    document."""
    chunks = chunks or [Chunk("", "", "")]
    refs: dict[int, tuple[Ref, int]] = {}
    preview: list[dict[str, Any]] = []
    with manifest_queries.connect(
        cas, manifest_queries.MEMBERS_THREADS, manifest_queries.MEMBERS_MB
    ) as con:
        query = MEMBERS_QUERY.format(
            records=_numbered(chunks, tmp), clusters=clusters, splits=splits
        )
        batches = cas_queries.batches(con, query, MEMBER_BATCH)
        for number, rows in itertools.groupby(_by_part(batches), key=lambda pair: pair[0]):
            seen = _Seen(preview)
            ref = put_table_batches(cas, MEMBERS_SCHEMA, seen.watch(b for _, b in rows), tmp)
            refs[number] = (ref, seen.count)
    empty = None
    parts = []
    for number, chunk in enumerate(chunks):
        if number not in refs:
            empty = empty or put_table_batches(cas, MEMBERS_SCHEMA, [], tmp)
        ref, count = refs.get(number, (empty, 0))
        parts.append(_part(chunk, ref, count))
    return _put_document(cas, parts, preview)


def _numbered(chunks: list[Chunk], tmp: Path) -> str:
    """The chunks' narrowed rows, each with its chunk's number (``part``)."""
    empty = tmp / "none.parquet"  # a chunk without a narrowed table (no chunk at all)
    if not all(c.narrowed for c in chunks):
        pq.write_table(NARROW.empty_table(), empty)
    return " UNION ALL ".join(
        f"SELECT {n} AS part, * FROM read_parquet({sql_path(c.narrowed or str(empty))})"
        for n, c in enumerate(chunks)
    )


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


def _part(chunk: Chunk, ref: Ref, count: int) -> MemberPart:
    return MemberPart(
        chunk=chunk.key,
        records=chunk.records,
        digest=ref["digest"],
        media=ref["media"],
        size=ref["size"],
        count=count,
    )


def _put_document(cas: ContentStore, parts: list[MemberPart], preview: list) -> Written:
    count = sum(part.count for part in parts)
    document = MemberParts(
        schema=MEMBER_PARTS_SCHEMA, code=MEMBERS_CODE, count=count, parts=parts
    ).document()
    ref = put_json(cas, document)
    return Written(ref, count, preview)


class _Seen:
    """The row count of a stream of batches and the first rows of the whole table, taken as
    it passes."""

    def __init__(self, preview: list[dict[str, Any]]) -> None:
        self.count = 0
        self.preview = preview

    def watch(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if len(self.preview) < PREVIEW_ROWS:
                self.preview += batch.slice(0, PREVIEW_ROWS - len(self.preview)).to_pylist()
            self.count += batch.num_rows
            yield batch


def read_members(cas: ContentStore, members: MembersEntry | dict[str, Any]) -> pa.Table:
    """The whole members table in memory, parts concatenated in order, each verified: for
    small snapshots (tests, the self-test, an audit's few rows) - builds stream instead."""
    entry = members if isinstance(members, MembersEntry) else MembersEntry.model_validate(members)
    return pa.concat_tables([get_table(cas, ref, "members table") for ref in entry.part_refs(cas)])
