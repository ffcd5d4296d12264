"""Content-addressed store: objects named by the sha256 of their bytes, put-if-absent, verified get.

Layout ``<root>/sha256/ab/cd/<hex>``. Every read re-hashes the bytes, so a flipped bit anywhere is
reported with the object's name instead of flowing silently into a training set.
"""

import hashlib
import io
import os
from collections.abc import Iterator
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

COPY_CHUNK = 1 << 20


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
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.stats = PutStats()
        self._tmp = self.root / "tmp"

    def path(self, digest: str) -> Path:
        hexd = hex_of(digest)
        return self.root / "sha256" / hexd[:2] / hexd[2:4] / hexd

    def uri(self, digest: str) -> str:
        return "cas://sha256/" + hex_of(digest)

    def contains(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def size(self, digest: str) -> int:
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            raise MissingObjectError(digest) from None

    def put_bytes(self, data: bytes) -> str:
        digest = sha256_digest(data)
        target = self.path(digest)
        created = False
        if not target.exists():
            created = link_into_place(write_temp(self._tmp, [data]), target)
        self.stats.record(created)
        return digest

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

        temp = write_temp(self._tmp, chunks())
        digest = hasher_digest(hasher)
        target = self.path(digest)
        if target.exists():
            temp.unlink(missing_ok=True)
            self.stats.record(False)
        else:
            self.stats.record(link_into_place(temp, target))
        return digest, size

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
        digest = hasher_digest(hasher)
        target = self.path(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except FileExistsError:
            self.stats.record(False)
        except OSError:  # another filesystem: copy instead
            digest, size = self.put_file(path)
        else:
            fsync_dir(target.parent)
            self.stats.record(True)
        path.unlink(missing_ok=True)
        return digest, size

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


class _VerifyingReader(io.RawIOBase):
    def __init__(self, handle: BinaryIO, digest: str, what: str) -> None:
        self._handle = handle
        self._digest = digest
        self._what = what
        self._hasher = hashlib.sha256()
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = self._handle.readinto(buffer)
        if count:
            self._hasher.update(memoryview(buffer)[:count])
        elif not self._done:
            self._done = True
            actual = hasher_digest(self._hasher)
            if actual != self._digest:
                raise CorruptObjectError(self._digest, actual, self._what)
        return count or 0

    def close(self) -> None:
        self._handle.close()
        super().close()
