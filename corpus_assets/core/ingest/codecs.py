"""Codec sniffing and bounded, truncation-aware streaming decompression.

Two failures must never pass silently: a stream cut inside a zstd frame or gzip member (zstandard's
``stream_reader`` just returns EOF there, which would turn a half-downloaded object into a shorter
but "valid" corpus), and a decompression bomb that fills memory or disk. Every decoder here counts
compressed bytes in and decompressed bytes out, and knows whether it stopped on a frame boundary.
"""

import gzip
import io
import operator
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import zstandard

from corpus_assets.core.ingest.read_ahead import ReadAhead
from corpus_assets.core.runtime.config import Limits
from corpus_assets.core.storage.cas_queries import streamed

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"

READ_SIZE = 1 << 18
"""Compressed bytes pulled from the source per read."""

SKIPPABLE_MAGIC = 0x184D2A50
"""A skippable zstd frame's little-endian magic, with its low 4 bits cleared."""

OUTPUT_BUFFER = 1 << 20
"""Decompressed bytes asked of a decoder per read: bounds memory on a bomb, since both zstd's
``stream_reader`` and gzip never return more than asked."""

MAX_LINE_BYTES = 256 << 20
NEWLINE, CARRIAGE_RETURN = ord("\n"), ord("\r")
_NUMBER_AND_LINE = operator.itemgetter(0, 2)


class CodecError(RuntimeError):
    """A stream cannot be decoded; the message names the object."""


class TruncatedStreamError(CodecError):
    """The compressed stream ends inside a zstd frame or gzip member."""


class DecompressionBombError(CodecError):
    """Decompressed output exceeds the size or ratio limit."""


@dataclass(frozen=True)
class DecompressionLimits:
    """Caps on decompressed output; the ratio only counts past the floor, so tiny files pass."""

    max_output_bytes: int = Limits().max_output_bytes  # the config's defaults: one source
    max_ratio: int = Limits().max_ratio
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
    stream: BinaryIO,
    what: str,
    limits: DecompressionLimits = DEFAULT_LIMITS,
    *,
    read_ahead: bool = False,
) -> BinaryIO:
    """A buffered reader of the decompressed bytes of ``stream`` (zstd, gzip or plain).

    Multi-frame zstd and multi-member gzip are read to the end. Raises ``TruncatedStreamError`` if
    the input stops inside a frame or member and ``DecompressionBombError`` past ``limits``; plain
    streams pass through unlimited. The caller keeps ownership of ``stream`` and closes it.

    ``read_ahead`` decodes on a helper thread a few MiB ahead of the caller (``ReadAhead``), which
    pays when the caller does CPU work of its own per byte (splitting lines); close the reader
    before ``stream`` then, so the thread has stopped reading it.
    """
    source = _Source(stream)
    codec = sniff_codec(source.head)
    if codec == "plain":
        return io.BufferedReader(source, buffer_size=1 << 20)  # type: ignore[return-value]
    inner = _ZstdDecoded(source, what) if codec == "zstd" else _GzipDecoded(source, what)
    decoded = _DecodedStream(inner, source, what, codec, limits)
    raw = ReadAhead(decoded) if read_ahead else decoded
    return io.BufferedReader(raw, buffer_size=OUTPUT_BUFFER)  # type: ignore[return-value]


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
    located = iter_located_lines(stream, what, limits, max_line_bytes=max_line_bytes)
    return map(_NUMBER_AND_LINE, located)  # a C-level projection: no Python frame per line


PARQUET_BATCH_BYTES = 1 << 20  # decoded bytes per batch of a Parquet object's rows, about


def iter_parquet_rows(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(1-based row number, row) of a Parquet object, read without pre-buffering (every row
    group read would stay until the file closed) in batches of about ``PARQUET_BATCH_BYTES``
    decoded: another tool's file may hold long documents in large row groups, and 4,096-row
    batches of them took a whole file at once."""
    number = 0
    for batch in streamed(path, 4096, batch_bytes=PARQUET_BATCH_BYTES):
        for row in batch.to_pylist():
            number += 1
            yield number, row


def iter_located_lines(
    stream: BinaryIO,
    what: str,
    limits: DecompressionLimits = DEFAULT_LIMITS,
    *,
    max_line_bytes: int = MAX_LINE_BYTES,
) -> Iterator[tuple[int, int, bytes]]:
    """Like ``iter_lines`` plus each line's byte offset in the decompressed stream (lineage)."""
    longest = max_line_bytes + 1
    number = offset = 0
    with open_decompressed(stream, what, limits, read_ahead=True) as reader:  # thread ends on exit
        readline = reader.readline
        while True:  # the per-line loop of every text ingest: kept to a few bytecodes per line
            try:
                line = readline(longest)
            except CodecError as error:
                raise type(error)(f"{error} (after line {number})") from error
            if not line:
                return
            number += 1
            size = len(line)
            start = offset
            offset += size
            if line[-1] == NEWLINE:
                line = line[:-2] if size > 1 and line[-2] == CARRIAGE_RETURN else line[:-1]
            elif size > max_line_bytes:
                raise CodecError(f"{what}: line {number} is longer than {max_line_bytes} bytes")
            yield number, start, line


class _Source(io.RawIOBase):
    """The caller's stream with its first bytes read ahead for sniffing; counts bytes read."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.consumed = 0
        self.observer: Callable[[memoryview], None] | None = None
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

    def read(self, size: int = -1) -> bytes:
        """The decoders call ``read``: hand the stream's own block on instead of copying it."""
        if self._head or size is None or size < 0:
            return super().read(size)  # type: ignore[no-any-return]
        data = self._stream.read(size)
        self.consumed += len(data)
        if self.observer is not None:
            self.observer(memoryview(data))
        return data

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
        if self.observer is not None:
            self.observer(view[:count])
        return count

    def close(self) -> None:
        """Leave the caller's stream open: the caller owns it."""
        super().close()


class _ZstdFrameWalker:
    """Follows zstd frame and block headers over the compressed bytes, skipping block bodies.

    zstandard's ``stream_reader`` is the fast, output-bounded decoder, but it reports a clean EOF
    when the input stops inside a frame. Walking the headers (a few per 128 KiB block, so cheap)
    tells whether the input really ended on a frame boundary.
    """

    def __init__(self) -> None:
        self._in_frame = False
        self._checksum = False
        self._held = bytearray()
        self._skip = 0

    @property
    def at_frame_boundary(self) -> bool:
        return not (self._in_frame or self._held or self._skip)

    def feed(self, data: memoryview) -> None:
        position, end = 0, len(data)
        while True:
            if self._skip:
                step = min(self._skip, end - position)
                self._skip -= step
                position += step
                if self._skip:
                    return
            wanted = self._wanted()
            if len(self._held) >= wanted:
                self._advance()
                continue
            if position == end:
                return
            take = min(wanted - len(self._held), end - position)
            self._held += data[position : position + take]
            position += take

    def _wanted(self) -> int:
        """Bytes the next header needs, as far as the bytes held so far tell."""
        held = self._held
        if self._in_frame:
            return 3  # a block header
        if len(held) < 4:
            return 4
        if held[:4] != ZSTD_MAGIC:
            return 8  # a skippable frame: magic, then its 4-byte length
        if len(held) < 5:
            return 5
        return zstandard.frame_header_size(bytes(held))

    def _advance(self) -> None:
        held, self._held = bytes(self._held), bytearray()
        if self._in_frame:
            header = int.from_bytes(held, "little")
            kind, size = (header >> 1) & 3, header >> 3
            if kind == 3:
                raise ValueError("reserved zstd block type")
            self._skip = 1 if kind == 1 else size  # an RLE block holds one byte
            if header & 1:  # the frame's last block, then its optional checksum
                self._in_frame = False
                self._skip += 4 if self._checksum else 0
        elif held[:4] != ZSTD_MAGIC:
            if int.from_bytes(held[:4], "little") & 0xFFFFFFF0 != SKIPPABLE_MAGIC:
                raise ValueError("not a zstd frame")
            self._skip = int.from_bytes(held[4:8], "little")
        else:
            self._checksum = zstandard.get_frame_parameters(held).has_checksum
            self._in_frame = True


class _ZstdDecoded(io.RawIOBase):
    """zstandard's ``stream_reader`` (bounded output per read) plus truncation detection."""

    def __init__(self, source: _Source, what: str) -> None:
        self._source = source
        self._what = what
        self._walker = _ZstdFrameWalker()
        source.observer = self._observe
        self._reader = zstandard.ZstdDecompressor().stream_reader(
            source, read_size=READ_SIZE, read_across_frames=True, closefd=False
        )

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count: int = self._decode(self._reader.readinto, buffer)
        self._check_end(count)
        return count

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._decode(self._reader.read, size)
        self._check_end(len(data))
        return data

    def _decode(self, method: Callable[[Any], Any], argument: Any) -> Any:
        try:
            return method(argument)
        except (zstandard.ZstdError, ValueError) as error:
            raise CodecError(
                f"{self._what}: corrupt zstd data near compressed byte {self._source.consumed}:"
                f" {error}"
            ) from error

    def _check_end(self, count: int) -> None:
        if not count and not self._walker.at_frame_boundary:
            raise TruncatedStreamError(
                f"{self._what}: zstd stream is truncated: it ends inside a frame after"
                f" {self._source.consumed} compressed bytes"
            )

    def _observe(self, block: memoryview) -> None:
        self._walker.feed(block)


class _GzipDecoded(io.RawIOBase):
    """Every gzip member; ``gzip`` raises ``EOFError`` on a cut member, which we name."""

    def __init__(self, source: _Source, what: str) -> None:
        self._source = source
        self._what = what
        self._reader = gzip.GzipFile(fileobj=source, mode="rb")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        return self._decode(self._reader.readinto, buffer)  # type: ignore[no-any-return]

    def read(self, size: int = -1) -> bytes:
        return self._decode(self._reader.read, size)  # type: ignore[no-any-return]

    def _decode(self, method: Callable[[Any], Any], argument: Any) -> Any:
        consumed = self._source.consumed
        try:
            return method(argument)
        except EOFError as error:
            raise TruncatedStreamError(
                f"{self._what}: gzip stream is truncated after {consumed} compressed bytes: {error}"
            ) from error
        except (gzip.BadGzipFile, zlib.error) as error:
            raise CodecError(
                f"{self._what}: corrupt gzip data near compressed byte {consumed}: {error}"
            ) from error


class _DecodedStream(io.RawIOBase):
    """A decoder's output, with the limits enforced before any byte is handed out."""

    def __init__(
        self,
        inner: io.RawIOBase,
        source: _Source,
        what: str,
        codec: str,
        limits: DecompressionLimits,
    ) -> None:
        self._inner = inner
        self._source = source  # its byte count (read-ahead included) is the ratio's denominator
        self._what = what
        self._codec = codec
        self._limits = limits
        self._error: BaseException | None = None
        self.produced = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._error is not None:
            raise self._error  # a decoder that failed once stays failed, never a clean EOF
        try:
            # At most OUTPUT_BUFFER per call, even into a caller's bigger buffer: the limits are
            # checked at least that often.
            count = self._inner.readinto(memoryview(buffer).cast("B")[:OUTPUT_BUFFER]) or 0
            self._account(count)
        except BaseException as error:
            self._error = error
            raise
        return count

    def read_block(self) -> bytes:
        """The next decoded block, at most OUTPUT_BUFFER bytes (so the limits are checked at
        least that often), ``b""`` at the end."""
        if self._error is not None:
            raise self._error  # a decoder that failed once stays failed, never a clean EOF
        try:
            block: bytes = self._inner.read(OUTPUT_BUFFER)
            self._account(len(block))
        except BaseException as error:
            self._error = error
            raise
        return block

    def _account(self, size: int) -> None:
        self.produced += size
        limits = self._limits
        compressed = self._source.consumed
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
