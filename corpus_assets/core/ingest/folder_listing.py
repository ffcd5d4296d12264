"""Listing a source folder without leaving it: the one walk every folder source uses.

A source is read from its folder and from nothing else. A file symlink is followed
only when its target resolves inside the folder and outside the data home; any other is refused
in one line naming the link and its target (``rsync --safe-links`` made an error, not a skip: a
key or secret linked in beside the data, by mistake or by an attacker, must never be pinned into
the CAS, from where it would be read by every consumer and uploaded to an S3 CAS). A symlink to
a folder is never descended, as ``Path.rglob`` never did: its files are listed under their real
names, and a loop cannot hang the listing. A data home inside the folder is pruned, never read;
the home itself, or a folder in its store (CAS, keys, downloads), is refused as a source folder
(a source folder kept in the home, as the demo's, is fine: nothing is read outside it). The
folder itself is resolved once, so a linked root names one real folder for the whole listing.
Dangling links and link loops hold no bytes and are not listed. Hard links cannot be told from
the path and are not judged.
"""

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# the data home's own store (CAS, signing keys, downloads, temp files, locks): never a source
STORE_PARTS = frozenset({"cas", "keys", "downloads", "tmp", "locks"})


class OutsideFolder(RuntimeError):
    """An entry leads out of its source folder or into the data home; the message names both."""


@dataclass(frozen=True)
class FolderEntry:
    """One listed file: its relative POSIX name and the real file its bytes are read from."""

    name: str
    path: Path
    size: int
    mtime_ns: int


def matches(name: str, include: Sequence[str]) -> bool:
    """``name`` matches an include glob the way ``rglob(glob)`` would: at the path's end."""
    path = PurePosixPath(name)
    return any(path.match(g) or (g.startswith("**/") and path.match(g[3:])) for g in include)


def list_folder(root: Path, include: Sequence[str], home: Path | None) -> list[FolderEntry]:
    """Files under ``root`` matching ``include`` (dot-files left out), sorted by name."""
    real_root, real_home = root.resolve(), _guarded_home(root.resolve(), home)
    found: dict[str, FolderEntry] = {}
    for entry in _files(real_root, real_home):
        name = Path(entry.path).relative_to(real_root).as_posix()
        if entry.name.startswith(".") or not matches(name, include):
            continue
        listed = _entry(real_root, real_home, name, entry.is_symlink())
        if listed is not None:
            found[name] = listed
    return [found[name] for name in sorted(found)]


def in_store(real: Path, real_home: Path) -> bool:
    """``real`` is the data home's own: a file at its top (catalog, config) or in a store part."""
    if not real.is_relative_to(real_home):
        return False
    parts = real.relative_to(real_home).parts
    return len(parts) <= 1 or parts[0] in STORE_PARTS


def _guarded_home(real_root: Path, home: Path | None) -> Path | None:
    """The data home the listing must keep out of: None when the folder is itself a source
    folder kept in the home (the demo's ``demo-sources``), since the walk never leaves the
    folder; refused when the folder is the home, or inside one of the store's own parts."""
    real_home = home.resolve() if home else None
    if real_home is None or not real_root.is_relative_to(real_home):
        return real_home
    if in_store(real_root / "x", real_home):  # a file in the folder would be the store's
        raise OutsideFolder(
            f"folder {real_root} is the data home {real_home} or part of its store; sources "
            "are never read from the data home's store"
        )
    return None


def _files(real_root: Path, real_home: Path | None) -> Iterator[os.DirEntry[str]]:
    """Every non-folder entry under ``real_root``; folder links and the data home not entered."""
    pending = [real_root]
    while pending:
        try:
            with os.scandir(pending.pop()) as scan:
                entries = list(scan)
        except FileNotFoundError:
            continue  # removed while listing: not part of this listing
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                yield entry
            elif real_home is None or not Path(entry.path).is_relative_to(real_home):
                pending.append(Path(entry.path))


def folder_entry(root: Path, name: str, home: Path | None) -> FolderEntry | None:
    """``name`` under ``root`` taken again by the listing's rule (None: no regular file there
    now), for a pin that found it changed since the listing."""
    real_root = root.resolve()
    return _entry(real_root, _guarded_home(real_root, home), name, link=True)


def _entry(real_root: Path, real_home: Path | None, name: str, link: bool) -> FolderEntry | None:
    """``name`` under ``real_root`` as the listing takes it (None: no regular file there now);
    a link is resolved and refused if it leads out of the folder or into the data home."""
    path = real_root / name
    try:
        real = path.resolve(strict=True) if link else path
        status = real.stat()
    except (FileNotFoundError, RuntimeError):  # gone, dangling, or a link loop: no bytes
        return None
    except OSError as error:  # ELOOP on the way
        if error.errno == errno.ELOOP:
            return None
        raise
    if real != path:
        if real_home is not None and real.is_relative_to(real_home):
            where = f"inside the data home {real_home}"
        elif not real.is_relative_to(real_root):
            where = f"outside the source folder {real_root}"
        else:
            where = ""
        if where:
            raise OutsideFolder(
                f"{name} is a symlink to {real}, {where}; refused (a source is read from its "
                "own folder only: copy the file in, or point the source at its folder)"
            )
    if not stat.S_ISREG(status.st_mode):
        return None
    return FolderEntry(name, real, status.st_size, status.st_mtime_ns)
