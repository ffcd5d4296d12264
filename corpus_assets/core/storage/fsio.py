"""Atomic file writes: nothing is ever visible half-written, whatever kills the process."""

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


def write_temp(folder: Path, chunks: Iterable[bytes]) -> Path:
    """Write and fsync ``chunks`` to a fresh hidden temp file in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            for chunk in chunks:
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        Path(name).unlink(missing_ok=True)
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
