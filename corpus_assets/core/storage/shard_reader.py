"""Reading block shards (``storage.shards`` writes them): memory-mapped fields whose chunks are
verified against the shard index on first touch, and the whole-pack verification."""

from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

import numpy as np

from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.shards import (
    TASK_BYTES,
    ShardCorruptError,
    ShardEntry,
    ShardError,
    ShardIndex,
    chunk_digest,
    whole_sha256,
)


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
            whole = side.submit(whole_sha256, [memoryview(shard.raw)])
            for chunk in range(len(entry.chunk_digests)):
                shard.check_chunk(chunk)
            actual = whole.result()
        if actual != entry.digest:
            raise ShardCorruptError(entry.digest, -1, actual)
    return len(index.shards)
