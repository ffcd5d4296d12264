"""Resumable streaming HTTP(S) downloads into the CAS (seed 003).

The body streams to ``<work_dir>/<sha256(url)>.partial``; ``<same>.partial.json`` is the
checkpoint ``{url, verified_bytes, expected_size, sha256_prefix, etag, last_modified}``. Only
bytes whose prefix hash matches the checkpoint are ever trusted, so a dropped connection, a killed
process or a flipped bit on disk costs at most a re-download, never a silently wrong object.

Write order, and why it differs from the seed's wording. The seed says "checkpoint first, then
data", like a write-ahead log, to avoid a checkpoint that lags the file and makes the next resume
append duplicate suffix bytes. That failure only exists if a resume appends at the end of the
file. Here a resume always starts at ``verified_bytes``: on restart, a file longer than the
checkpoint is truncated to ``verified_bytes`` before the prefix is re-hashed, and a file shorter
than it, or a prefix that hashes differently, restarts from zero. Given that rule the safe order
is data first: append and fsync the bytes, then atomically replace the checkpoint (the commit
record). A crash between the two leaves extra unverified bytes that are cut off, losing at most
one checkpoint interval. Writing the checkpoint first would, after a crash in between, leave a
checkpoint claiming bytes the file never got, and the whole partial would have to be thrown away.
Whichever instant the process dies at, the invariant holds: the checkpoint never claims a byte
that is not durably on disk, and its hash covers exactly the bytes it claims.

The running sha256 stays in memory, so checkpoints (throttled by bytes and seconds) cost no
re-hash; only a new process re-hashes the prefix once. Memory is flat: one chunk at a time.
"""

import errno
import fcntl
import hashlib
import http.client
import json
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.fsio import atomic_write

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
MAX_BACKOFF_SECONDS = 5.0
HASH_CHUNK = 1 << 20
CONTENT_RANGE_RE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class RemoteVersion:
    """What the server says about an object; pass it as ``expected`` to pin that version."""

    url: str
    size: int | None
    etag: str | None
    last_modified: str | None


@dataclass(frozen=True)
class Fetched:
    """A published download; ``bytes_transferred`` counts every body byte received this call."""

    digest: str
    size: int
    etag: str | None
    last_modified: str | None
    bytes_transferred: int
    resumed: bool
    restarts: int


class DownloadError(RuntimeError):
    """A download failed for good; the message names the URL and the reason."""


class ResumeRefused(DownloadError):
    """Resume-only mode found no usable checkpoint, so it refuses to download from scratch."""


def head(url: str, timeout: float = 30.0) -> RemoteVersion:
    """Size and validators by HEAD, or by ``GET Range: bytes=0-0`` where HEAD is refused."""
    try:
        with _open(url, "HEAD", {}, timeout) as response:
            return _remote_version(url, response, _content_length(response))
    except urllib.error.HTTPError as error:
        error.close()
        if error.code not in (405, 501):
            raise DownloadError(f"{url}: HEAD answered HTTP {error.code} {error.reason}") from error
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        raise DownloadError(f"{url}: HEAD failed: {error}") from error
    try:
        with _open(url, "GET", {"Range": "bytes=0-0"}, timeout) as response:
            size = _content_length(response)
            if response.status == 206:
                parsed = _content_range(response)
                size = parsed[2] if parsed else None
            return _remote_version(url, response, size)
    except urllib.error.HTTPError as error:
        error.close()
        raise DownloadError(f"{url}: GET answered HTTP {error.code} {error.reason}") from error
    except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
        raise DownloadError(f"{url}: GET bytes=0-0 failed: {error}") from error


def fetch_to_cas(
    url: str,
    cas: ContentStore,
    work_dir: Path,
    *,
    expected: RemoteVersion | None = None,
    resume_only: bool = False,
    max_attempts: int = 50,
    chunk_size: int = 1 << 20,
    timeout: float = 30.0,
    backoff_seconds: float = 0.05,
    checkpoint_bytes: int = 4 << 20,
    checkpoint_seconds: float = 1.0,
) -> Fetched:
    """Download ``url`` into ``cas``, resuming from a verified checkpoint in ``work_dir``.

    ``expected`` pins a version (from ``head``): if the server's ETag, Last-Modified or size
    differ, ``DownloadError`` is raised instead of fetching different bytes (the partial is kept).
    Without it a changed object restarts from zero. ``resume_only`` raises ``ResumeRefused``
    rather than (re)start from byte zero. Drops, timeouts and 408/429/5xx answers are retried up
    to ``max_attempts`` requests, with exponential backoff from ``backoff_seconds``. A checkpoint
    is committed every ``checkpoint_bytes`` or ``checkpoint_seconds``, whichever comes first, and
    after every drop: a killed process loses at most that much. Two processes fetching the same
    URL into one ``work_dir`` are excluded by a lock on the partial file.
    """
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(url.encode("utf-8")).hexdigest()
    partial = work_dir / f"{key}.partial"
    fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise DownloadError(
                f"{url}: another process is downloading it into {partial}"
            ) from None
        download = _Download(
            url=url,
            cas=cas,
            handle=handle,
            partial=partial,
            checkpoint=work_dir / f"{key}.partial.json",
            expected=expected,
            resume_only=resume_only,
            chunk_size=chunk_size,
            timeout=timeout,
            checkpoint_bytes=checkpoint_bytes,
            checkpoint_seconds=checkpoint_seconds,
        )
        return download.run(max_attempts, backoff_seconds)


class _Dropped(Exception):
    """A retryable network failure after ``received`` body bytes of this attempt."""

    def __init__(self, reason: str, received: int = 0) -> None:
        super().__init__(reason)
        self.received = received


@dataclass
class _State:
    """What the bytes on disk are: how many are verified and which version they belong to."""

    verified: int = 0
    hasher: Any = field(default_factory=hashlib.sha256)
    expected_size: int | None = None
    etag: str | None = None
    last_modified: str | None = None

    @property
    def complete(self) -> bool:
        return self.expected_size is not None and self.verified == self.expected_size


@dataclass
class _Download:
    url: str
    cas: ContentStore
    handle: BinaryIO
    partial: Path
    checkpoint: Path
    expected: RemoteVersion | None
    resume_only: bool
    chunk_size: int
    timeout: float
    checkpoint_bytes: int
    checkpoint_seconds: float
    state: _State = field(default_factory=_State)
    transferred: int = 0
    restarts: int = 0
    resumed: bool = False
    _saved: tuple[int, str | None, str | None, int | None] | None = None
    _saved_at: float = 0.0

    def run(self, max_attempts: int, backoff_seconds: float) -> Fetched:
        self._start()
        attempts = 0
        failures = 0
        last_error = "no attempt made"
        while not self.state.complete:
            if attempts >= max_attempts:
                raise DownloadError(
                    f"{self.url}: gave up after {attempts} attempts at byte {self.state.verified}"
                    f" of {self.state.expected_size}: {last_error}"
                )
            if failures:
                time.sleep(min(backoff_seconds * 2 ** (failures - 1), MAX_BACKOFF_SECONDS))
            attempts += 1
            try:
                self._attempt()
                failures = 0
            except _Dropped as drop:
                last_error = str(drop)
                failures = 1 if drop.received else failures + 1
                self._save()
        return self._publish()

    def _start(self) -> None:
        """Adopt the checkpoint if the on-disk prefix still hashes to it, else start from zero."""
        reason = self._load()
        if reason is None and self.expected is not None:
            differences = _differences(self.expected, self._version())
            if differences:
                reason = f"the checkpoint holds another version ({differences})"
        if reason is None and self.resume_only and not (self.state.verified or self.state.complete):
            reason = "the checkpoint has no verified bytes"  # resuming at 0 is starting over
        if reason is None:
            self.resumed = self.state.verified > 0
            return
        if self.resume_only:
            raise ResumeRefused(
                f"{self.url}: resume-only mode and no usable checkpoint ({reason});"
                " refusing to download from scratch"
            )
        if reason != "no checkpoint":
            self.restarts += 1
        self._reset()

    def _load(self) -> str | None:
        try:
            payload = json.loads(self.checkpoint.read_bytes())
        except FileNotFoundError:
            return "no checkpoint"
        except (OSError, ValueError) as error:
            return f"unreadable checkpoint: {error}"
        try:
            verified = int(payload["verified_bytes"])
            expected_size = payload["expected_size"]
            prefix = str(payload["sha256_prefix"])
            state = _State(
                verified=verified,
                expected_size=None if expected_size is None else int(expected_size),
                etag=payload["etag"],
                last_modified=payload["last_modified"],
            )
            if payload["url"] != self.url:
                return f"checkpoint is for {payload['url']}"
        except (KeyError, TypeError, ValueError) as error:
            return f"malformed checkpoint: {error!r}"
        if verified < 0 or (state.expected_size is not None and verified > state.expected_size):
            return f"checkpoint claims {verified} of {state.expected_size} bytes"
        on_disk = os.fstat(self.handle.fileno()).st_size
        if on_disk < verified:
            return f"partial file has {on_disk} bytes but the checkpoint verified {verified}"
        if on_disk > verified:  # appended after the last checkpoint: unverified, cut off
            self.handle.truncate(verified)
        self.handle.seek(0)
        remaining = verified
        while remaining:
            block = self.handle.read(min(HASH_CHUNK, remaining))
            if not block:
                return "partial file shrank while it was re-hashed"
            state.hasher.update(block)
            remaining -= len(block)
        if state.hasher.hexdigest() != prefix:
            return "partial file's prefix does not hash to its checkpoint"
        self.state = state
        self._saved = self._signature()
        self._saved_at = time.monotonic()
        return None

    def _reset(self) -> None:
        """Forget every byte on disk: truncate first, so a crash here never leaves a claim."""
        self.handle.seek(0)
        self.handle.truncate(0)
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.checkpoint.unlink(missing_ok=True)
        self.state = _State()
        self._saved = None
        self.resumed = False

    def _restart(self, reason: str) -> None:
        if self.resume_only:
            raise ResumeRefused(
                f"{self.url}: resume-only mode and {reason}; refusing to download from scratch"
            )
        self.restarts += 1
        self._reset()

    def _attempt(self) -> None:
        """One GET from the verified offset; returns when the body ended cleanly."""
        offset = self.state.verified
        headers: dict[str, str] = {}
        if offset:
            headers["Range"] = f"bytes={offset}-"
            validator = _if_range(self.state)
            if validator:
                headers["If-Range"] = validator
        try:
            response = _open(self.url, "GET", headers, self.timeout)
        except urllib.error.HTTPError as error:
            error.close()
            if error.code in RETRYABLE_STATUS:
                raise _Dropped(f"HTTP {error.code} {error.reason}") from None
            if error.code == 416 and offset:
                self._restart(f"the server refused the range from byte {offset} (HTTP 416)")
                return
            raise DownloadError(f"{self.url}: HTTP {error.code} {error.reason}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            raise _Dropped(f"request failed: {error!r}") from None
        with response:
            self._take(response, offset)

    def _take(self, response: http.client.HTTPResponse, offset: int) -> None:
        etag, last_modified = _validators(response)
        if response.status == 206:
            parsed = _content_range(response)
            # "bytes a-b/*": the total is unknown; keep the one we learnt earlier, if any.
            total = parsed[2] if parsed and parsed[2] is not None else self.state.expected_size
        elif response.status == 200:
            total = _content_length(response)
        else:
            raise DownloadError(f"{self.url}: unexpected HTTP {response.status} to a GET")
        seen = RemoteVersion(self.url, total, etag, last_modified)
        if self.expected is not None:
            differences = _differences(self.expected, seen)
            if differences:
                raise DownloadError(
                    f"{self.url}: the object no longer matches its pinned version"
                    f" ({differences}); refusing to fetch different bytes"
                )
        changed = _differences(self._version(), seen) if offset else ""
        if response.status == 206:
            if changed:
                self._restart(f"the object changed ({changed})")
                return
            if parsed is None or parsed[0] != offset:
                self._restart(
                    f"the server answered Content-Range {response.headers.get('Content-Range')!r}"
                    f" to a request from byte {offset}"
                )
                return
            self.resumed = self.resumed or offset > 0
        elif offset:
            self._restart(
                f"the object changed ({changed})" if changed else "the server ignored the Range"
            )
        state = self.state
        state.etag, state.last_modified, state.expected_size = etag, last_modified, total
        self._save()
        declared = response.length
        received = 0
        while True:
            try:
                block = response.read1(self.chunk_size)
            except (OSError, http.client.HTTPException) as error:
                raise _Dropped(
                    f"connection dropped after {received} bytes: {error!r}", received
                ) from error
            if not block:
                break
            if total is not None and state.verified + len(block) > total:
                raise DownloadError(
                    f"{self.url}: server sent more than the {total} bytes it declared"
                )
            self.handle.write(block)
            state.hasher.update(block)
            state.verified += len(block)
            received += len(block)
            self.transferred += len(block)
            if (
                state.verified - (self._saved[0] if self._saved else 0) >= self.checkpoint_bytes
                or time.monotonic() - self._saved_at >= self.checkpoint_seconds
            ):
                self._save()
        if declared is not None and received < declared:
            raise _Dropped(f"body ended after {received} of {declared} bytes", received)
        if total is None:  # no length announced: a clean end (chunked terminator) is the end
            state.expected_size = state.verified

    def _version(self) -> RemoteVersion:
        state = self.state
        return RemoteVersion(self.url, state.expected_size, state.etag, state.last_modified)

    def _signature(self) -> tuple[int, str | None, str | None, int | None]:
        state = self.state
        return (state.verified, state.etag, state.last_modified, state.expected_size)

    def _save(self) -> None:
        """Make the appended bytes durable, then commit them in the checkpoint (data first)."""
        if self._saved == self._signature():
            return
        self.handle.flush()
        os.fsync(self.handle.fileno())
        state = self.state
        payload = {
            "url": self.url,
            "verified_bytes": state.verified,
            "expected_size": state.expected_size,
            "sha256_prefix": state.hasher.hexdigest(),
            "etag": state.etag,
            "last_modified": state.last_modified,
        }
        atomic_write(self.checkpoint, json.dumps(payload, sort_keys=True).encode("utf-8"))
        self._saved = self._signature()
        self._saved_at = time.monotonic()

    def _publish(self) -> Fetched:
        self._save()
        state = self.state
        digest = "sha256:" + state.hasher.hexdigest()
        stored, size = self.cas.adopt_file(self.partial)  # re-hashes what the disk holds
        if stored != digest or size != state.verified:
            self._reset()
            raise DownloadError(
                f"{self.url}: the partial file changed on disk: received {state.verified} bytes"
                f" hashing to {digest}, the file holds {size} bytes hashing to {stored}"
            )
        self.checkpoint.unlink(missing_ok=True)
        self.partial.unlink(missing_ok=True)
        return Fetched(
            digest=digest,
            size=size,
            etag=state.etag,
            last_modified=state.last_modified,
            bytes_transferred=self.transferred,
            resumed=self.resumed,
            restarts=self.restarts,
        )


def _open(
    url: str, method: str, headers: dict[str, str], timeout: float
) -> http.client.HTTPResponse:
    request = urllib.request.Request(
        url, method=method, headers={"Accept-Encoding": "identity", **headers}
    )
    return urllib.request.urlopen(request, timeout=timeout)


def _validators(response: http.client.HTTPResponse) -> tuple[str | None, str | None]:
    return response.headers.get("ETag"), response.headers.get("Last-Modified")


def _remote_version(
    url: str, response: http.client.HTTPResponse, size: int | None
) -> RemoteVersion:
    etag, last_modified = _validators(response)
    return RemoteVersion(url=url, size=size, etag=etag, last_modified=last_modified)


def _content_length(response: http.client.HTTPResponse) -> int | None:
    value = response.headers.get("Content-Length")
    return int(value) if value and value.strip().isdigit() else None


def _content_range(response: http.client.HTTPResponse) -> tuple[int, int, int | None] | None:
    match = CONTENT_RANGE_RE.match(response.headers.get("Content-Range") or "")
    if not match:
        return None
    total = None if match[3] == "*" else int(match[3])
    return int(match[1]), int(match[2]), total


def _if_range(state: _State) -> str | None:
    """If-Range needs a strong validator: a weak ETag would make every resume a full restart."""
    if state.etag and not state.etag.startswith("W/"):
        return state.etag
    return state.last_modified


def _differences(known: RemoteVersion, seen: RemoteVersion) -> str:
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
