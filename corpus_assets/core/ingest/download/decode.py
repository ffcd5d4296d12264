"""Decoding a compressed download while it arrives, so a pin proves the object decodes.

A zstd or gzip object that is truncated, corrupt or a decompression bomb used to be pinned as is
and fail later, in canonicalisation. Decoding it as the bytes arrive costs about what
``curl | zstd -d`` pays (the decode overlaps the download, on a helper thread) and finds the fault
at the pin, with an error naming the object. The decoder is ``codecs.open_decompressed``, the
records layer's own, so the pin accepts exactly what canonicalisation will accept; its output is
counted and dropped. Plain objects (JSONL, Parquet) are not decoded at all.

Memory is bounded: at most ``depth`` received blocks wait for the decoder, and a download that
outruns it waits (back-pressure, like a pipe). The decoder's error is kept and raised to the
downloader at its next block, so a corrupt object stops the download early; the downloader's
``on_failure`` hook is also called from the decoder's thread at once, so a read waiting on a
server that stalled after a corrupt prefix is woken instead of waiting for its timeout.
"""

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO, cast

from corpus_assets.core.ingest.codecs import (
    DecompressionLimits,
    open_decompressed,
    sniff_codec,
)

SNIFF_BYTES = 4
_END = b""


@dataclass(frozen=True)
class Decoded:
    """What decoding a pinned object found: its codec and decompressed size (None if plain)."""

    codec: str
    decoded_bytes: int | None


class _Blocks:
    """The received blocks as a readable stream for the decoder thread; ``b""`` ends it."""

    def __init__(self, blocks: "queue.Queue[bytes]") -> None:
        self._blocks = blocks
        self._block = b""
        self._offset = 0
        self._ended = False

    def read(self, size: int = -1) -> bytes:
        """At most ``size`` bytes: a whole block when it fits (no copy), else a slice of it."""
        while self._offset == len(self._block):
            if self._ended:
                return b""
            self._block, self._offset = self._blocks.get(), 0
            self._ended = not self._block
        block, start = self._block, self._offset
        if start == 0 and (size < 0 or size >= len(block)):
            self._offset = len(block)
            return block
        end = len(block) if size < 0 else min(len(block), start + size)
        self._offset = end
        return block[start:end]


class DecodeCheck:
    """Feeds a download's blocks, in order, to a decoder on a helper thread.

    ``feed`` never raises (a checkpoint's prefix is fed while it is re-hashed); ``error`` is the
    decoder's failure as soon as it is known, and ``finish`` waits for the end and raises it.
    ``close`` stops the thread without waiting for the end (a restart or an abandoned download).
    ``on_failure``, when set, is called once from the decoder's thread when it fails.
    """

    def __init__(self, what: str, limits: DecompressionLimits, *, depth: int = 8) -> None:
        self.what = what
        self.limits = limits
        self.codec: str | None = None
        self.error: BaseException | None = None
        self.on_failure: Callable[[], None] | None = None
        self._head: list[bytes] = []
        self._queue: queue.Queue[bytes] = queue.Queue(maxsize=depth)
        self._thread: threading.Thread | None = None
        self._decoded = 0

    def feed(self, block: bytes) -> None:
        """Hand ``block`` (``bytes``, not changed afterwards) to the decoder."""
        if self.codec == "plain" or not block:
            return
        if self.codec is None:
            self._head.append(block)
            if sum(map(len, self._head)) < SNIFF_BYTES:
                return
            self._start()
            return
        self._put(block)

    def finish(self) -> Decoded:
        """Wait until every block fed is decoded; raise the decoder's error (a ``CodecError``)."""
        if self.codec is None:
            self._start()  # an object shorter than the magic numbers: plain
        if self._thread is not None:
            self._put(_END)
            self._thread.join()
            self._thread = None
        if self.error is not None:
            raise self.error
        assert self.codec is not None
        return Decoded(self.codec, None if self.codec == "plain" else self._decoded)

    def close(self) -> None:
        """Stop the decoder thread (its output no longer matters) and wait for it."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self.error = self.error or RuntimeError("closed")
        self._put(_END)
        thread.join()

    def _start(self) -> None:
        head, self._head = b"".join(self._head), []
        self.codec = sniff_codec(head[:SNIFF_BYTES])
        if self.codec == "plain":
            return
        self._thread = threading.Thread(target=self._run, name="download-decode", daemon=True)
        self._thread.start()
        self._put(head)

    def _put(self, block: bytes) -> None:
        """Queue ``block``; a failed decoder drains the queue, so this never blocks for good."""
        self._queue.put(block)

    def _run(self) -> None:
        """The decoder thread: decode to the end, then (failed or not) drain to the end mark."""
        blocks = _Blocks(self._queue)
        try:
            with open_decompressed(cast(BinaryIO, blocks), self.what, self.limits) as reader:
                buffer = memoryview(bytearray(1 << 20))
                while count := reader.readinto(buffer):
                    self._decoded += count
        except BaseException as error:  # kept for the downloader; the thread must not die
            self.error = error  # before the hook is read: a hook set later finds the error
            hook = self.on_failure
            if hook is not None:
                hook()
        while blocks.read(1 << 30):
            pass
