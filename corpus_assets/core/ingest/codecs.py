"""Codec sniffing and bounded, truncation-aware streaming decompression.

Two failures must never pass silently: a stream cut inside a zstd frame or gzip member (zstandard's
``stream_reader`` just returns EOF there, which would turn a half-downloaded object into a shorter
but "valid" corpus), and a decompression bomb that fills memory or disk. Every decoder here counts
compressed bytes in and decompressed bytes out, and knows whether it stopped on a frame boundary.
"""

import gzip
import io
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import zstandard

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"

READ_SIZE = 1 << 18
"""Compressed bytes pulled from the source per read."""

ZSTD_FEED = 512
"""Compressed bytes fed to zstd per call. A zstd block (4 bytes at least) expands to 128 KiB at
most, so one call yields at most ~16 MiB whatever the input: this bounds memory on a bomb, since
``decompressobj().decompress`` has no output limit. Measured about as fast as ``stream_reader``."""

OUTPUT_CHUNK = 1 << 20
"""Decompressed bytes asked of gzip per call (gzip bounds its own output)."""

MAX_LINE_BYTES = 256 << 20


class CodecError(RuntimeError):
    """A stream cannot be decoded; the message names the object."""


class TruncatedStreamError(CodecError):
    """The compressed stream ends inside a zstd frame or gzip member."""


class DecompressionBombError(CodecError):
    """Decompressed output exceeds the size or ratio limit."""


@dataclass(frozen=True)
class DecompressionLimits:
    """Caps on decompressed output; the ratio only counts past the floor, so tiny files pass."""

    max_output_bytes: int = 64 << 30
    max_ratio: int = 1000
    min_ratio_floor_bytes: int = 16 << 20


DEFAULT_LIMITS = DecompressionLimits()


def sniff_codec(head: bytes) -> str:
    """``"zstd"``, ``"gzip"`` or ``"plain"`` from the first bytes; callers never name the codec."""
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    return "plain"


def open_decompressed(
    stream: BinaryIO, what: str, limits: DecompressionLimits = DEFAULT_LIMITS
) -> BinaryIO:
    """A buffered reader of the decompressed bytes of ``stream`` (zstd, gzip or plain).

    Multi-frame zstd and multi-member gzip are read to the end. Raises ``TruncatedStreamError`` if
    the input stops inside a frame or member and ``DecompressionBombError`` past ``limits``; plain
    streams pass through unlimited. The caller keeps ownership of ``stream`` and closes it.
    """
    source = _Source(stream)
    codec = sniff_codec(source.head)
    if codec == "plain":
        return io.BufferedReader(source, buffer_size=1 << 20)  # type: ignore[return-value]
    progress = _Progress()
    if codec == "zstd":
        chunks = _zstd_chunks(source, what, progress)
    else:
        chunks = _gzip_chunks(source, what, progress)
    decoded = _DecodedStream(chunks, progress, what, codec, limits)
    return io.BufferedReader(decoded, buffer_size=1 << 20)  # type: ignore[return-value]


def iter_lines(
    stream: BinaryIO,
    what: str,
    limits: DecompressionLimits = DEFAULT_LIMITS,
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[tuple[int, bytes]]:
    """Yield (1-based line number, line without its ``\\n`` / ``\\r\\n``) with bounded memory.

    ``stream`` may be compressed; it is decoded with ``open_decompressed``. A line longer than
    ``max_line_bytes`` raises ``CodecError`` naming it instead of growing without bound.
    """
    for number, _offset, line in iter_located_lines(
        stream, what, limits, max_line_bytes=max_line_bytes
    ):
        yield number, line


def iter_located_lines(
    stream: BinaryIO,
    what: str,
    limits: DecompressionLimits = DEFAULT_LIMITS,
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[tuple[int, int, bytes]]:
    """Like ``iter_lines`` plus each line's byte offset in the decompressed stream (lineage)."""
    reader = open_decompressed(stream, what, limits)
    number = offset = 0
    while True:
        try:
            line = reader.readline(max_line_bytes + 1)
        except CodecError as error:
            raise type(error)(f"{error} (after line {number})") from error
        if not line:
            return
        number += 1
        start, offset = offset, offset + len(line)
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        elif len(line) > max_line_bytes:
            raise CodecError(f"{what}: line {number} is longer than {max_line_bytes} bytes")
        yield number, start, line


@dataclass
class _Progress:
    """Compressed bytes the decoder has consumed so far (the ratio's denominator)."""

    compressed: int = 0


class _Source(io.RawIOBase):
    """The caller's stream with its first bytes read ahead for sniffing; counts bytes read."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.consumed = 0
        head = b""
        while len(head) < len(ZSTD_MAGIC):
            more = stream.read(len(ZSTD_MAGIC) - len(head))
            if not more:
                break
            head += more
        self.head = head
        self._head = memoryview(head)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        if self._head:
            count = min(len(self._head), len(view))
            view[:count] = self._head[:count]
            self._head = self._head[count:]
        else:
            data = self._stream.read(len(view))
            count = len(data)
            view[:count] = data
        self.consumed += count
        return count

    def close(self) -> None:
        """Leave the caller's stream open: the caller owns it."""
        super().close()


def _zstd_chunks(source: _Source, what: str, progress: _Progress) -> Iterator[bytes]:
    """Decode zstd frame by frame; ``decompressobj().eof`` says whether a frame really ended."""
    dctx = zstandard.ZstdDecompressor()
    frame = None
    while block := source.read(READ_SIZE):
        view = memoryview(block)
        for start in range(0, len(view), ZSTD_FEED):
            pending: bytes | memoryview = view[start : start + ZSTD_FEED]
            while pending:
                if frame is None:
                    frame = dctx.decompressobj()
                try:
                    out = frame.decompress(pending)
                except zstandard.ZstdError as error:
                    raise CodecError(
                        f"{what}: corrupt zstd data near compressed byte {progress.compressed}:"
                        f" {error}"
                    ) from error
                progress.compressed += len(pending)
                pending = b""
                if frame.eof:
                    pending = frame.unused_data
                    progress.compressed -= len(pending)
                    frame = None
                if out:
                    yield out
    if frame is not None:
        raise TruncatedStreamError(
            f"{what}: zstd stream is truncated: it ends inside a frame after"
            f" {progress.compressed} compressed bytes"
        )


def _gzip_chunks(source: _Source, what: str, progress: _Progress) -> Iterator[bytes]:
    """Decode every gzip member; ``gzip`` raises ``EOFError`` on a cut member, which we name."""
    with gzip.GzipFile(fileobj=source, mode="rb") as member_reader:
        while True:
            try:
                out = member_reader.read(OUTPUT_CHUNK)
            except EOFError as error:
                raise TruncatedStreamError(
                    f"{what}: gzip stream is truncated after {source.consumed} compressed bytes:"
                    f" {error}"
                ) from error
            except (gzip.BadGzipFile, zlib.error) as error:
                raise CodecError(
                    f"{what}: corrupt gzip data near compressed byte {source.consumed}: {error}"
                ) from error
            progress.compressed = source.consumed  # includes gzip's read-ahead (<= 128 KiB)
            if not out:
                return
            yield out


class _DecodedStream(io.RawIOBase):
    """Raw reader over decoded chunks that enforces the limits before handing out any byte."""

    def __init__(
        self,
        chunks: Iterator[bytes],
        progress: _Progress,
        what: str,
        codec: str,
        limits: DecompressionLimits,
    ) -> None:
        self._chunks = chunks
        self._progress = progress
        self._what = what
        self._codec = codec
        self._limits = limits
        self._pending = memoryview(b"")
        self._error: BaseException | None = None
        self.produced = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._error is not None:
            # A generator that raised is finished; re-raise instead of reporting a clean EOF.
            raise self._error
        view = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(view):
            if not self._pending:
                try:
                    chunk = next(self._chunks, None)
                    if chunk is not None:
                        self._account(len(chunk))
                except BaseException as error:
                    self._error = error
                    raise
                if chunk is None:
                    break
                self._pending = memoryview(chunk)
            count = min(len(self._pending), len(view) - filled)
            view[filled : filled + count] = self._pending[:count]
            self._pending = self._pending[count:]
            filled += count
        return filled

    def _account(self, size: int) -> None:
        self.produced += size
        limits = self._limits
        compressed = self._progress.compressed
        if self.produced > limits.max_output_bytes:
            raise DecompressionBombError(
                f"{self._what}: {self._codec} output exceeds max_output_bytes="
                f"{limits.max_output_bytes} ({self.produced} bytes from {compressed} compressed)"
            )
        if self.produced > limits.min_ratio_floor_bytes and self.produced > limits.max_ratio * max(
            compressed, 1
        ):
            raise DecompressionBombError(
                f"{self._what}: {self._codec} expands more than max_ratio={limits.max_ratio}"
                f" ({self.produced} bytes from {compressed} compressed)"
            )
