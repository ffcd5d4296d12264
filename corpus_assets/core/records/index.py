"""The canonical_records documents and their one reader.

The layer index lists one entry per raw object; each entry points at a chunk descriptor naming
the object's records tables (its pieces, in line order), its exclusions table and its account.
A piece holds at most ``PIECE_GROUPS`` row groups (65,536 records or 32 MB of text each), so
every later stage's task over a chunk - one piece - is bounded however large the object is,
and a large object's records are spread over several tasks. Every later stage reads canonical
records through ``CanonicalIndex`` (all records, or one chunk at a time), so the layout lives
here and nowhere else.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from corpus_assets.core.runtime.layer_index import LayerIndex, load_index, read_layer_index
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import Ref, get_json, get_parquet
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.digests import json_digest

LAYER = "canonical_records"
RECORD_SCHEMA = "corpus.record.v2"  # the record contract: envelope + payload kinds + columns
CHUNK_SCHEMA = "corpus.chunk.v3"  # v2 (one records table an object) is still read
PIECE_GROUPS = 4  # row groups a records piece holds at most: what one chunk task reads
RECORD_COLUMNS = pa.schema(
    [
        ("record_id", pa.string()),
        ("group_id", pa.string()),
        ("source_id", pa.string()),
        ("object", pa.string()),
        ("line", pa.int64()),
        ("byte_offset", pa.int64()),
        ("cdc_lsn", pa.string()),
        ("kind", pa.string()),
        ("adapter", pa.string()),
        ("lang", pa.string()),
        ("script", pa.string()),
        ("modality", pa.string()),
        ("licence", pa.string()),
        ("pii", pa.string()),
        ("event_time", pa.string()),
        ("record_digest", pa.string()),
        ("text_digest", pa.string()),
        ("dedup_key", pa.string()),
        ("payload", pa.string()),
        ("text", pa.string()),
    ]
)
EXCLUSION_COLUMNS = pa.schema(
    [
        ("object", pa.string()),
        ("line", pa.int64()),
        ("reason", pa.string()),
        ("detail", pa.string()),
    ]
)


def record_schema_digest() -> str:
    """Digest of the record contract, so a manifest names the exact schema its members follow."""
    return json_digest(
        {
            "schema": RECORD_SCHEMA,
            "kinds": ["document", "messages", "preference"],
            "columns": [[f.name, str(f.type)] for f in RECORD_COLUMNS],
        }
    )


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    def document(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)


class ChunkAccount(_Document):
    """Rows in = kept + quarantined + rejected for one raw object, by reason code."""

    rows_in: int
    kept: int
    quarantined: dict[str, int]
    rejected: dict[str, int]
    pii_redacted: dict[str, int]
    normalized: dict[str, int]
    chars_kept: int
    contaminated: dict[str, int] = {}  # records excluded per benchmark item id (ids, no text)


class ChunkPiece(_Document):
    """One records table of an object, and how many records it holds."""

    records: Ref
    count: int


class ChunkDescriptor(_Document):
    """What one chunk task produced: its records (v3: in pieces; v2: one table), its
    exclusions and their account."""

    chunk_schema: Literal["corpus.chunk.v2", "corpus.chunk.v3"] = Field(
        CHUNK_SCHEMA, alias="schema"
    )
    layer: Literal["canonical_records"] = LAYER
    records: Ref | None = None  # v2 only
    pieces: list[ChunkPiece] | None = None  # v3 only
    count: int
    excluded: Ref
    account: ChunkAccount

    @model_validator(mode="after")
    def _one_layout(self) -> "ChunkDescriptor":
        if self.chunk_schema == CHUNK_SCHEMA:
            if not self.pieces or self.records is not None:
                raise ValueError(f"{CHUNK_SCHEMA} names its records in pieces, and only so")
            held = sum(p.count for p in self.pieces)
            if held != self.count:
                raise ValueError(f"its pieces hold {held} records, its count says {self.count}")
        elif self.records is None or self.pieces is not None:
            raise ValueError(f"{self.chunk_schema} names one records table, and no pieces")
        return self

    def parts(self) -> list[ChunkPiece]:
        """The records tables in line order (a v2 descriptor's one table)."""
        if self.pieces is not None:
            return self.pieces
        assert self.records is not None  # _one_layout
        return [ChunkPiece(records=self.records, count=self.count)]

    def document(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


def piece_key(chunk: str, number: int) -> str:
    """The chunk key of an object's ``number``-th records piece: the first is the object's
    (``source/name``), the others ``source/name//number`` (no object's name holds ``//``)."""
    return chunk if number == 0 else f"{chunk}//{number}"


class ChunkEntry(_Document):
    """The index's entry for a chunk: task key, input digest, descriptor ref."""

    chunk: str
    input: str
    output: Ref


class DeadLetter(_Document):
    """A chunk whose task exhausted its retries; validation refuses while any is open."""

    chunk: str
    input: str
    error: str


@dataclass(frozen=True)
class ChunkRecords:
    """A chunk's records table, small enough to hand to a worker process."""

    key: str
    records: Ref
    count: int

    def stored_bytes(self) -> int:
        """The records table's size as stored: what a task over the chunk reads."""
        return int(self.records["size"])

    def table(self, cas: ContentStore, columns: list[str] | None = None) -> pa.Table:
        """The verified records, only ``columns`` decoded. The file is hashed as a stream and
        the columns read from it in place: holding a chunk's bytes (its texts) to decode a few
        narrow columns cost ~100 MB per chunk at 1.1 GB, and the heap kept it."""
        cas.verify(self.records["digest"], self.what)
        return pq.read_table(cas.path(self.records["digest"]), columns=columns)

    def texts(self, cas: ContentStore) -> list[str]:
        return self.table(cas, ["text"]).column("text").to_pylist()

    def parquet(self, cas: ContentStore) -> pq.ParquetFile:
        """The verified table as a Parquet file, for reading a batch of columns at a time."""
        return get_parquet(cas, self.records, self.what)

    @property
    def what(self) -> str:
        return f"records of {self.key}"


class CanonicalIndex:
    """The canonical_records index of one build, read through typed documents."""

    def __init__(self, cas: ContentStore, index: LayerIndex) -> None:
        if index.layer != LAYER:
            raise ValueError(f"a {index.layer} index is not a {LAYER} index")
        self.cas, self.index = cas, index
        self.entries = [ChunkEntry.model_validate(c) for c in index.output("chunks")]
        self.dead_letters = [DeadLetter.model_validate(d) for d in index.output("dead_letters")]

    @classmethod
    def read(cls, ws: Workspace, partition_key: str) -> tuple[Ref, "CanonicalIndex"]:
        ref, index = read_layer_index(ws, partition_key, LAYER)
        return ref, cls(ws.cas, index)

    @classmethod
    def load(cls, cas: ContentStore, ref: Ref | str) -> "CanonicalIndex":
        return cls(cas, load_index(cas, ref, LAYER))

    def descriptor(self, entry: ChunkEntry) -> ChunkDescriptor:
        return self.descriptor_at(self.cas, entry)

    @staticmethod
    def descriptor_at(cas: ContentStore, entry: ChunkEntry) -> ChunkDescriptor:
        """The typed descriptor an entry points at (also before its index is written)."""
        document = get_json(cas, entry.output, f"chunk {entry.chunk}")
        try:
            return ChunkDescriptor.model_validate(document)
        except ValidationError as error:
            raise ValueError(f"chunk {entry.chunk} descriptor is malformed: {error}") from None

    def chunks(self) -> list[ChunkRecords]:
        """Every records piece in index (source, object, line) order, each a chunk of the
        later stages; one descriptor read per object."""
        out = []
        for entry in self.entries:
            for n, piece in enumerate(self.descriptor(entry).parts()):
                out.append(ChunkRecords(piece_key(entry.chunk, n), piece.records, piece.count))
        return out

    def table(self, columns: list[str] | None = None) -> pa.Table:
        """All records in index (source, object, line) order; only ``columns`` are decoded."""
        tables = [chunk.table(self.cas, columns) for chunk in self.chunks()]
        if tables:
            return pa.concat_tables(tables)
        empty = RECORD_COLUMNS.empty_table()
        return empty.select(columns) if columns else empty

    def excluded_rows(self, source: str | None = None) -> Iterator[dict[str, Any]]:
        """Every exclusion row (location and reason, never text), chunk by chunk and a batch at
        a time, each chunk's table verified before it is read; only ``source``'s if given."""
        for entry in self.entries:
            source_id, _, name = entry.chunk.partition("/")
            if source is not None and source_id != source:
                continue
            what = f"exclusions of {entry.chunk}"
            table = get_parquet(self.cas, self.descriptor(entry).excluded, what)
            for batch in table.iter_batches(batch_size=4096):
                for row in batch.to_pylist():
                    yield {"source": source_id, "name": name, **row}
