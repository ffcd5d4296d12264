"""Content-addressed store: objects named by the sha256 of their bytes, put-if-absent, verified get.

Layout ``<root>/sha256/ab/cd/<hex>``. Every read re-hashes the bytes, so a flipped bit anywhere is
reported with the object's name instead of flowing silently into a training set.
"""

import hashlib
import io
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from corpus_assets.core.storage.digests import (
    PREFIX,
    check_digest,
    hasher_digest,
    hex_of,
    sha256_digest,
)
from corpus_assets.core.storage.fsio import fsync_dir, link_into_place, write_temp
from corpus_assets.core.storage.hashing import OverlappedHasher

COPY_CHUNK = 1 << 20
HEX_NAME = re.compile(r"^[0-9a-f]{64}$")  # an object's file name


class CasError(RuntimeError):
    """Base class for content-addressed store failures."""


class MissingObjectError(CasError):
    def __init__(self, digest: str, what: str = "object") -> None:
        super().__init__(f"CAS {what} {digest} is missing")
        self.digest = digest


class CorruptObjectError(CasError):
    def __init__(self, digest: str, actual: str, what: str = "object") -> None:
        super().__init__(f"CAS {what} {digest} is corrupt: its bytes hash to {actual}")
        self.digest = digest
        self.actual = actual


@dataclass
class PutStats:
    """How many puts wrote a new object and how many found it already present."""

    created: int = 0
    reused: int = 0

    def record(self, created: bool) -> None:
        if created:
            self.created += 1
        else:
            self.reused += 1


class ContentStore:
    """The local store; ``cas_s3.S3ContentStore`` keeps the same layout in an object store and
    uses this one as its read-through cache. Every write goes through ``contains`` and
    ``_publish`` and every read through ``path``, so a backend overrides only those."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.stats = PutStats()
        self._tmp = self.root / "tmp"

    def close(self) -> None:
        """Release what the store holds open: nothing here (each read and write opens and closes
        its own file); an object-store backend closes its client."""

    def local_path(self, digest: str) -> Path:
        """Where the object lives (or would live) on this disk; never fetches."""
        hexd = hex_of(digest)
        return self.root / "sha256" / hexd[:2] / hexd[2:4] / hexd

    def path(self, digest: str) -> Path:
        """A readable local file for the object (may not exist: callers report it missing)."""
        return self.local_path(digest)

    def uri(self, digest: str) -> str:
        return "cas://sha256/" + hex_of(digest)

    def contains(self, digest: str) -> bool:
        return self.local_path(digest).is_file()

    def size(self, digest: str) -> int:
        try:
            return self.local_path(digest).stat().st_size
        except FileNotFoundError:
            raise MissingObjectError(digest) from None

    def put_bytes(self, data: bytes) -> str:
        digest = sha256_digest(data)
        self.put_hashed(digest, [data])
        return digest

    def put_hashed(self, digest: str, chunks: Iterable[bytes | memoryview]) -> bool:
        """Store ``chunks`` whose sha256 the caller computed already (a shard writer hashes while
        it chunks); they are written only if the object is absent. True if this call created it.
        The name is trusted here and checked on every read."""
        created = False
        if not self.contains(digest):
            created = self._publish(write_temp(self._tmp, chunks), digest)
        self.stats.record(created)
        return created

    def put_stream(self, stream: BinaryIO) -> tuple[str, int]:
        """Copy a stream into the store without holding it in memory; returns (digest, size)."""
        hasher = hashlib.sha256()
        size = 0

        def chunks() -> Iterator[bytes]:
            nonlocal size
            while block := stream.read(COPY_CHUNK):
                hasher.update(block)
                size += len(block)
                yield block

        return self._adopt(write_temp(self._tmp, chunks()), hasher_digest(hasher), size)

    def adopt_file(self, path: Path) -> tuple[str, int]:
        """Move a finished, fsynced file into the store by hard link instead of copying it.

        The file is hashed once (its name in the store must be the hash of what the disk holds);
        it falls back to a copy across filesystems. ``path`` is gone afterwards either way.
        """
        hasher = hashlib.sha256()
        size = 0
        with open(path, "rb") as handle:
            while block := handle.read(COPY_CHUNK):
                hasher.update(block)
                size += len(block)
        return self._adopt(path, hasher_digest(hasher), size)

    def adopt_hashed(self, path: Path, digest: str, size: int) -> tuple[str, int]:
        """Like ``adopt_file``, for a file whose sha256 the caller computed over the very bytes
        it wrote and fsynced (a download hashes while it receives): not read again here.

        The name is trusted like ``put_hashed``'s: the size is checked now and the bytes on every
        read, so a file that changed on disk after it was hashed is reported as corrupt by its
        first reader, never handed out. ``path`` is gone afterwards unless this raises.
        """
        check_digest(digest)
        on_disk = path.stat().st_size
        if on_disk != size:
            raise CasError(f"{path} holds {on_disk} bytes, not the {size} hashed to {digest}")
        return self._adopt(path, digest, size)

    def _adopt(self, path: Path, digest: str, size: int) -> tuple[str, int]:
        """Publish the file ``path`` (its sha256 is ``digest``) unless present; it is gone after."""
        if self.contains(digest):
            path.unlink(missing_ok=True)
            self.stats.record(False)
        else:
            self.stats.record(self._publish(path, digest))
        return digest, size

    def _publish(self, temp: Path, digest: str) -> bool:
        """Put-if-absent the file ``temp`` (whose sha256 is ``digest``) at the object's place by
        hard link (a copy across filesystems); ``temp`` is gone afterwards. True if created."""
        target = self.local_path(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(temp, target)
        except FileExistsError:
            return False
        except OSError:  # another filesystem (an adopted file): copy instead
            with open(temp, "rb") as handle:
                copy = write_temp(self._tmp, iter(lambda: handle.read(COPY_CHUNK), b""))
            return link_into_place(copy, target)
        finally:
            temp.unlink(missing_ok=True)
        fsync_dir(target.parent)
        return True

    def put_file(self, path: Path) -> tuple[str, int]:
        with open(path, "rb") as handle:
            return self.put_stream(handle)

    def get_bytes(self, digest: str, what: str = "object") -> bytes:
        check_digest(digest)
        try:
            data = self.path(digest).read_bytes()
        except FileNotFoundError:
            raise MissingObjectError(digest, what) from None
        actual = sha256_digest(data)
        if actual != digest:
            raise CorruptObjectError(digest, actual, what)
        return data

    def open(self, digest: str, what: str = "object") -> BinaryIO:
        """A streaming reader raising ``CorruptObjectError`` at EOF if the bytes do not match."""
        check_digest(digest)
        try:
            handle = open(self.path(digest), "rb")  # noqa: SIM115 - owned by the reader
        except FileNotFoundError:
            raise MissingObjectError(digest, what) from None
        return _VerifyingReader(handle, digest, what)

    def verify(self, digest: str, what: str = "object") -> None:
        with self.open(digest, what) as reader:
            while reader.read(COPY_CHUNK):
                pass

    def iter_digests(self) -> Iterator[str]:
        base = self.root / "sha256"
        if not base.is_dir():
            return
        for _dirpath, _dirs, files in os.walk(base):
            for name in files:
                yield PREFIX + name

    def listing(self) -> Iterator[tuple[str | None, str, int]]:
        """(digest, where, bytes) of every file under the object tree, in name order; the digest
        is None for a file not at the place its name gives (gc reports those, never removes)."""
        base = self.root / "sha256"
        for dirpath, dirs, files in os.walk(base):
            dirs.sort()
            for name in sorted(files):
                path = Path(dirpath, name)
                digest = PREFIX + name if HEX_NAME.match(name) else None
                if digest is not None and self.local_path(digest) != path:
                    digest = None
                yield digest, str(path), path.stat().st_size


class _VerifyingReader(io.RawIOBase):
    """Hands out the file's bytes while hashing them on a helper thread (``OverlappedHasher``),
    so a decoder reading the object runs alongside its check; at EOF the whole digest must match
    before the reader reports the end, so a consumer never sees a clean end of corrupt bytes."""

    def __init__(self, handle: BinaryIO, digest: str, what: str) -> None:
        self._handle = handle
        self._digest = digest
        self._what = what
        self._hasher = OverlappedHasher()
        self._done = False

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        block = self._handle.read(size)
        if block:
            self._hasher.update(block)  # bytes: safe to hash on the thread while handed out
        elif size and not self._done:
            self._done = True
            actual = PREFIX + self._hasher.hexdigest()
            self._hasher.close()
            if actual != self._digest:
                raise CorruptObjectError(self._digest, actual, self._what)
        return block

    def readall(self) -> bytes:
        chunks = []
        while block := self.read(COPY_CHUNK):
            chunks.append(block)
        return b"".join(chunks)

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        block = self.read(len(view))
        view[: len(block)] = block
        return len(block)

    def close(self) -> None:
        if not self.closed:
            try:
                self._hasher.close()
            finally:
                self._handle.close()
        super().close()
