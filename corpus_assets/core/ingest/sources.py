"""Source listing and cheap change fingerprints, for every source kind.

Listing is sorted by name (relative POSIX path for folders, the URL for URL sources) so every
machine sees the same order. A listed object carries a cheap *version* - ``mtime_ns`` for local
files, the ETag or Last-Modified for HTTP - that the discovery sensor compares between ticks; the
pinned sha256 of the bytes is only taken at freeze time.
"""

import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from corpus_assets.core.ingest.changelog import head_offset, list_segments
from corpus_assets.core.ingest.folder_listing import (
    FolderEntry,
    OutsideFolder,
    folder_entry,
    in_store,
    list_folder,
)
from corpus_assets.core.ingest.remote_http import DownloadError, head
from corpus_assets.core.runtime.config import ChangelogSource, LoadedConfig, ObjectsSource
from corpus_assets.core.storage.digests import json_digest

INDEX_LIMIT = 64 << 20


class SourceError(RuntimeError):
    """A source cannot be listed or read; the message names the source and object."""


@dataclass(frozen=True)
class ListedObject:
    """One object as a listing saw it: where it is and its cheap version."""

    name: str
    location: str
    size: int | None
    version: str

    @property
    def remote(self) -> bool:
        return self.location.startswith(("http://", "https://"))


def local_object(name: str, path: Path) -> ListedObject:
    stat = path.stat()
    return ListedObject(name, str(path), stat.st_size, f"mtime_ns:{stat.st_mtime_ns}")


def version_of(etag: str | None, last_modified: str | None) -> str:
    """The cheap version of a remote object: its ETag, else its Last-Modified, else unversioned."""
    if etag:
        return f"etag:{etag}"
    return f"last-modified:{last_modified}" if last_modified else ""


def remote_object(url: str) -> ListedObject:
    version = head(url)
    return ListedObject(url, url, version.size, version_of(version.etag, version.last_modified))


def url_object(url: str) -> ListedObject:
    if url.startswith("file://"):
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)).resolve()
        if not path.is_file():
            raise FileNotFoundError(path)
        return local_object(url, path)  # its real path: the pin checks it still resolves there
    return remote_object(url)


@dataclass(frozen=True)
class IndexFile:
    """An index file as read once: the object URLs listed are those of exactly these bytes."""

    location: str
    data: bytes
    urls: list[str]


@dataclass(frozen=True)
class Listing:
    """A listing of an ``objects`` source, with the index it was listed from (if any)."""

    objects: list[ListedObject]
    index: IndexFile | None = None


def read_index(loaded: LoadedConfig, source: ObjectsSource) -> IndexFile:
    """Read the index once: its location, its bytes, and the URLs they list (relative resolved)."""
    assert source.index is not None
    location = source.index
    if "://" not in location:
        location = loaded.resolve(location).as_uri()
    try:
        with urllib.request.urlopen(location, timeout=30) as response:
            data = response.read(INDEX_LIMIT + 1)
    except OSError as error:
        raise SourceError(f"source {source.id!r}: cannot read index {location}: {error}") from None
    if len(data) > INDEX_LIMIT:
        raise SourceError(f"source {source.id!r}: index {location} is larger than 64 MiB")
    urls = []
    for number, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        url = urllib.parse.urljoin(location, entry)
        if not url.startswith(("file://", "http://", "https://")):
            raise SourceError(f"source {source.id!r}: index {location} line {number}: bad URL")
        urls.append(url)
    return IndexFile(location, data, urls)


def list_objects(
    loaded: LoadedConfig, source: ObjectsSource, missing_ok: bool = False
) -> list[ListedObject]:
    """Every object of an ``objects`` source, sorted by name (``list_source`` without the index)."""
    return list_source(loaded, source, missing_ok).objects


def list_source(loaded: LoadedConfig, source: ObjectsSource, missing_ok: bool = False) -> Listing:
    """Every object of an ``objects`` source, sorted by name, and the index read to list them.

    The index is read once and the objects are listed from those bytes, so a freeze can pin the
    index that was used even if it is rewritten meanwhile. A URL that the source names but that
    does not exist is an error naming it, unless ``missing_ok`` (the re-listing after a freeze,
    where a deletion is a fact to report).
    """
    if source.path is not None:
        return Listing(_list_folder(loaded, source))
    index = read_index(loaded, source) if source.urls is None else None
    urls = source.urls if index is None else index.urls
    assert urls is not None
    listed = []
    home = loaded.data_home()
    for url in sorted(set(urls)):
        _refuse_home_url(source, url, home)
        try:
            listed.append(url_object(url))
        except (OSError, DownloadError) as error:
            if missing_ok and _is_missing(error):
                continue
            raise SourceError(f"source {source.id!r}: cannot list {url}: {error}") from None
    return Listing(listed, index)


def _refuse_home_url(source: ObjectsSource, url: str, home: Path) -> None:
    """A ``file://`` URL (named, or listed by an index) never reads the data home's store."""
    if not url.startswith("file://"):
        return
    path = Path(urllib.parse.unquote(urllib.parse.urlparse(url).path)).resolve()
    if in_store(path, home):
        raise SourceError(
            f"source {source.id!r}: {url} resolves to {path}, inside the data home {home}; "
            "refused (sources are never read from the data home)"
        )


def _list_folder(loaded: LoadedConfig, source: ObjectsSource) -> list[ListedObject]:
    """The folder's files by the one folder rule (``folder_listing``): never out of the folder,
    never under the data home."""
    assert source.path is not None
    root = loaded.resolve(source.path)
    if not root.is_dir():
        raise SourceError(f"source {source.id!r}: folder {root} does not exist")
    try:
        entries = list_folder(root, source.include, loaded.data_home())
    except OutsideFolder as error:
        raise SourceError(f"source {source.id!r}: {error}") from None
    return [_listed(entry) for entry in entries]


def _listed(entry: FolderEntry) -> ListedObject:
    return ListedObject(entry.name, str(entry.path), entry.size, f"mtime_ns:{entry.mtime_ns}")


def relist_local(loaded: LoadedConfig, source: ObjectsSource, name: str) -> ListedObject:
    """Object ``name`` of a folder source listed again by the same rule (it changed after the
    listing: a link swapped in meanwhile is refused like one there from the start)."""
    assert source.path is not None
    try:
        entry = folder_entry(loaded.resolve(source.path), name, loaded.data_home())
    except OutsideFolder as error:
        raise SourceError(f"source {source.id!r}: {error}") from None
    if entry is None:
        raise FileNotFoundError(name)
    return _listed(entry)


def _is_missing(error: Exception) -> bool:
    cause = error.__cause__ if isinstance(error, DownloadError) else error
    if isinstance(cause, urllib.error.HTTPError):
        return cause.code in (404, 410)
    return isinstance(cause, FileNotFoundError)


def fingerprint(loaded: LoadedConfig) -> str:
    """Digest of every source's cheap state; it changes when an object or segment changes."""
    state: dict[str, object] = {}
    for source in loaded.config.sources:
        if isinstance(source, ChangelogSource):
            segments = list_segments(
                loaded.resolve(source.path), source.include, loaded.data_home()
            )
            head = head_offset(segments)
            state[source.id] = {
                "segments": [[s.name, str(s.size), str(s.mtime_ns)] for s in segments],
                "head": None if head is None else str(head),
            }
        else:
            state[source.id] = [
                [o.name, str(o.size), o.version]
                for o in list_objects(loaded, source, missing_ok=True)
            ]
    return json_digest(state)


def check_source_folders(loaded: LoadedConfig) -> None:
    """Before a build adds its partition: every local source ``path`` is an existing folder (a
    file named there, or nothing, is the user's mistake, told in one line naming the source)."""
    for source in loaded.config.sources:
        if source.path is None:
            continue
        root = loaded.resolve(source.path)
        if not root.exists():
            raise SourceError(f"source {source.id!r}: path {root} does not exist")
        if not root.is_dir():
            raise SourceError(f"source {source.id!r}: path {root} is not a folder")
