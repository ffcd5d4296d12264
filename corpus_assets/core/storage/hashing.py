"""sha256 on a helper thread, in order, so hashing overlaps the I/O or decoding around it.

A download hashes what it receives and a CAS read re-hashes what it hands out; done inline, each
costs I/O + hash. hashlib releases the GIL on buffers over 2 KiB, so feeding the hash on a second
thread while the caller receives, writes or decodes the next block costs about max(I/O, hash) on
a machine with a free core, and the same as before on a machine without one.
"""

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

OFFLOAD_MIN = 1 << 16
"""Smaller blocks are hashed inline: handing one to the thread costs more than hashing it."""


class OverlappedHasher:
    """A sha256 fed blocks in order, one block in flight on a helper thread at most.

    ``update`` returns at once for a big block; ``hexdigest`` waits for every block fed so far, so
    what it returns always covers exactly those bytes. A block must not change after it is fed
    (pass ``bytes``), and memory stays bounded by one block. The thread starts with the first big
    block; ``close`` ends it (an unclosed one ends when the hasher is garbage-collected).
    """

    def __init__(self) -> None:
        self._hasher: Any = hashlib.sha256()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    def update(self, block: bytes) -> None:
        self._settle()
        if len(block) < OFFLOAD_MIN:
            self._hasher.update(block)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="sha256")
        self._pending = self._pool.submit(self._hasher.update, block)

    def hexdigest(self) -> str:
        self._settle()
        return str(self._hasher.hexdigest())

    def close(self) -> None:
        """Wait for the block in flight and end the thread; the hasher stays usable inline."""
        try:
            self._settle()
        finally:
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None

    def _settle(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()
