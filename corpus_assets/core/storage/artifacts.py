"""Typed CAS artifacts: canonical JSON documents and Parquet tables, referenced by ``ref`` dicts.

A ref ``{"digest", "media", "size"}`` is the only way one artifact points at another; which
fields of a document hold refs is declared per document kind (``storage.refs``), so the verifier
and gc walk the closure of a manifest without taking data that looks like a ref for one.
"""

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from typing_extensions import TypedDict  # pydantic validates only this TypedDict on 3.11

from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.digests import canonical_json

JSON = "application/json"
PARQUET = "application/vnd.apache.parquet"
BINARY = "application/octet-stream"
NDJSON = "application/x-ndjson"
NPY = "application/x-npy"


class Ref(TypedDict):
    digest: str
    media: str
    size: int


def make_ref(digest: str, media: str, size: int) -> Ref:
    return {"digest": digest, "media": media, "size": size}


def put_json(cas: ContentStore, payload: Any) -> Ref:
    data = canonical_json(payload)
    return make_ref(cas.put_bytes(data), JSON, len(data))


def get_json(cas: ContentStore, ref: Ref | str, what: str = "JSON document") -> Any:
    digest = ref if isinstance(ref, str) else ref["digest"]
    return decode_json(cas.get_bytes(digest, what))


def decode_json(data: bytes) -> Any:
    """A JSON document from bytes the caller already read (verified) for its own size checks."""
    return json.loads(data)


def put_bytes(cas: ContentStore, data: bytes, media: str = BINARY) -> Ref:
    return make_ref(cas.put_bytes(data), media, len(data))


PINNED_PARQUET: dict[str, Any] = {  # every byte-affecting option, so equal tables, equal digests
    "compression": "zstd",
    # level 2 and 64 KiB dictionary pages: at 1.1 GB every table written took 13.0 CPU-s at
    # level 3 with 1 MiB pages, 9.9 so, the store's bytes the same (text +4%, others -11%: a
    # digest column's dictionary gave up sooner); low-cardinality columns keep their
    # dictionaries (a row group's sources, objects, verdicts fit in 64 KiB)
    "compression_level": 2,
    "use_dictionary": True,
    "dictionary_pagesize_limit": 1 << 16,
    "write_statistics": False,
    # 2**16 rows: a row group of the widest per-record tables (dedup clusters ~370 B a row,
    # members ~340 B, packed spans ~190 B) is 12-24 MB, and a streamed writer holds one, so
    # memory does not grow with the records (it did with 2**20 rows up to a million records).
    "row_group_size": 1 << 16,
    "data_page_version": "2.0",
    "version": "2.6",
    "store_schema": True,
}


def table_bytes(table: pa.Table) -> bytes:
    """Parquet with every byte-affecting option pinned, so equal tables give equal digests."""
    sink = io.BytesIO()
    pq.write_table(table, sink, **PINNED_PARQUET)
    return sink.getvalue()


def put_table_file(cas: ContentStore, table: pa.Table, path: Path) -> Ref:
    """``put_table`` through a file at ``path`` (moved into the store): the same bytes and
    digest, without holding the encoded table and its copy in memory."""
    pq.write_table(table, path, **PINNED_PARQUET)
    digest, size = cas.adopt_file(path)
    return make_ref(digest, PARQUET, size)


def put_table(cas: ContentStore, table: pa.Table) -> Ref:
    return put_bytes(cas, table_bytes(table), PARQUET)


def get_table(
    cas: ContentStore, ref: Ref, what: str = "table", columns: list[str] | None = None
) -> pa.Table:
    """A verified Parquet table; ``columns`` decodes only those (the rest is never expanded)."""
    return decode_table(cas.get_bytes(ref["digest"], what), columns)


def decode_table(data: bytes, columns: list[str] | None = None) -> pa.Table:
    """A Parquet table from bytes the caller already read (verified) for its own size checks."""
    return pq.read_table(pa.BufferReader(data), columns=columns)


def table_rows(data: bytes) -> int:
    """Row count from the Parquet footer alone; raises if ``data`` is not Parquet at all."""
    return pq.read_metadata(pa.BufferReader(data)).num_rows


def get_table_rows(cas: ContentStore, ref: Ref | str, what: str = "table") -> int:
    """A verified table's row count, so checking a stated count decodes no column."""
    digest = ref if isinstance(ref, str) else ref["digest"]
    return table_rows(cas.get_bytes(digest, what))


def get_parquet(cas: ContentStore, ref: Ref | str, what: str = "table") -> pq.ParquetFile:
    """A verified Parquet file, for reading a few columns a batch at a time."""
    digest = ref if isinstance(ref, str) else ref["digest"]
    return pq.ParquetFile(pa.BufferReader(cas.get_bytes(digest, what)))
