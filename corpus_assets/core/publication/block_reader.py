"""Verified reads of packed block shards, a rank- and worker-independent epoch order, and resume.

``BlockReader`` maps shards lazily and verifies only the chunks a read touches (each once per
open); ``verify=False`` is the unverified baseline. A shard byte that does not match its index
raises ``ShardCorruptError`` naming the shard digest and chunk number, before any block of that
chunk is handed out. Reads whose next blocks are known (``batches``, ``blocks``, ``BlockStream``)
verify ahead: the chunks of the next shard, or of the next ``ahead`` block numbers, are hashed on
the reader's threads while the caller works on the current ones.

Order rule (documented in docs/ARCHITECTURE.md): epoch ``e`` of a pack of ``n`` blocks visits
positions ``0..n-1``; position ``p`` holds block ``order[p]``, where ``order`` is the identity or,
with ``shuffle``, ``numpy.random.Generator(PCG64([seed, e])).permutation(n)``. Position ``p`` goes
to rank ``p % world_size``; within that rank, its ``k``-th position (``k = p // world_size``)
goes to worker ``k % num_workers`` (0 workers means 1). A trainer that takes the next block of
each rank in rank order and each rank's next ``k`` from its worker consumes a prefix of
positions, so ``blocks_consumed`` alone says where to resume, under any other layout. Tail policy
``keep``: the last round of an epoch may leave some ranks without a block; nothing is dropped or
repeated; the epoch ends at ``n`` and the next starts at position 0 of epoch ``e + 1``.
"""

import os
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.shard_reader import MappedShard
from corpus_assets.core.storage.shards import ShardIndex, load_index

IDENTITY_FIELDS = (
    "snapshot_id",
    "pack_digest",
    "mix_digest",
    "tokenizer_digest",
    "seed",
    "shuffle",
    "tail",
)


class ReaderStateError(ValueError):
    """A saved reader state does not belong to the pack and run it is being resumed against."""


class BlockReader:
    """Blocks of a shard index by global block number, in order or at random."""

    def __init__(
        self,
        cas: ContentStore,
        index: ShardIndex,
        verify: bool = True,
        max_mapped: int = 32,
        threads: int | None = None,
    ) -> None:
        """At most ``max_mapped`` shards stay mapped (least recently used first out), so resident
        pages stay bounded (touched pages of mapped shards count in RSS, as page cache the kernel
        can reclaim); which chunks were verified is kept for every shard of this open.
        ``threads`` hash the chunks of one read in parallel (default: the usable cores, <= 8)."""
        self.cas, self.index, self.verify = cas, index, verify
        workers = threads or min(8, len(os.sched_getaffinity(0)))
        self._pool = ThreadPoolExecutor(workers) if verify and workers > 1 else None
        self._firsts = np.array([entry.first_block for entry in index.shards], dtype=np.int64)
        self._first_list = self._firsts.tolist()  # bisect on a list: a per-block read's cost
        self._mapped: OrderedDict[int, MappedShard] = OrderedDict()
        self._verified: dict[int, np.ndarray] = {}
        self._max_mapped = max(1, max_mapped)

    @classmethod
    def open(cls, cas: ContentStore, index_digest: str, verify: bool = True) -> "BlockReader":
        return cls(cas, load_index(cas, index_digest), verify)

    def __len__(self) -> int:
        return self.index.blocks

    def close(self) -> None:
        """Stop the hashing threads and drop the mappings (views already handed out stay valid)."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        self._mapped.clear()

    def __enter__(self) -> "BlockReader":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _shard(self, number: int) -> MappedShard:
        mapped = self._mapped.get(number)
        if mapped is not None:
            self._mapped.move_to_end(number)
            return mapped
        entry, verified = self.index.shards[number], self._verified.get(number)
        mapped = MappedShard(self.cas, self.index, entry, self.verify, verified, self._pool)
        self._verified[number] = mapped.verified
        self._mapped[number] = mapped
        if len(self._mapped) > self._max_mapped:
            self._mapped.popitem(last=False)
        return mapped

    def locate(self, block: int) -> tuple[int, int]:
        """(shard number, row within the shard) of global block ``block``."""
        if not 0 <= block < self.index.blocks:
            raise IndexError(f"block {block} outside 0..{self.index.blocks - 1}")
        shard = bisect_right(self._first_list, block) - 1
        return shard, block - self._first_list[shard]

    def block(self, block: int) -> dict[str, np.ndarray]:
        """Each field's ``(T,)`` row of one block: read-only views into the verified mapping."""
        shard, row = self.locate(block)
        return {name: rows[0] for name, rows in self._shard(shard).rows(row, row + 1).items()}

    def prefetch(self, blocks: Iterable[int]) -> None:
        """Start verifying the chunks of ``blocks`` on the reader's threads; returns at once.
        (A no-op unverified or with one thread: reads then verify inline.)"""
        if self._pool is None:
            return
        numbers = np.unique(np.fromiter(blocks, dtype=np.int64))
        numbers = numbers[(numbers >= 0) & (numbers < self.index.blocks)]  # the read will raise
        if not numbers.size:
            return
        shards = np.searchsorted(self._firsts, numbers, side="right") - 1  # ascending
        cuts = np.flatnonzero(np.diff(shards)) + 1
        for part in np.split(numbers, cuts):
            shard = int(shards[np.searchsorted(numbers, part[0])])
            verified = self._verified.get(shard)
            if verified is not None and verified.all():
                continue  # the common case late in an epoch: nothing left to hash
            mapped = self._shard(shard)
            mapped.schedule(mapped.chunks_of_rows(part - self._firsts[shard]))

    def blocks(
        self, numbers: Iterable[int], ahead: int = 256
    ) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """(number, fields) of each block of ``numbers`` in that order, verifying ``ahead``
        numbers in advance on the reader's threads."""
        upcoming = iter(numbers)
        nxt = [int(n) for n in islice(upcoming, ahead)]
        self.prefetch(nxt)
        while nxt:
            window, nxt = nxt, [int(n) for n in islice(upcoming, ahead)]
            self.prefetch(nxt)
            for number in window:
                yield number, self.block(number)

    def batches(self, start: int = 0, stop: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Blocks ``[start, stop)`` in order, as ``(b, T)`` views of at most one shard each; the
        next shard's chunks are verified while the caller works on the current one."""
        stop = self.index.blocks if stop is None else stop
        while start < stop:
            shard, row = self.locate(start)
            take = min(stop - start, self.index.shards[shard].blocks - row)
            current = self._shard(shard)
            if self._pool is not None:
                current.schedule(current.chunks_of_rows(np.arange(row, row + take)))
                self.prefetch(
                    range(start + take, min(stop, start + take + self.index.shard_blocks))
                )
            yield current.rows(row, row + take)
            start += take

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for batch in self.batches():
            count = len(next(iter(batch.values())))
            for row in range(count):
                yield {name: values[row] for name, values in batch.items()}


class ReaderState(BaseModel):
    """Where a run is in a pack; all but ``epoch`` and ``blocks_consumed`` must match to resume."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    snapshot_id: str
    pack_digest: str
    mix_digest: str
    tokenizer_digest: str
    seed: int
    shuffle: bool = True
    tail: Literal["keep"] = "keep"
    epoch: int = 0
    blocks_consumed: int = 0

    def state_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def load_state(saved: Mapping[str, Any], expected: ReaderState, num_blocks: int) -> ReaderState:
    """``saved`` as a state, refused (naming the field, expected vs got) on any mismatch.

    Checked before any block is read: a state from another snapshot, pack, mix, tokenizer, seed
    or order policy would resume a different stream silently.
    """
    for name in IDENTITY_FIELDS:
        got = saved.get(name, "<absent>")
        want = getattr(expected, name)
        if got != want:
            raise ReaderStateError(f"reader state {name}: expected {want!r}, got {got!r}")
    try:
        state = ReaderState.model_validate(dict(saved))
    except ValidationError as error:
        raise ReaderStateError(f"reader state is malformed: {error}") from None
    if not 0 <= state.blocks_consumed <= num_blocks or state.epoch < 0:
        raise ReaderStateError(
            f"reader state blocks_consumed: expected 0..{num_blocks}, got {state.blocks_consumed}"
        )
    return state


def epoch_order(num_blocks: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """Block number at each position of ``epoch`` (int64); the same on every rank and worker."""
    if not shuffle:
        return np.arange(num_blocks, dtype=np.int64)
    generator = np.random.Generator(np.random.PCG64([seed, epoch]))
    return generator.permutation(num_blocks).astype(np.int64, copy=False)


def assigned_positions(
    num_blocks: int, start: int, rank: int, world_size: int, worker: int, num_workers: int
) -> np.ndarray:
    """Positions ``>= start`` of an epoch that a rank's worker serves, in order."""
    workers = max(num_workers, 1)
    if not (0 <= rank < world_size and 0 <= worker < workers):
        raise ValueError(f"rank {rank}/{world_size}, worker {worker}/{workers} out of range")
    first_round = max(0, -(-(start - rank) // world_size))
    first_round += (worker - first_round) % workers
    end_round = -(-(num_blocks - rank) // world_size)
    rounds = np.arange(first_round, max(first_round, end_round), workers, dtype=np.int64)
    return rank + world_size * rounds


class BlockStream:
    """One epoch of a pack from a reader state: what each rank/worker reads, and the next state."""

    def __init__(self, reader: BlockReader, state: ReaderState) -> None:
        self.reader, self.state = reader, state
        self.order = epoch_order(reader.index.blocks, state.seed, state.epoch, state.shuffle)

    def block_numbers(
        self, rank: int = 0, world_size: int = 1, worker: int = 0, num_workers: int = 1
    ) -> np.ndarray:
        positions = assigned_positions(
            len(self.order), self.state.blocks_consumed, rank, world_size, worker, num_workers
        )
        return self.order[positions]

    def blocks(
        self, rank: int = 0, world_size: int = 1, worker: int = 0, num_workers: int = 1
    ) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """(block number, fields) for one rank's worker, verified ahead of the read."""
        yield from self.reader.blocks(self.block_numbers(rank, world_size, worker, num_workers))

    def state_after(self, consumed: int) -> ReaderState:
        """The state once ``consumed`` positions of this epoch (from its start) are consumed."""
        total = len(self.order)
        if not self.state.blocks_consumed <= consumed <= total:
            raise ReaderStateError(
                f"consumed {consumed} outside {self.state.blocks_consumed}..{total}"
            )
        if consumed == total:
            return self.state.model_copy(
                update={"epoch": self.state.epoch + 1, "blocks_consumed": 0}
            )
        return self.state.model_copy(update={"blocks_consumed": consumed})


def cu_seqlens(segment_ids: np.ndarray) -> np.ndarray:
    """A block's flash-attention varlen boundaries from its segment ids: 0, then the end of
    every segment (int32); pad (segment 0) is in no segment. Shards store the segment ids, not
    this ragged array, since one follows from the other."""
    segments = np.asarray(segment_ids)
    if segments.ndim != 1:
        raise ValueError(f"one block's segment ids, not shape {segments.shape}")
    last = np.ones(segments.size, dtype=bool)
    last[:-1] = segments[1:] != segments[:-1]
    ends = np.flatnonzero(last & (segments != 0)) + 1
    return np.concatenate([[0], ends]).astype(np.int32)
