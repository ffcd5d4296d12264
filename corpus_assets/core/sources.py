"""Source objects: listing, cheap change fingerprints, codec sniffing and line iteration.

Listing is sorted by relative POSIX name so every machine sees the same order. The fingerprint
(name, size, mtime) is cheap enough for a sensor tick; the pinned sha256 is taken at freeze time.
"""

import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import zstandard

from corpus_assets.core.config import LoadedConfig, ObjectsSource
from corpus_assets.core.digests import json_digest

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"


class SourceError(RuntimeError):
    """A source cannot be listed or read; the message names the source and object."""


@dataclass(frozen=True)
class ListedObject:
    name: str
    path: Path
    size: int
    mtime_ns: int


def list_objects(loaded: LoadedConfig, source: ObjectsSource) -> list[ListedObject]:
    root = loaded.source_path(source)
    if not root.is_dir():
        raise SourceError(f"source {source.id!r}: folder {root} does not exist")
    seen: dict[str, ListedObject] = {}
    for pattern in source.include:
        for path in root.rglob(pattern):
            if not path.is_file() or path.name.startswith("."):
                continue
            stat = path.stat()
            name = path.relative_to(root).as_posix()
            seen[name] = ListedObject(name, path, stat.st_size, stat.st_mtime_ns)
    return [seen[name] for name in sorted(seen)]


def fingerprint(loaded: LoadedConfig) -> str:
    """Digest of every source's listing; changes when an object is added, removed or touched."""
    listing = {
        source.id: [[o.name, str(o.size), str(o.mtime_ns)] for o in list_objects(loaded, source)]
        for source in loaded.config.sources
    }
    return json_digest(listing)


def sniff_codec(head: bytes) -> str:
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    return "plain"


def decompressed(stream: BinaryIO, what: str) -> BinaryIO:
    """Wrap ``stream`` in the decompressor its magic bytes call for."""
    buffered = io.BufferedReader(stream, buffer_size=1 << 20)  # type: ignore[arg-type]
    codec = sniff_codec(buffered.peek(4)[:4])
    if codec == "zstd":
        return zstandard.ZstdDecompressor().stream_reader(buffered, read_across_frames=True)
    if codec == "gzip":
        return gzip.GzipFile(fileobj=buffered, mode="rb")  # type: ignore[return-value]
    return buffered


def iter_lines(stream: BinaryIO, what: str) -> Iterator[tuple[int, bytes]]:
    """Yield (1-based line number, line bytes without newline) from a maybe-compressed stream."""
    reader = io.BufferedReader(decompressed(stream, what), buffer_size=1 << 20)  # type: ignore[arg-type]
    number = 0
    try:
        for number, line in enumerate(reader, start=1):
            yield number, line.rstrip(b"\r\n")
    except (zstandard.ZstdError, EOFError, OSError) as error:
        raise SourceError(f"{what}: cannot decompress after line {number}: {error}") from error
