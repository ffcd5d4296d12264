"""Run a reader on a helper thread a few blocks ahead of its consumer (bounded memory).

Decoding a zstd object (C code that releases the GIL, with the CAS's sha256 check beside it) and
splitting it into lines (Python that holds the GIL) are two different CPU costs; run in turn they
add up, run on two threads the slower one bounds the pair. Blocks cross between the threads in
batches of about ``batch_bytes``, because each hand-over costs a thread wake-up, which on a busy
machine is a scheduler delay; at most ``depth`` batches wait, so memory stays about
``(depth + 2) * batch_bytes`` whatever the object's size.
"""

import contextlib
import io
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Protocol

_Batch = list[bytes] | BaseException


class BlockSource(Protocol):
    def read_block(self) -> bytes:
        """The next block, ``b""`` at the end."""
        ...


class ReadAhead(io.RawIOBase):
    """A raw reader of ``source.read_block()``'s blocks, read on a helper thread.

    An error raised by ``read_block`` is raised to the consumer in its turn, after every block
    read before it, and again on every later read: a failed stream never looks like a clean end.
    ``close`` stops the thread and waits for it, so ``read_block``'s source may be closed after.
    """

    def __init__(self, source: BlockSource, *, batch_bytes: int = 4 << 20, depth: int = 2) -> None:
        self.source = source
        self._queue: queue.Queue[_Batch] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._blocks: deque[bytes] = deque()
        self._block = memoryview(b"")
        self._final: BaseException | None = None
        self._ended = False
        # The thread holds no reference to self: an abandoned reader is collected, and closed.
        self._thread = threading.Thread(
            target=_produce,
            args=(source.read_block, batch_bytes, self._queue, self._stop),
            name="read-ahead",
            daemon=True,
        )
        self._thread.start()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._block:
            if self._final is not None:
                raise self._final
            if self._ended:
                return 0
            if not self._blocks:
                batch = self._queue.get()
                if isinstance(batch, BaseException):
                    self._final = batch
                    raise batch
                self._blocks.extend(batch)
            block = self._blocks.popleft()
            self._ended = not block
            self._block = memoryview(block)
        view = memoryview(buffer).cast("B")
        count = min(len(view), len(self._block))
        view[:count] = self._block[:count]
        self._block = self._block[count:]
        return count

    def close(self) -> None:
        """Stop the helper (it may be blocked on a full queue) and wait until it has returned."""
        thread = getattr(self, "_thread", None)  # absent if __init__ failed
        if thread is not None:
            self._stop.set()
            while thread.is_alive():
                with contextlib.suppress(queue.Empty):
                    self._queue.get(timeout=0.05)
        super().close()


def _produce(
    read_block: Callable[[], bytes],
    batch_bytes: int,
    batches: "queue.Queue[_Batch]",
    stop: threading.Event,
) -> None:
    def put(item: _Batch) -> None:
        while not stop.is_set():
            try:
                batches.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    batch: list[bytes] = []
    size = 0
    try:
        while not stop.is_set():
            block = read_block()
            batch.append(block)
            size += len(block)
            if size >= batch_bytes or not block:
                put(batch)
                batch, size = [], 0
            if not block:
                return
    except BaseException as error:  # handed over after the blocks before it
        if batch:
            put(batch)
        put(error)
