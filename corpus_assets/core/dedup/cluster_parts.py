"""The clusters table put as chunk parts: one Parquet part per canonical chunk, in chunk order.

A child keeps its parent's part for every chunk whose rows' decisions did not change
(:func:`.reuse.reused_parts`), so a +1% child writes its few changed chunks' parts, not the
whole table (at 1.1 GB of raw text: 8k of 685k rows, against 0.9 CPU-s for copying and writing
the rest). The joined rows of the other chunks arrive in table order and are cut at the chunks'
row counts (a chunk's rows are its positions). The edges' record ids are taken as the rows pass;
a kept part's are read from it. Readers go through
:class:`~corpus_assets.core.runtime.parted_table.PartedTable`.
"""

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

from corpus_assets.core.dedup.cluster_tasks import GatheredPart
from corpus_assets.core.dedup.clusters import CLUSTER_COLUMNS
from corpus_assets.core.dedup.edges import EdgeIds
from corpus_assets.core.dedup.reuse import Reuse
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.snapshot_manifest import CLUSTER_PARTS_SCHEMA, ChunkPart, ChunkParts
from corpus_assets.core.storage.artifacts import Ref, put_json
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import streamed
from corpus_assets.core.storage.parquet_sink import put_table_batches


def put_cluster_parts(
    cas: ContentStore,
    code: str,
    chunks: list[ChunkRecords],
    joined: Iterator[pa.RecordBatch],
    reuse: Reuse | None,
    edge_ids: EdgeIds,
    tmp: Path,
) -> Ref:
    """Every chunk's part (the parent's when ``reuse`` keeps it, else cut from ``joined``: the
    other chunks' rows in table order) and the parts document naming them."""
    rows = _Rows(joined)
    kept = reuse.parts if reuse is not None else {}
    parts = []
    for number, chunk in enumerate(chunks):
        part = kept.get(number)
        if part is not None:
            edge_ids.pass_part(part.count, lambda p=part: _ids(cas, p))
            parts.append(ChunkPart(**{**part.document(), "chunk": chunk.key}))
            continue
        batches = edge_ids.tap(rows.take(chunk.count))
        parts.append(
            _part(chunk, chunk.count, put_table_batches(cas, CLUSTER_COLUMNS, batches, tmp))
        )
    rows.done()
    return parts_document(cas, code, parts, tmp)


def gathered_parts(
    cas: ContentStore,
    code: str,
    chunks: list[ChunkRecords],
    gathered: list[GatheredPart],
    tmp: Path,
) -> Ref:
    """The parts document naming the parts the runner's gather tasks put, a chunk each."""
    parts = []
    for chunk, part in zip(chunks, gathered, strict=True):
        if part.count != chunk.count:
            raise ValueError(
                f"dedup clusters part of {chunk.what}: {part.count} rows, not {chunk.count}"
            )
        parts.append(_part(chunk, part.count, part.ref))
    return parts_document(cas, code, parts, tmp)


def _part(chunk: ChunkRecords, count: int, ref: Ref) -> ChunkPart:
    """The parts document's entry for a part written in this run: its chunk, the records its
    rows were read from, its rows and its file."""
    return ChunkPart(chunk=chunk.key, records=chunk.records["digest"], count=count, **ref)


def parts_document(cas: ContentStore, code: str, parts: list[ChunkPart], tmp: Path) -> Ref:
    """The parts document naming ``parts`` in chunk order; with no chunk at all, one empty part
    named "" (a reader always has a file)."""
    if not parts:
        ref = put_table_batches(cas, CLUSTER_COLUMNS, [], tmp)
        parts = [ChunkPart(chunk="", records="", count=0, **ref)]
    count = sum(part.count for part in parts)
    document = ChunkParts(schema=CLUSTER_PARTS_SCHEMA, code=code, count=count, parts=parts)
    return put_json(cas, document.document())


def _ids(cas: ContentStore, part: ChunkPart) -> Iterator[pa.RecordBatch]:
    """A kept part's record ids (verified), a batch at a time."""
    cas.verify(part.digest, "parent dedup clusters part")
    yield from streamed(cas.path(part.digest), columns=["record_id"])


class _Rows:
    """Rows of a batch stream handed out ``take(n)`` at a time, as batches."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self.batches = batches
        self.held: pa.RecordBatch | None = None

    def take(self, n: int) -> Iterator[pa.RecordBatch]:
        while n > 0:
            if self.held is None:
                self.held = next(self.batches, None)
                if self.held is None:
                    raise ValueError("dedup clusters: fewer joined rows than the chunks hold")
            batch, self.held = self.held.slice(0, n), self.held.slice(n)
            self.held = self.held if len(self.held) else None
            n -= len(batch)
            yield batch

    def done(self) -> None:
        """Every joined row was placed in a part (none left over)."""
        if self.held is not None or next(self.batches, None) is not None:
            raise ValueError("dedup clusters: joined rows left over after the last chunk's part")
