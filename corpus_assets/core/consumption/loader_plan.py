"""One rank's share of an epoch in batches, split among its loader workers, and where to resume.

Torch-free, so the layout and resume properties are tested without torch; ``torch_dataset`` wraps
it in a ``torch.utils.data.IterableDataset``. It is ``BlockStream``'s order rule with a batch as
the unit a worker serves: position ``p`` of the epoch order goes to rank ``p % world_size``; the
rank's positions ``>= blocks_consumed``, in order, are cut into batches of ``batch_blocks``; the
rank's ``j``-th batch goes to worker ``j % num_workers`` (0 workers means 1). A PyTorch
``DataLoader(batch_size=None)`` takes its workers' items round-robin, so each rank sees its
batches in order, whatever the worker count; with ``batch_blocks = 1`` this is exactly
``BlockStream.block_numbers``. Once every rank has taken ``s`` batches, the positions consumed
are exactly ``[start, start + s * batch_blocks * world_size)``: a prefix, so ``blocks_consumed``
alone resumes under any other world size, worker count or batch size.
"""

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from corpus_assets.core.publication.block_reader import (
    BlockReader,
    ReaderState,
    assigned_positions,
    epoch_order,
    load_state,
)
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_s3 import open_content_store
from corpus_assets.core.storage.shards import load_index


class LoaderPlan:
    """What one rank reads from ``state`` on, in batches, and the state after ``s`` steps.

    Holds only the CAS root (and object-store URL), the pack digest and numbers, so it pickles
    into loader workers; each worker opens its own verified ``BlockReader`` (``open_reader``)
    when it starts reading.
    """

    def __init__(
        self,
        cas_root: Path | str,
        identity: ReaderState,
        rank: int = 0,
        world_size: int = 1,
        batch_blocks: int = 1,
        verify: bool = True,
        cas_url: str | None = None,
    ) -> None:
        if not 0 <= rank < world_size or batch_blocks < 1:
            raise ValueError(f"rank {rank}/{world_size}, batch_blocks {batch_blocks} invalid")
        self.cas_root, self.identity = Path(cas_root), identity
        self.cas_url = cas_url  # an object-store CAS (``storage.cas_url``); ``cas_root`` its cache
        self.rank, self.world_size, self.batch_blocks, self.verify = (
            rank,
            world_size,
            batch_blocks,
            verify,
        )
        self.num_blocks = load_index(self.cas(), identity.pack_digest).blocks
        self.state = identity  # its epoch and blocks_consumed are where reading starts

    def cas(self) -> ContentStore:
        return open_content_store(self.cas_root, self.cas_url)

    def open_reader(self) -> BlockReader:
        return BlockReader.open(self.cas(), self.identity.pack_digest, self.verify)

    def load_state_dict(self, saved: Mapping[str, Any]) -> ReaderState:
        """Resume from ``saved``, refused on any identity mismatch before a block is read."""
        self.state = load_state(saved, self.identity, self.num_blocks)
        return self.state

    def rank_positions(self) -> np.ndarray:
        """This rank's positions of the current epoch from ``state`` on, in order."""
        start = self.state.blocks_consumed
        return assigned_positions(self.num_blocks, start, self.rank, self.world_size, 0, 1)

    def worker_batches(self, worker: int = 0, num_workers: int = 0) -> list[np.ndarray]:
        """Positions of each batch that ``worker`` serves, in the order it serves them."""
        workers = max(num_workers, 1)
        if not 0 <= worker < workers:
            raise ValueError(f"worker {worker} outside 0..{workers - 1}")
        positions = self.rank_positions()
        starts = range(worker * self.batch_blocks, len(positions), workers * self.batch_blocks)
        return [positions[start : start + self.batch_blocks] for start in starts]

    def batches(
        self, reader: BlockReader, worker: int = 0, num_workers: int = 0
    ) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """(block numbers, each field's ``(b, T)`` array) per batch of ``worker``, verified reads.

        The arrays are fresh copies (the reader's views are read-only memory maps)."""
        order = epoch_order(self.num_blocks, self.state.seed, self.state.epoch, self.state.shuffle)
        for positions in self.worker_batches(worker, num_workers):
            numbers = order[positions]
            rows = [reader.block(int(number)) for number in numbers]
            yield numbers, {name: np.stack([row[name] for row in rows]) for name in rows[0]}

    def consumed_after(self, steps: int) -> int:
        """Positions of the epoch consumed once every rank took ``steps`` batches from ``state``."""
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        taken = steps * self.batch_blocks * self.world_size
        return min(self.num_blocks, self.state.blocks_consumed + taken)

    def state_after(self, steps: int) -> ReaderState:
        """The state to save once every rank took ``steps`` batches; at the epoch's end, the
        next epoch from position 0 (tail policy ``keep``: nothing dropped, nothing repeated)."""
        consumed = self.consumed_after(steps)
        if consumed == self.num_blocks:
            return self.state.model_copy(
                update={"epoch": self.state.epoch + 1, "blocks_consumed": 0}
            )
        return self.state.model_copy(update={"blocks_consumed": consumed})
