"""Exports of packed block shards to trainers' own formats, each file's digest recorded.

Megatron-LM ``MMIDIDX`` v1 (``megatron/core/datasets/indexed_dataset.py``): the ``.bin`` is the
token ids of every sequence back to back in the index's dtype; the ``.idx`` is, little-endian,
``b"MMIDIDX\\x00\\x00"``, version ``u64 = 1``, dtype code ``u8``, sequence count ``u64``, document
count ``u64``, then ``int32`` sequence lengths, ``int64`` byte pointers into the ``.bin`` and
``int64`` document indices (``[0, 1, ..., n]``: document ``d`` is sequences
``[doc[d], doc[d+1])``). One sequence and one document per block: each block is a training row
already. The dtype is Megatron's own choice for the vocabulary size (``uint16`` below 65500,
else ``int32``), and every id is checked to fit it and the vocabulary.
"""

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from corpus_assets.core.publication.block_reader import BlockReader
from corpus_assets.core.storage.artifacts import BINARY, Ref, make_ref, put_json
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.fsio import write_temp

MEGATRON_EXPORT_FORMAT = "corpus-assets.megatron-export/1"
MEGATRON_HEADER = b"MMIDIDX\x00\x00"
MEGATRON_DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint16": 8}
INDEX_ROWS = 1 << 20  # pointers/lengths written this many at a time


class ExportError(ValueError):
    """A pack cannot be exported faithfully to the requested format."""


@dataclass(frozen=True)
class MegatronExport:
    bin: Ref
    idx: Ref
    dtype: str
    sequences: int


def megatron_dtype(vocab_size: int) -> np.dtype:
    """Megatron's ``DType.optimal_dtype``: ``uint16`` below 65500 ids, else ``int32``."""
    return np.dtype("<u2") if vocab_size < 65500 else np.dtype("<i4")


def _bin_chunks(reader: BlockReader, field: str, dtype: np.dtype, vocab: int) -> Iterator[bytes]:
    for batch in reader.batches():
        ids = batch[field]
        if ids.size and int(ids.max()) >= vocab:
            raise ExportError(f"{field} holds id {int(ids.max())} >= vocab size {vocab}")
        yield memoryview(np.ascontiguousarray(ids, dtype=dtype)).cast("B")


def _idx_chunks(sequences: int, tokens: int, dtype: np.dtype) -> Iterator[bytes]:
    code = MEGATRON_DTYPE_CODES[dtype.name]
    yield MEGATRON_HEADER + struct.pack("<QBQQ", 1, code, sequences, sequences + 1)
    for start in range(0, sequences, INDEX_ROWS):
        count = min(INDEX_ROWS, sequences - start)
        yield np.full(count, tokens, dtype="<i4").tobytes()
    step = tokens * dtype.itemsize
    for start in range(0, sequences, INDEX_ROWS):
        stop = min(start + INDEX_ROWS, sequences)
        yield (np.arange(start, stop, dtype="<i8") * step).tobytes()
    for start in range(0, sequences + 1, INDEX_ROWS):
        yield np.arange(start, min(start + INDEX_ROWS, sequences + 1), dtype="<i8").tobytes()


def export_megatron(
    cas: ContentStore, reader: BlockReader, vocab_size: int, field: str = "input_ids"
) -> MegatronExport:
    """``.bin`` + ``.idx`` of ``field`` (one sequence per block) put in the CAS, read verified."""
    if field not in reader.index.dtypes():
        raise ExportError(f"the pack has no field {field!r}")
    dtype = megatron_dtype(vocab_size)
    tokens, sequences = reader.index.block_tokens, reader.index.blocks
    if tokens * dtype.itemsize * max(sequences, 1) >= 1 << 63:
        raise ExportError("the .bin would not be addressable by int64 pointers")
    refs = []
    for chunks in (
        _bin_chunks(reader, field, dtype, vocab_size),
        _idx_chunks(sequences, tokens, dtype),
    ):
        digest, size = cas.adopt_file(write_temp(cas.root / "tmp", chunks))
        refs.append(make_ref(digest, BINARY, size))
    return MegatronExport(bin=refs[0], idx=refs[1], dtype=dtype.str, sequences=sequences)


def record_megatron(cas: ContentStore, exported: MegatronExport, pack_digest: str) -> Ref:
    """The export document (pack, dtype, each file's name, digest and size) put in the CAS, so
    one digest names the export and a trainer's copy of ``data.bin``/``data.idx`` is checkable."""
    files = [
        {"basename": name, "digest": ref["digest"], "size": ref["size"]}
        for name, ref in (("data.bin", exported.bin), ("data.idx", exported.idx))
    ]
    return put_json(
        cas,
        {
            "format": MEGATRON_EXPORT_FORMAT,
            "pack_digest": pack_digest,
            "dtype": exported.dtype,
            "sequences": exported.sequences,
            "files": files,
        },
    )
