"""MosaicML Streaming MDS export of packed block shards, every file's digest recorded.

The published MDS layout (``mosaicml-streaming`` ``streaming/base/format/mds``, index version 2),
written here from its specification so the export needs neither torch nor that package:

- ``index.json``: ``json.dumps({"shards": [...], "version": 2}, sort_keys=True)``; each shard
  entry is the shard's writer config (``column_encodings``, ``column_names``, ``column_sizes``,
  ``compression``, ``format: "mds"``, ``hashes``, ``size_limit``, ``version: 2``) plus
  ``raw_data`` (``basename``, ``bytes``, ``hashes``), ``samples`` and ``zip_data`` (null).
- ``shard.NNNNN.mds``: ``u32`` sample count ``k``; ``k + 1`` ``u32`` absolute sample offsets;
  the config as ``json.dumps(config, sort_keys=True)``; then the samples. A sample is each
  column's bytes in sorted column-name order, preceded by ``u32`` sizes of the variable-size
  columns only (here there are none).

Every field of a block becomes an ``ndarray:<dtype>:<T>`` column: a fixed dtype and shape, so a
sample is each field's ``T`` values back to back, little-endian as the shards hold them. Shards
fill up to ``size_limit`` bytes exactly as ``MDSWriter`` decides (``8 + len(config) +
k * (sample + 4) <= size_limit``), so the same pack and limit give the same files. MDS's own
``sha256`` hash of each shard is the hex of its CAS digest; ``MdsExport`` lists every file.
"""

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from corpus_assets.core.consumption.exports import ExportError
from corpus_assets.core.publication.block_reader import BlockReader
from corpus_assets.core.storage.artifacts import Ref, put_json
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.digests import hex_of
from corpus_assets.core.storage.fsio import atomic_write, write_temp

MDS_EXPORT_FORMAT = "corpus-assets.mds-export/1"
MDS_VERSION = 2
MDS_SIZE_LIMIT = 1 << 26  # MDSWriter's default shard size limit
MDS_INDEX = "index.json"
MDS_DTYPES = frozenset(  # NDArray's value dtypes
    {"uint8", "int8", "uint16", "int16", "float16", "uint32", "int32", "float32"}
    | {"uint64", "int64", "float64"}
)
PIECE_BYTES = 8 << 20  # samples assembled this many bytes at a time


class MdsFile(BaseModel):
    """One exported file: its name in the MDS directory and its content digest in the CAS."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    basename: str
    digest: str
    size: int
    samples: int = 0


class MdsExport(BaseModel):
    """What an MDS export holds; itself put in the CAS, so one digest names the whole export."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["corpus-assets.mds-export/1"] = MDS_EXPORT_FORMAT
    pack_digest: str
    block_tokens: int
    blocks: int
    columns: dict[str, str]
    size_limit: int
    index: MdsFile
    shards: tuple[MdsFile, ...]

    def files(self) -> tuple[MdsFile, ...]:
        return (self.index, *self.shards)


def mds_columns(reader: BlockReader) -> dict[str, str]:
    """``{field: "ndarray:<dtype>:<T>"}`` in sorted name order, the order MDS stores columns."""
    columns = {}
    for name, dtype in sorted(reader.index.dtypes().items()):
        if dtype.name not in MDS_DTYPES or dtype.byteorder == ">":
            raise ExportError(f"field {name}: dtype {dtype} has no MDS ndarray encoding")
        columns[name] = f"ndarray:{dtype.name}:{reader.index.block_tokens}"
    return columns


def _shard_config(columns: dict[str, str], sizes: list[int], size_limit: int) -> dict[str, Any]:
    return {
        "column_encodings": list(columns.values()),
        "column_names": list(columns),
        "column_sizes": sizes,
        "compression": None,
        "format": "mds",
        "hashes": ["sha256"],
        "size_limit": size_limit,
        "version": MDS_VERSION,
    }


def _samples(reader: BlockReader, names: list[str], start: int, stop: int) -> Iterator[bytes]:
    """Blocks ``[start, stop)`` as MDS samples, a bounded piece at a time (verified reads)."""
    per_piece = max(1, PIECE_BYTES // reader.index.block_bytes())
    for first in range(start, stop, per_piece):
        for batch in reader.batches(first, min(stop, first + per_piece)):
            rows = len(batch[names[0]])
            parts = [np.ascontiguousarray(batch[name]).view(np.uint8) for name in names]
            yield memoryview(np.concatenate(parts, axis=1).reshape(rows, -1)).cast("B")


def _shard_chunks(
    reader: BlockReader, config: bytes, sample_bytes: int, start: int, stop: int
) -> Iterator[bytes]:
    count = stop - start
    header = 4 + 4 * (count + 1) + len(config)
    offsets = header + sample_bytes * np.arange(count + 1, dtype=np.int64)
    yield np.array([count], "<u4").tobytes() + offsets.astype("<u4").tobytes() + config
    names = list(json.loads(config)["column_names"])
    yield from _samples(reader, names, start, stop)


def export_mds(
    cas: ContentStore,
    reader: BlockReader,
    pack_digest: str,
    size_limit: int = MDS_SIZE_LIMIT,
) -> tuple[MdsExport, Ref]:
    """Every block of ``reader`` as MDS shards + ``index.json`` in the CAS; returns the export
    document and its ref. ``pack_digest`` is the shard index digest the reader was opened on."""
    if not 0 < size_limit < 1 << 32:
        raise ExportError(f"MDS size_limit must be in 1..2**32-1, got {size_limit}")
    columns = mds_columns(reader)
    sizes = [reader.index.dtypes()[name].itemsize * reader.index.block_tokens for name in columns]
    config = _shard_config(columns, sizes, size_limit)
    config_bytes = json.dumps(config, sort_keys=True).encode()
    sample_bytes = sum(sizes)
    per_shard = (size_limit - 8 - len(config_bytes)) // (sample_bytes + 4)
    if per_shard < 1:
        raise ExportError(f"one block ({sample_bytes} bytes) does not fit size_limit {size_limit}")
    shards, entries = [], []
    for number, start in enumerate(range(0, len(reader), per_shard)):
        stop = min(len(reader), start + per_shard)
        chunks = _shard_chunks(reader, config_bytes, sample_bytes, start, stop)
        digest, size = cas.adopt_file(write_temp(cas.root / "tmp", chunks))
        basename = f"shard.{number:05}.mds"
        shards.append(MdsFile(basename=basename, digest=digest, size=size, samples=stop - start))
        raw = {"basename": basename, "bytes": size, "hashes": {"sha256": hex_of(digest)}}
        entries.append({**config, "raw_data": raw, "samples": stop - start, "zip_data": None})
    index_bytes = json.dumps({"shards": entries, "version": MDS_VERSION}, sort_keys=True).encode()
    index = MdsFile(basename=MDS_INDEX, digest=cas.put_bytes(index_bytes), size=len(index_bytes))
    export = MdsExport(
        pack_digest=pack_digest,
        block_tokens=reader.index.block_tokens,
        blocks=len(reader),
        columns=columns,
        size_limit=size_limit,
        index=index,
        shards=tuple(shards),
    )
    return export, put_json(cas, export.model_dump(mode="json"))


def load_mds_export(cas: ContentStore, digest: str) -> MdsExport:
    """The export document named by ``digest``, its bytes verified by the CAS."""
    return MdsExport.model_validate(json.loads(cas.get_bytes(digest, "MDS export")))


def copy_object(cas: ContentStore, digest: str, target: Path, what: str) -> None:
    """Copy a CAS object out through the verifying reader: to a temp name beside ``target``,
    renamed once complete, removed if the bytes do not hash to ``digest``."""
    temp = target.with_name(f".{target.name}.tmp")
    try:
        with cas.open(digest, what) as source, open(temp, "wb") as out:
            shutil.copyfileobj(source, out, 1 << 22)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    temp.replace(target)


def materialize_mds(cas: ContentStore, export: MdsExport, directory: Path) -> Path:
    """Lay the export out as an MDS directory (``StreamingDataset(local=directory)``).

    Each file is copied through the CAS's verifying reader, so a corrupt object fails here
    instead of reaching a trainer; ``index.json`` is written last, as MDS writers do.
    """
    directory.mkdir(parents=True, exist_ok=True)
    for entry in export.shards:
        copy_object(cas, entry.digest, directory / entry.basename, f"MDS {entry.basename}")
    atomic_write(directory / MDS_INDEX, cas.get_bytes(export.index.digest, "MDS index"))
    return directory
