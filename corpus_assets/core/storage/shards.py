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
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
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


def _whole_sha256(views: list[memoryview]) -> str:
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
        whole = side.submit(_whole_sha256, flat)
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
    ) -> None:
        if block_tokens <= 0 or not fields or chunk_bytes <= 0:
            raise ShardError("a shard needs T > 0, at least one field and chunk_bytes > 0")
        if chunk_hash not in _HASHERS:
            raise ShardError(f"chunk_hash must be one of {sorted(_HASHERS)}, got {chunk_hash!r}")
        self.cas, self.block_tokens, self.chunk_bytes = cas, block_tokens, chunk_bytes
        self.chunk_hash = chunk_hash
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

    def close(self) -> tuple[ShardIndex, Ref]:
        """Write the last (short) shard and the index; returns the index and its CAS ref."""
        self._flush()
        self.index = ShardIndex(
            chunk_hash=self.chunk_hash,
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


class MappedShard:
    """One shard memory-mapped read-only, verifying each chunk the first time a read touches it.

    Chunks can be scheduled ahead (``schedule``) on the pool's threads; a read (``rows``) waits
    for its chunks' checks and re-raises their ``ShardCorruptError``, so no byte of an unverified
    or corrupt chunk is handed out. ``_inflight`` is touched by the calling thread only; pool
    threads only set ``verified`` flags (a chunk checked twice in a race is harmless).
    """

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
        ``pool`` hashes chunks in parallel and ahead of reads."""
        self.entry, self.verify, self.pool = entry, verify, pool
        self.chunk_hash = index.chunk_hash
        path: Path = cas.path(entry.digest)
        if not path.is_file():
            raise ShardError(f"shard {entry.digest} is missing from the CAS")
        if path.stat().st_size != entry.size:
            raise ShardError(
                f"shard {entry.digest} is {path.stat().st_size} bytes, not {entry.size}"
            )
        # a plain ndarray over the mapping (it keeps the map alive): slicing a np.memmap runs
        # Python-level hooks that cost more than a small read itself
        self.raw = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
        chunks = len(entry.chunk_digests)
        self.verified = np.zeros(chunks, dtype=bool) if verified is None else verified
        self._inflight: dict[int, Future] = {}
        self._complete = bool(self.verified.all())  # every chunk verified: reads skip the check
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
        if self.verify and not self._complete:
            self._verify_rows(start, stop)
        return {name: array[start:stop] for name, array in self.arrays.items()}

    def _verify_rows(self, start: int, stop: int) -> None:
        """Plain-int fast path first: a read of verified chunks costs a flag look-up per field."""
        size, ranges = self.entry.chunk_bytes, []
        for offset, row in self.spans.values():
            lo, hi = (offset + start * row) // size, -(-(offset + stop * row) // size)
            if not (self.verified[lo] if hi - lo == 1 else self.verified[lo:hi].all()):
                ranges.append(np.arange(lo, hi))
        if ranges:
            self.check_chunks(np.unique(np.concatenate(ranges)))
            self._complete = bool(self.verified.all())

    def chunks_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """Sorted chunk numbers that rows ``rows`` (of every field) touch."""
        size, parts = self.entry.chunk_bytes, []
        if rows.size and rows.size == int(rows[-1]) - int(rows[0]) + 1:  # a contiguous run
            for offset, row in self.spans.values():
                lo, hi = offset + int(rows[0]) * row, offset + (int(rows[-1]) + 1) * row
                parts.append(np.arange(lo // size, -(-hi // size)))
        else:
            for offset, row in self.spans.values():
                first = (offset + rows * row) // size
                last = (offset + (rows + 1) * row - 1) // size
                width = int((last - first).max(initial=0)) + 1
                every = first[:, None] + np.arange(width)
                parts.append(every[every <= last[:, None]])
        return np.unique(np.concatenate(parts)) if parts else np.empty(0, np.int64)

    def check_bytes(self, begin: int, end: int) -> None:
        """Verify the unverified chunks of bytes ``[begin, end)``, waiting for their checks."""
        size = self.entry.chunk_bytes
        self.check_chunks(np.arange(begin // size, -(-end // size)))

    def schedule(self, chunks: np.ndarray) -> None:
        """Start checking ``chunks`` (those neither verified nor in flight) on the pool, in
        tasks of about ``TASK_BYTES``; without a pool, nothing (reads check inline)."""
        if self.pool is None or not self.verify:
            return
        todo = [int(c) for c in chunks[~self.verified[chunks]] if int(c) not in self._inflight]
        per_task = max(1, TASK_BYTES // self.entry.chunk_bytes)
        for lo in range(0, len(todo), per_task):
            group = todo[lo : lo + per_task]
            future = self.pool.submit(self._check_group, group)
            self._inflight.update(dict.fromkeys(group, future))

    def check_chunks(self, chunks: np.ndarray) -> None:
        """Return once every chunk of ``chunks`` is verified; raise on the first corrupt one."""
        pending = chunks[~self.verified[chunks]]
        if not pending.size:
            return
        if self.pool is not None and pending.size > 1:
            self.schedule(pending)
        waits = {}
        for chunk in pending.tolist():
            future = self._inflight.pop(chunk, None)
            if future is not None:
                waits[id(future)] = future
            elif not self.verified[chunk]:
                self.check_chunk(chunk)
        for future in waits.values():
            with suppress(ShardCorruptError):  # re-checked below, naming a chunk this read needs
                future.result()
        for chunk in pending.tolist():
            if not self.verified[chunk]:
                self.check_chunk(chunk)

    def _check_group(self, chunks: list[int]) -> None:
        for chunk in chunks:
            self.check_chunk(chunk)

    def check_chunk(self, chunk: int) -> None:
        size = self.entry.chunk_bytes
        actual = chunk_digest(self.chunk_hash, self.raw[chunk * size : (chunk + 1) * size])
        if actual != self.entry.chunk_digests[chunk]:
            raise ShardCorruptError(self.entry.digest, chunk, actual)
        self.verified[chunk] = True


def verify_shards(cas: ContentStore, index: ShardIndex) -> int:
    """Check every chunk and the whole-file digest of every shard; returns the shards checked."""
    for entry in index.shards:
        shard = MappedShard(cas, index, entry, verify=True)
        with ThreadPoolExecutor(1) as side:
            whole = side.submit(_whole_sha256, [memoryview(shard.raw)])
            for chunk in range(len(entry.chunk_digests)):
                shard.check_chunk(chunk)
            actual = whole.result()
        if actual != entry.digest:
            raise ShardCorruptError(entry.digest, -1, actual)
    return len(index.shards)
