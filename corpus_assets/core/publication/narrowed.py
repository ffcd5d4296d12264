"""Canonical chunks narrowed for the members table: their record fields and text lengths.

A chunk's narrowed table is a function of its records file and this module's code alone, so its
code identity (``NARROW_CODE``) is this module's small import closure: a change elsewhere in the
release stage does not make every child decode its parent's texts again.
"""

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.publication.manifest_queries import batch_rows
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.cas import CorruptObjectError
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.storage.digests import json_digest
from corpus_assets.core.storage.memory import release_memory
from corpus_assets.core.storage.parquet_sink import put_table_batches

RECORD_FIELDS = ["record_id", "source_id", "object", "line", "record_digest"]
NARROW = pa.schema(
    [
        ("record_id", pa.string()),
        ("source_id", pa.string()),
        ("object", pa.string()),
        ("line", pa.int64()),
        ("record_digest", pa.string()),
        ("text_bytes", pa.int32()),
    ]
)
NARROW_CODE = stage_code("release.members", __name__)  # what makes a narrowed chunk
NARROWED = "manifest.narrowed"  # the layer memo rows of narrowed chunks (a side cache)


def narrowed(
    ws: Workspace, files: VerifiedFiles, canonical: CanonicalIndex, tmp: Path
) -> list[str]:
    """Each canonical chunk's records without their text (``NARROW``), as verified CAS files.
    A chunk's narrowed table is a function of its records file and this code: remembered in the
    layer memo table, so a child snapshot decodes the texts of its new chunks only.
    They are a side cache (``NARROWED``), outside every snapshot's closure: one that fails its
    re-hash is not used, the chunk is narrowed again into a scratch file."""
    paths = []
    for n, chunk in enumerate(canonical.chunks()):
        key = json_digest(
            {"table": NARROWED, "code": NARROW_CODE, "records": chunk.records["digest"]}
        )
        hit = ws.catalog.memo(key)
        try:
            if hit is not None and ws.cas.contains(hit[0]):
                paths.append(files.path(hit[0], f"narrowed {chunk.what}"))
                continue
        except CorruptObjectError:
            scratch = tmp / f"narrowed-{n}.parquet"
            with pq.ParquetWriter(scratch, NARROW, compression="zstd") as writer:
                for batch in _narrow_chunk(files.path(chunk.records["digest"], chunk.what)):
                    writer.write_batch(batch)
            paths.append(str(scratch))
            continue
        records = files.path(chunk.records["digest"], chunk.what)
        digest = put_table_batches(ws.cas, NARROW, _narrow_chunk(records), tmp)["digest"]
        ws.catalog.remember(key, NARROWED, digest, "{}")
        release_memory()  # the chunk's decoded texts: Arrow's pool would keep their pages
        paths.append(files.path(digest, f"narrowed {chunk.what}"))
    return paths


def _narrow_chunk(path: str) -> Iterator[pa.RecordBatch]:
    """A chunk's record fields and the UTF-8 length of each text, a batch at a time (the text
    is most of a record, and only its length is a member fact)."""
    with pq.ParquetFile(path, buffer_size=1 << 20) as source:
        rows = batch_rows(source, "text")
        for batch in source.iter_batches(rows, columns=[*RECORD_FIELDS, "text"], use_threads=False):
            yield _without_text(batch, NARROW)


def _without_text(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """The batch's record fields and the UTF-8 byte length of its text."""
    lengths = pc.binary_length(pc.cast(batch.column("text"), pa.binary()))
    columns = [*batch.select(RECORD_FIELDS).columns, pc.cast(lengths, pa.int32())]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
