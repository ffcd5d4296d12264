"""Block shards: fixed-length rows of named numpy fields in memory-mappable, chunk-verified files.

Layout of one shard file: no header; for each field in the declared order, the C-order
``(blocks, T)`` little-endian array of that field, back to back. Field ``i`` starts at
``blocks * T * sum(itemsize of fields before i)``, so
``np.memmap(path, dtype, mode="r", offset=..., shape=(blocks, T))`` maps it directly. Every shard
holds ``shard_blocks`` blocks except the last; shard boundaries are block numbers, never batch
boundaries, so the same blocks give the same bytes whatever the writer's batch sizes.

Each file is named by its sha256 in the CAS and also carries digests of its fixed-size chunks
(``chunk_bytes``, 1 MiB by default; the last may be short), listed in a typed ``ShardIndex``
document that is itself put in the CAS: a reader verifies only the chunks a read touches.
Format ``corpus-assets.block-shards/2`` names the chunk hash (``chunk_hash``: ``blake3`` by
default, about 2.7x sha256's speed here, so verified reads stay close to unverified ones;
``sha256`` still possible); ``/1`` indices (sha256 chunks, no ``chunk_hash``) still load.
"""

import hashlib
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any, Literal

import blake3
import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from corpus_assets.core.storage.artifacts import Ref, get_json, put_json
from corpus_assets.core.storage.cas import CasError, ContentStore
from corpus_assets.core.storage.digests import hasher_digest

SHARD_FORMAT_V1 = "corpus-assets.block-shards/1"
SHARD_FORMAT = "corpus-assets.block-shards/2"
ChunkHash = Literal["blake3", "sha256"]
CHUNK_HASH: ChunkHash = "blake3"
CHUNK_BYTES = 1 << 20
SHARD_BYTES = 64 << 20
TASK_BYTES = 2 << 20  # chunks hashed per thread-pool task: amortises the pool's per-task cost
_HASHERS: dict[str, Callable[[Any], Any]] = {"blake3": blake3.blake3, "sha256": hashlib.sha256}


def chunk_digest(algorithm: str, data: Any) -> str:
    """``<algorithm>:<hex>`` of one chunk's bytes (both hashers release the GIL on big inputs)."""
    return f"{algorithm}:{_HASHERS[algorithm](data).hexdigest()}"


class ShardError(CasError):
    """A shard, its index or a batch written to it is not what it should be."""


class ShardCorruptError(ShardError):
    """A chunk of a shard does not hash to the digest its index lists."""

    def __init__(self, shard: str, chunk: int, actual: str) -> None:
        super().__init__(f"shard {shard} chunk {chunk} is corrupt: its bytes hash to {actual}")
        self.shard, self.chunk, self.actual = shard, chunk, actual


class _Document(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FieldSpec(_Document):
    """One named per-token field; ``dtype`` is numpy's string form, little-endian (``<u4``)."""

    name: str
    dtype: str


class ShardEntry(_Document):
    digest: str
    size: int
    blocks: int
    first_block: int
    chunk_bytes: int
    chunk_digests: tuple[str, ...]


class ShardIndex(_Document):
    """Everything a reader needs to map and verify the shards; its digest names the pack."""

    format: Literal["corpus-assets.block-shards/1", "corpus-assets.block-shards/2"] = SHARD_FORMAT
    chunk_hash: ChunkHash = CHUNK_HASH
    block_tokens: int
    fields: tuple[FieldSpec, ...]
    shard_blocks: int
    blocks: int
    shards: tuple[ShardEntry, ...]

    @model_validator(mode="before")
    @classmethod
    def _v1_chunks_are_sha256(cls, data: Any) -> Any:
        """A ``/1`` index predates ``chunk_hash``: its chunks are sha256, and it cannot say so."""
        if isinstance(data, dict) and data.get("format") == SHARD_FORMAT_V1:
            if data.get("chunk_hash", "sha256") != "sha256":
                raise ValueError(f"{SHARD_FORMAT_V1} chunks are sha256")
            return {**data, "chunk_hash": "sha256"}
        return data

    def dtypes(self) -> dict[str, np.dtype]:
        return {field.name: np.dtype(field.dtype) for field in self.fields}

    def block_bytes(self) -> int:
        return self.block_tokens * sum(np.dtype(f.dtype).itemsize for f in self.fields)

    def field_offsets(self, blocks: int) -> dict[str, int]:
        """Byte offset of each field's array in a shard of ``blocks`` blocks."""
        offsets, offset = {}, 0
        for field in self.fields:
            offsets[field.name] = offset
            offset += blocks * self.block_tokens * np.dtype(field.dtype).itemsize
        return offsets


def little_endian(dtype: np.dtype | str) -> np.dtype:
    """The little-endian form of a fixed-size numeric dtype (the only byte order shards hold)."""
    resolved = np.dtype(dtype)
    if resolved.kind not in "biuf":
        raise ShardError(f"shard fields are numeric; {resolved} is not")
    return resolved.newbyteorder("<") if resolved.itemsize > 1 else resolved


def whole_sha256(views: list[memoryview]) -> str:
    whole = hashlib.sha256()
    for view in views:
        whole.update(view)
    return hasher_digest(whole)


def chunk_digests(
    views: Iterable[memoryview], chunk_bytes: int, chunk_hash: str = CHUNK_HASH
) -> tuple[str, tuple[str, ...], int]:
    """(whole-file sha256, chunk digests, size) of the concatenated ``views``.

    The whole-file sha256 runs on a second thread while this one hashes the chunks (both
    release the GIL), so writing costs about the slower of the two, not their sum."""
    flat = [view.cast("B") for view in views]
    with ThreadPoolExecutor(1) as side:
        whole = side.submit(whole_sha256, flat)
        hasher, filled, digests = _HASHERS[chunk_hash](), 0, []
        for data in flat:
            start = 0
            while start < len(data):
                take = min(chunk_bytes - filled, len(data) - start)
                hasher.update(data[start : start + take])
                filled, start = filled + take, start + take
                if filled == chunk_bytes:
                    digests.append(f"{chunk_hash}:{hasher.hexdigest()}")
                    hasher, filled = _HASHERS[chunk_hash](), 0
        if filled:
            digests.append(f"{chunk_hash}:{hasher.hexdigest()}")
        return whole.result(), tuple(digests), sum(len(data) for data in flat)


class ShardWriter:
    """``with ShardWriter(cas, T, fields) as out: out.write(batch)``; then ``out.index``/``ref``.

    A batch maps every declared field to a ``(b, T)`` array; values must survive the cast to the
    declared dtype unchanged. Memory held: one shard's arrays (``shard_bytes``).
    """

    def __init__(
        self,
        cas: ContentStore,
        block_tokens: int,
        fields: Mapping[str, np.dtype | str],
        shard_bytes: int = SHARD_BYTES,
        chunk_bytes: int = CHUNK_BYTES,
        chunk_hash: ChunkHash = CHUNK_HASH,
        first_block: int = 0,
    ) -> None:
        if block_tokens <= 0 or not fields or chunk_bytes <= 0:
            raise ShardError("a shard needs T > 0, at least one field and chunk_bytes > 0")
        if chunk_hash not in _HASHERS:
            raise ShardError(f"chunk_hash must be one of {sorted(_HASHERS)}, got {chunk_hash!r}")
        self.cas, self.block_tokens, self.chunk_bytes = cas, block_tokens, chunk_bytes
        self.chunk_hash = chunk_hash
        self.fields = {name: little_endian(dtype) for name, dtype in fields.items()}
        self.shard_blocks = shard_blocks(block_tokens, self.fields, shard_bytes)
        self._buffers = {
            name: np.empty((self.shard_blocks, block_tokens), dtype)
            for name, dtype in self.fields.items()
        }
        self._filled = 0
        self._entries: list[ShardEntry] = []
        self.blocks = first_block  # a worker writing shards from the middle of a pack
        self.index: ShardIndex | None = None
        self.ref: Ref | None = None

    def write(self, batch: Mapping[str, np.ndarray]) -> None:
        """Append a batch of blocks, flushing a shard each time ``shard_blocks`` are buffered."""
        arrays = self._checked(batch)
        count = len(next(iter(arrays.values())))
        done = 0
        while done < count:
            take = min(self.shard_blocks - self._filled, count - done)
            for name, values in arrays.items():
                self._buffers[name][self._filled : self._filled + take] = values[done : done + take]
            self._filled += take
            done += take
            if self._filled == self.shard_blocks:
                self._flush()

    def copy_blocks(self, path: str, blocks: int, offsets: Mapping[str, int]) -> None:
        """Append ``blocks`` blocks read straight from a shard file the caller verified (its
        fields at byte ``offsets``, in this writer's dtypes): a child's shard that begins with
        its parent's blocks. They must fit in the shard being filled."""
        if set(offsets) != set(self.fields) or self._filled + blocks > self.shard_blocks:
            raise ShardError(f"cannot copy {blocks} blocks of fields {sorted(offsets)} here")
        fd = os.open(path, os.O_RDONLY)
        try:
            for name in self.fields:
                target = memoryview(self._buffers[name][self._filled : self._filled + blocks])
                read = os.preadv(fd, [target.cast("B")], offsets[name])
                if read != target.nbytes:
                    raise ShardError(f"{path}: read {read} of {target.nbytes} bytes of {name}")
        finally:
            os.close(fd)
        self._filled += blocks
        if self._filled == self.shard_blocks:
            self._flush()

    def _checked(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if set(batch) != set(self.fields):
            raise ShardError(f"batch fields {sorted(batch)} != declared {sorted(self.fields)}")
        arrays, counts = {}, set()
        for name, dtype in self.fields.items():
            values = np.asarray(batch[name])
            if values.ndim != 2 or values.shape[1] != self.block_tokens:
                raise ShardError(
                    f"field {name}: shape {values.shape}, want (b, {self.block_tokens})"
                )
            cast = values.astype(dtype, copy=False)
            if cast.dtype != values.dtype and not np.array_equal(cast, values):
                raise ShardError(f"field {name}: values do not fit {dtype}")
            arrays[name] = cast
            counts.add(values.shape[0])
        if len(counts) != 1:
            raise ShardError(f"fields of one batch have different block counts {sorted(counts)}")
        return arrays

    def _flush(self) -> None:
        if not self._filled:
            return
        views = [memoryview(self._buffers[name][: self._filled]) for name in self.fields]
        digest, chunks, size = chunk_digests(views, self.chunk_bytes, self.chunk_hash)
        self.cas.put_hashed(digest, views)
        self._entries.append(
            ShardEntry(
                digest=digest,
                size=size,
                blocks=self._filled,
                first_block=self.blocks,
                chunk_bytes=self.chunk_bytes,
                chunk_digests=chunks,
            )
        )
        self.blocks += self._filled
        self._filled = 0

    def finish(self) -> tuple[ShardEntry, ...]:
        """Write the last (short) shard; the shards written, without an index (a worker's part
        of a pack, which ``put_shard_index`` puts together)."""
        self._flush()
        self._buffers = {}
        return tuple(self._entries)

    def close(self) -> tuple[ShardIndex, Ref]:
        """Write the last (short) shard and the index; returns the index and its CAS ref."""
        entries = self.finish()
        self.index, self.ref = put_shard_index(
            self.cas, self.block_tokens, self.fields, entries, self.shard_blocks, self.chunk_hash
        )
        return self.index, self.ref

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, _error: object, _trace: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()


def shard_blocks(
    block_tokens: int, fields: Mapping[str, np.dtype | str], shard_bytes: int = SHARD_BYTES
) -> int:
    """Blocks per shard: as many whole blocks as fit in ``shard_bytes`` (at least one)."""
    block_bytes = block_tokens * sum(np.dtype(d).itemsize for d in fields.values())
    return max(1, shard_bytes // block_bytes)


def put_shard_index(
    cas: ContentStore,
    block_tokens: int,
    fields: Mapping[str, np.dtype | str],
    entries: Iterable[ShardEntry],
    blocks_per_shard: int,
    chunk_hash: ChunkHash = CHUNK_HASH,
) -> tuple[ShardIndex, Ref]:
    """The index of shards written in block order (by one writer or several) and its ref."""
    shards = tuple(entries)
    declared = {name: little_endian(dtype) for name, dtype in fields.items()}
    index = ShardIndex(
        chunk_hash=chunk_hash,
        block_tokens=block_tokens,
        fields=tuple(FieldSpec(name=n, dtype=d.str) for n, d in declared.items()),
        shard_blocks=blocks_per_shard,
        blocks=sum(entry.blocks for entry in shards),
        shards=shards,
    )
    return index, put_json(cas, index.model_dump(mode="json"))


def write_shards(
    cas: ContentStore,
    batches: Iterable[Mapping[str, np.ndarray]],
    block_tokens: int,
    fields: Mapping[str, np.dtype | str],
    shard_bytes: int = SHARD_BYTES,
    chunk_bytes: int = CHUNK_BYTES,
    chunk_hash: ChunkHash = CHUNK_HASH,
) -> tuple[ShardIndex, Ref]:
    """All ``batches`` as shards plus their index; see ``ShardWriter``."""
    with ShardWriter(cas, block_tokens, fields, shard_bytes, chunk_bytes, chunk_hash) as writer:
        for batch in batches:
            writer.write(batch)
    assert writer.index is not None and writer.ref is not None
    return writer.index, writer.ref


def load_index(cas: ContentStore, digest: str) -> ShardIndex:
    """The shard index named by ``digest``, its bytes verified and its shape validated."""
    index = ShardIndex.model_validate(get_json(cas, digest, "shard index"))
    first = 0
    for entry in index.shards:
        chunks = -(-entry.size // entry.chunk_bytes)
        if entry.first_block != first or len(entry.chunk_digests) != chunks:
            raise ShardError(f"shard index {digest}: shard {entry.digest} is inconsistent")
        if entry.size != entry.blocks * index.block_bytes():
            raise ShardError(f"shard index {digest}: shard {entry.digest} has the wrong size")
        first += entry.blocks
    if first != index.blocks:
        raise ShardError(f"shard index {digest}: shards hold {first} blocks, not {index.blocks}")
    return index
