"""Atomic file writes: nothing is ever visible half-written, whatever kills the process."""

import errno
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DiskFullError(OSError):
    """No space (or quota) left for a write. The message names the file and says what to do:
    the temp file is removed and finished work is kept, so a rerun with space resumes."""


FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(error: OSError, where: str) -> DiskFullError:
    return DiskFullError(
        error.errno,
        f"no space left on device writing {where}; nothing partial was kept: free space "
        "(or grow the disk) and rerun, finished work is reused",
    )


def write_temp(folder: Path, chunks: Iterable[bytes]) -> Path:
    """Write and fsync ``chunks`` to a fresh hidden temp file in ``folder``; a full disk is a
    ``DiskFullError`` naming the file."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = -1, str(folder / ".tmp-*")
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException as error:
        if fd != -1:
            Path(name).unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno in FULL:
            raise disk_full(error, name) from None  # the message says it all: no chain to unwrap
        raise
    return Path(name)


def atomic_write(path: Path, data: bytes) -> None:
    """Temp file in the same folder, fsync, ``os.replace``, fsync the folder."""
    temp = write_temp(path.parent, [data])
    os.replace(temp, path)
    fsync_dir(path.parent)


def atomic_create(path: Path, chunks: Iterable[bytes]) -> bool:
    """Publish ``chunks`` at ``path`` only if nothing is there yet; False if it already existed."""
    if path.exists():
        return False
    return link_into_place(write_temp(path.parent, chunks), path)


def link_into_place(temp: Path, path: Path) -> bool:
    """Atomically put-if-absent ``temp`` at ``path`` and remove ``temp``; False if ``path`` existed.

    A hard link never overwrites: two racing writers cannot both win, and a reader sees either
    nothing or the whole file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(temp, path)
    except FileExistsError:
        return False
    finally:
        temp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True
