"""Block shards: fixed-length rows of named numpy fields in memory-mappable, chunk-verified files.

Layout of one shard file (format ``corpus-assets.block-shards/1``): no header; for each field in
the declared order, the C-order ``(blocks, T)`` little-endian array of that field, back to back.
Field ``i`` starts at ``blocks * T * sum(itemsize of fields before i)``, so
``np.memmap(path, dtype, mode="r", offset=..., shape=(blocks, T))`` maps it directly. Every shard
holds ``shard_blocks`` blocks except the last; shard boundaries are block numbers, never batch
boundaries, so the same blocks give the same bytes whatever the writer's batch sizes.

Each file is named by its sha256 in the CAS and also carries sha256 digests of its fixed-size
chunks (``chunk_bytes``, 4 MiB; the last may be short), listed in a typed ``ShardIndex``
document that is itself put in the CAS: a reader verifies only the chunks a read touches.
"""

import hashlib
from collections.abc import Iterable, Mapping
from concurrent.futures import Executor
from pathlib import Path
from types import TracebackType
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from corpus_assets.core.storage.artifacts import Ref, get_json, put_json
from corpus_assets.core.storage.cas import CasError, ContentStore
from corpus_assets.core.storage.digests import hasher_digest
from corpus_assets.core.storage.fsio import link_into_place, write_temp

SHARD_FORMAT = "corpus-assets.block-shards/1"
CHUNK_BYTES = 4 << 20
SHARD_BYTES = 64 << 20


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

    format: Literal["corpus-assets.block-shards/1"] = SHARD_FORMAT
    block_tokens: int
    fields: tuple[FieldSpec, ...]
    shard_blocks: int
    blocks: int
    shards: tuple[ShardEntry, ...]

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


def chunk_digests(
    views: Iterable[memoryview], chunk_bytes: int
) -> tuple[str, tuple[str, ...], int]:
    """(whole-file digest, chunk digests, size) of the concatenated ``views``, in one pass."""
    whole, chunk = hashlib.sha256(), hashlib.sha256()
    filled, size, digests = 0, 0, []
    for view in views:
        data = view.cast("B")
        whole.update(data)
        size += len(data)
        start = 0
        while start < len(data):
            take = min(chunk_bytes - filled, len(data) - start)
            chunk.update(data[start : start + take])
            filled += take
            start += take
            if filled == chunk_bytes:
                digests.append(hasher_digest(chunk))
                chunk, filled = hashlib.sha256(), 0
    if filled:
        digests.append(hasher_digest(chunk))
    return hasher_digest(whole), tuple(digests), size


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
    ) -> None:
        if block_tokens <= 0 or not fields or chunk_bytes <= 0:
            raise ShardError("a shard needs T > 0, at least one field and chunk_bytes > 0")
        self.cas, self.block_tokens, self.chunk_bytes = cas, block_tokens, chunk_bytes
        self.fields = {name: little_endian(dtype) for name, dtype in fields.items()}
        block_bytes = block_tokens * sum(d.itemsize for d in self.fields.values())
        self.shard_blocks = max(1, shard_bytes // block_bytes)
        self._buffers = {
            name: np.empty((self.shard_blocks, block_tokens), dtype)
            for name, dtype in self.fields.items()
        }
        self._filled = 0
        self._entries: list[ShardEntry] = []
        self.blocks = 0
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
        digest, chunks, size = chunk_digests(views, self.chunk_bytes)
        target = self.cas.path(digest)
        created = False
        if not target.exists():
            created = link_into_place(write_temp(self.cas.root / "tmp", views), target)
        self.cas.stats.record(created)
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

    def close(self) -> tuple[ShardIndex, Ref]:
        """Write the last (short) shard and the index; returns the index and its CAS ref."""
        self._flush()
        self.index = ShardIndex(
            block_tokens=self.block_tokens,
            fields=tuple(FieldSpec(name=n, dtype=d.str) for n, d in self.fields.items()),
            shard_blocks=self.shard_blocks,
            blocks=self.blocks,
            shards=tuple(self._entries),
        )
        self.ref = put_json(self.cas, self.index.model_dump(mode="json"))
        self._buffers = {}
        return self.index, self.ref

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, _error: object, _trace: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()


def write_shards(
    cas: ContentStore,
    batches: Iterable[Mapping[str, np.ndarray]],
    block_tokens: int,
    fields: Mapping[str, np.dtype | str],
    shard_bytes: int = SHARD_BYTES,
    chunk_bytes: int = CHUNK_BYTES,
) -> tuple[ShardIndex, Ref]:
    """All ``batches`` as shards plus their index; see ``ShardWriter``."""
    with ShardWriter(cas, block_tokens, fields, shard_bytes, chunk_bytes) as writer:
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


class MappedShard:
    """One shard memory-mapped read-only, verifying each chunk the first time a read touches it."""

    def __init__(
        self,
        cas: ContentStore,
        index: ShardIndex,
        entry: ShardEntry,
        verify: bool,
        verified: np.ndarray | None = None,
        pool: Executor | None = None,
    ) -> None:
        """``verified`` (one flag per chunk) may be shared with an earlier mapping of the shard;
        ``pool`` hashes the chunks of one read in parallel."""
        self.entry, self.verify, self.pool = entry, verify, pool
        path: Path = cas.path(entry.digest)
        if not path.is_file():
            raise ShardError(f"shard {entry.digest} is missing from the CAS")
        if path.stat().st_size != entry.size:
            raise ShardError(
                f"shard {entry.digest} is {path.stat().st_size} bytes, not {entry.size}"
            )
        self.raw = np.memmap(path, dtype=np.uint8, mode="r")
        chunks = len(entry.chunk_digests)
        self.verified = np.zeros(chunks, dtype=bool) if verified is None else verified
        offsets = index.field_offsets(entry.blocks)
        self.spans = {}  # field -> (byte offset of its array, bytes per block)
        self.arrays = {}
        for name, dtype in index.dtypes().items():
            row = index.block_tokens * dtype.itemsize
            self.spans[name] = (offsets[name], row)
            view = self.raw[offsets[name] : offsets[name] + entry.blocks * row]
            self.arrays[name] = view.view(dtype).reshape(entry.blocks, index.block_tokens)

    def rows(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Read-only views of blocks ``[start, stop)`` of this shard, their chunks verified."""
        if self.verify:
            for offset, row in self.spans.values():
                self.check_bytes(offset + start * row, offset + stop * row)
        return {name: array[start:stop] for name, array in self.arrays.items()}

    def check_bytes(self, begin: int, end: int) -> None:
        """Verify the unverified chunks of bytes ``[begin, end)``, on the pool's threads if many.

        ``hashlib`` releases the GIL while hashing, so chunks hash in parallel on several cores.
        """
        size = self.entry.chunk_bytes
        first, stop = begin // size, -(-end // size)
        pending = [first + int(i) for i in np.flatnonzero(~self.verified[first:stop])]
        if len(pending) > 1 and self.pool is not None:
            for _ in self.pool.map(self.check_chunk, pending):
                pass
        else:
            for chunk in pending:
                self.check_chunk(chunk)

    def check_chunk(self, chunk: int) -> None:
        size = self.entry.chunk_bytes
        actual = hasher_digest(hashlib.sha256(self.raw[chunk * size : (chunk + 1) * size]))
        if actual != self.entry.chunk_digests[chunk]:
            raise ShardCorruptError(self.entry.digest, chunk, actual)
        self.verified[chunk] = True


def verify_shards(cas: ContentStore, index: ShardIndex) -> int:
    """Check every chunk and the whole-file digest of every shard; returns the shards checked."""
    for entry in index.shards:
        shard = MappedShard(cas, index, entry, verify=True)
        whole = hashlib.sha256()
        for chunk in range(len(entry.chunk_digests)):
            shard.check_chunk(chunk)
            whole.update(shard.raw[chunk * entry.chunk_bytes : (chunk + 1) * entry.chunk_bytes])
        if hasher_digest(whole) != entry.digest:
            raise ShardCorruptError(entry.digest, -1, hasher_digest(whole))
    return len(index.shards)
