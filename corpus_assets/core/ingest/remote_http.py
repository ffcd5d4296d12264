"""What HTTP says about a remote object - size, ETag, Last-Modified - and whether it changed.

Listing (a cheap version per object) and downloading (pinning that version while resuming) must
read the same headers the same way, so both go through here.
"""

import http.client
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

CONTENT_RANGE_RE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


class DownloadError(RuntimeError):
    """A download failed for good; the message names the URL and the reason."""


@dataclass(frozen=True)
class RemoteVersion:
    """What the server says about an object; pass it as ``expected`` to pin that version."""

    url: str
    size: int | None
    etag: str | None
    last_modified: str | None


def head(url: str, timeout: float = 30.0) -> RemoteVersion:
    """Size and validators by HEAD, or by ``GET Range: bytes=0-0`` where HEAD is refused."""
    try:
        with open_url(url, "HEAD", {}, timeout) as response:
            return remote_version(url, response, content_length(response))
    except urllib.error.HTTPError as error:
        error.close()
        if error.code not in (405, 501):
            raise DownloadError(f"{url}: HEAD answered HTTP {error.code} {error.reason}") from error
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        raise DownloadError(f"{url}: HEAD failed: {error}") from error
    try:
        with open_url(url, "GET", {"Range": "bytes=0-0"}, timeout) as response:
            size = content_length(response)
            if response.status == 206:
                parsed = content_range(response)
                size = parsed[2] if parsed else None
            return remote_version(url, response, size)
    except urllib.error.HTTPError as error:
        error.close()
        raise DownloadError(f"{url}: GET answered HTTP {error.code} {error.reason}") from error
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        raise DownloadError(f"{url}: GET bytes=0-0 failed: {error}") from error


def open_url(
    url: str, method: str, headers: dict[str, str], timeout: float
) -> http.client.HTTPResponse:
    """A request for the identity encoding: the bytes hashed are the bytes the server holds."""
    request = urllib.request.Request(
        url, method=method, headers={"Accept-Encoding": "identity", **headers}
    )
    return urllib.request.urlopen(request, timeout=timeout)


def validators(response: http.client.HTTPResponse) -> tuple[str | None, str | None]:
    return response.headers.get("ETag"), response.headers.get("Last-Modified")


def remote_version(url: str, response: http.client.HTTPResponse, size: int | None) -> RemoteVersion:
    etag, last_modified = validators(response)
    return RemoteVersion(url=url, size=size, etag=etag, last_modified=last_modified)


def content_length(response: http.client.HTTPResponse) -> int | None:
    value = response.headers.get("Content-Length")
    return int(value) if value and value.strip().isdigit() else None


def content_range(response: http.client.HTTPResponse) -> tuple[int, int, int | None] | None:
    """``(first, last, total)`` of a Content-Range header; total None for ``bytes a-b/*``."""
    match = CONTENT_RANGE_RE.match(response.headers.get("Content-Range") or "")
    if not match:
        return None
    total = None if match[3] == "*" else int(match[3])
    return int(match[1]), int(match[2]), total


def if_range(version: RemoteVersion) -> str | None:
    """If-Range needs a strong validator: a weak ETag would make every resume a full restart."""
    if version.etag and not version.etag.startswith("W/"):
        return version.etag
    return version.last_modified


def differences(known: RemoteVersion, seen: RemoteVersion) -> str:
    """Which validators of ``seen`` contradict ``known``; empty when none do.

    A validator the server stops sending counts as changed: without it nothing proves the bytes
    are the same. Sizes are compared only when both are known.
    """
    diffs = []
    if known.etag is not None and seen.etag != known.etag:
        diffs.append(f"ETag {known.etag} -> {seen.etag}")
    if known.last_modified is not None and seen.last_modified != known.last_modified:
        diffs.append(f"Last-Modified {known.last_modified} -> {seen.last_modified}")
    if known.size is not None and seen.size is not None and seen.size != known.size:
        diffs.append(f"size {known.size} -> {seen.size}")
    return "; ".join(diffs)
