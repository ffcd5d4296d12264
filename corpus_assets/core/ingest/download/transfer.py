"""Resumable streaming HTTP(S) downloads into the CAS: requests, retries, resumes.

Each attempt asks for the bytes from the verified offset (``Range`` with ``If-Range``) and only
appends a body that provably continues the same version; anything else restarts from zero or, when
a version is pinned, fails. Retries are counted only while they get nowhere: an attempt that
advances the verified prefix resets the count, so a server that drops every few kilobytes still
delivers a large object. What a server ignoring Range costs is bounded instead by bytes: one call
receives at most ``transfer_budget`` times the object's size, then names the server's behaviour.
What is verified on disk, and when it is committed, is
``checkpoint``'s business. Memory is flat: one chunk at a time. With ``validate`` a
compressed object is also decoded as it arrives (``decode``), so the download fails with
``InvalidObject`` as soon as the object proves truncated, corrupt or a bomb (never publishing it).
"""

import contextlib
import http.client
import os
import socket
import time
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial as bind
from pathlib import Path

from corpus_assets.core.ingest.codecs import CodecError, DecompressionLimits
from corpus_assets.core.ingest.download.checkpoint import PartialFile, ResumeRefused, locked_partial
from corpus_assets.core.ingest.download.decode import DecodeCheck, Decoded
from corpus_assets.core.ingest.remote_http import (
    DownloadError,
    RemoteVersion,
    content_length,
    content_range,
    differences,
    if_range,
    open_url,
    validators,
)
from corpus_assets.core.storage.cas import ContentStore

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
MAX_BACKOFF_SECONDS = 5.0
# Body bytes one call may receive, as a multiple of the object's size. A server honouring Range
# never needs more than 1x (every byte received is kept); 3x lets a server that ignores Range
# drop twice near the end and still deliver, and stops one that keeps dropping at ~3x, not ~30x.
TRANSFER_BUDGET = 3.0


@dataclass(frozen=True)
class Fetched:
    """A published download; ``bytes_transferred`` counts every body byte received this call.
    ``codec`` and ``decoded_bytes`` are what ``validate`` found (None without it; a plain object
    has no decoded size)."""

    digest: str
    size: int
    etag: str | None
    last_modified: str | None
    bytes_transferred: int
    resumed: bool
    restarts: int
    codec: str | None = None
    decoded_bytes: int | None = None


class OverBudget(DownloadError):
    """The call received ``transfer_budget`` times the object's size without finishing it (a
    server that ignores Range and keeps dropping); the verified prefix is kept. Retrying at
    once would only fetch the same bytes again."""


class InvalidObject(DownloadError):
    """The object downloaded faithfully but does not decode (``validate``): truncated, corrupt or
    a bomb. The partial is kept, so a rerun re-checks it without the network unless the object
    changed; retrying the same version cannot help."""


def fetch_to_cas(
    url: str,
    cas: ContentStore,
    work_dir: Path,
    *,
    expected: RemoteVersion | None = None,
    resume_only: bool = False,
    max_attempts_without_progress: int = 50,
    transfer_budget: float = TRANSFER_BUDGET,
    chunk_size: int = 1 << 20,
    timeout: float = 30.0,
    backoff_seconds: float = 0.05,
    checkpoint_bytes: int = 32 << 20,
    checkpoint_seconds: float = 1.0,
    validate: DecompressionLimits | None = None,
) -> Fetched:
    """Download ``url`` into ``cas``, resuming from a verified checkpoint in ``work_dir``.

    ``expected`` pins a version (from ``head``): if the server's ETag, Last-Modified or size
    differ, ``DownloadError`` is raised instead of fetching different bytes (the partial is kept).
    Without it a changed object restarts from zero. ``resume_only`` raises ``ResumeRefused``
    rather than (re)start from byte zero, and then creates no file for a URL with no partial.
    Drops, timeouts and 408/429/5xx answers are retried until ``max_attempts_without_progress``
    attempts in a row have not advanced the verified prefix, with exponential backoff from
    ``backoff_seconds`` (doubling per such attempt); an attempt that advanced resets the count.
    Receiving more than ``transfer_budget`` times the object's size (the longest prefix held
    when the size is unknown) raises ``OverBudget``; a restart from zero that would pass it is
    refused before its body is read. A checkpoint
    is committed every ``checkpoint_bytes`` or ``checkpoint_seconds``, whichever comes first, and
    after every drop: a killed process loses at most that much. Two processes fetching the same
    URL into one ``work_dir`` are excluded by a lock on the partial file.

    ``validate`` decodes a zstd or gzip object within those limits while it downloads (a resumed
    one from its first byte on disk) and raises ``InvalidObject`` naming the URL if it does not
    decode to a clean end; nothing is published then.
    """
    decoding = None if validate is None else bind(DecodeCheck, url, validate)
    with locked_partial(
        url,
        work_dir,
        checkpoint_bytes=checkpoint_bytes,
        checkpoint_seconds=checkpoint_seconds,
        decoding=decoding,
        resume_only=resume_only,
    ) as partial:
        download = _Download(
            url=url,
            cas=cas,
            partial=partial,
            expected=expected,
            resume_only=resume_only,
            chunk_size=chunk_size,
            timeout=timeout,
            budget=transfer_budget,
        )
        return download.run(max_attempts_without_progress, backoff_seconds)


class _Dropped(Exception):
    """A retryable network failure of one attempt."""


@dataclass
class _Download:
    url: str
    cas: ContentStore
    partial: PartialFile
    expected: RemoteVersion | None
    resume_only: bool
    chunk_size: int
    timeout: float
    budget: float
    transferred: int = 0
    restarts: int = 0
    resumed: bool = False
    ignored_range: int = 0  # resumes the server answered with the whole object
    scale: int = 0  # the largest size announced or prefix held this call: what budget multiplies
    last_error: str = "no attempt made"
    last_restart: str = ""

    def run(self, max_without_progress: int, backoff_seconds: float) -> Fetched:
        """Attempt until complete; only attempts that leave the verified prefix no longer than
        they found it count towards giving up (and lengthen the backoff)."""
        self._start()
        fruitless = 0
        attempted = False
        while not self.partial.state.complete:
            if fruitless >= max_without_progress:
                raise DownloadError(self._gave_up(fruitless))
            if attempted:
                time.sleep(min(backoff_seconds * 2**fruitless, MAX_BACKOFF_SECONDS))
            attempted = True
            before = self.partial.state.verified
            try:
                self._attempt()
            except _Dropped as drop:
                self.last_error = str(drop)
                self.partial.save()
                self._check_decoding()  # bytes that do not decode are final: no retry
            fruitless = 0 if self.partial.state.verified > before else fruitless + 1
        return self._publish()

    def _gave_up(self, fruitless: int) -> str:
        state = self.partial.state
        return (
            f"{self.url}: gave up after {fruitless} attempts in a row without progress at byte"
            f" {state.verified} of {state.expected_size}: {self.last_error}{self._range_note()}"
        )

    def _range_note(self) -> str:
        """What the server did to resumes, when it ignored Range ("" when it never did)."""
        if not self.ignored_range:
            return ""
        return (
            f"; the server ignores Range (it answered {self.ignored_range} resume(s) with the"
            " whole object from byte 0) and keeps dropping the connection"
        )

    def _check_budget(self, more: int, held: int, restarting: str = "") -> None:
        """Raise ``OverBudget`` before receiving ``more`` bytes (then ``held`` in the partial)
        would pass ``budget`` times the object's size: the largest announced this call, or the
        longest prefix held if larger (when no size is announced). Only restarts from zero,
        ``restarting`` the one about to happen, can get there."""
        self.scale = max(self.scale, held)
        if self.transferred + more <= self.budget * self.scale:
            return
        self.partial.save()  # so the verified prefix is kept for a later run
        why = restarting or self.last_restart
        cause = self._range_note().removeprefix("; ") or f"restarted from zero ({why})"
        raise OverBudget(
            f"{self.url}: {cause}: {self.transferred} bytes received, and {more} more would pass"
            f" the budget of {self.budget:g}x the {self.scale}-byte object; giving up (the"
            f" verified {self.partial.state.verified} bytes are kept)"
        )

    def _start(self) -> None:
        """Adopt the checkpoint if the on-disk prefix still hashes to it, else start from zero."""
        reason = self.partial.adopt()
        if reason is None and self.expected is not None:
            changed = differences(self.expected, self.partial.version())
            if changed:
                reason = f"the checkpoint holds another version ({changed})"
        state = self.partial.state
        if reason is None and self.resume_only and not (state.verified or state.complete):
            reason = "the checkpoint has no verified bytes"  # resuming at 0 is starting over
        if reason is None:
            self.resumed = state.verified > 0
            self._check_decoding()  # a checkpoint whose prefix does not decode: stop here
            return
        if self.resume_only:
            raise ResumeRefused(
                f"{self.url}: resume-only mode and no usable checkpoint ({reason});"
                " refusing to download from scratch"
            )
        if reason != "no checkpoint":
            self.restarts += 1
        self._reset()

    def _reset(self) -> None:
        self.partial.reset()
        self.resumed = False

    def _restart(self, reason: str) -> None:
        if self.resume_only:
            raise ResumeRefused(
                f"{self.url}: resume-only mode and {reason}; refusing to download from scratch"
            )
        self.restarts += 1
        self.last_restart = reason
        self._reset()

    def _attempt(self) -> None:
        """One GET from the verified offset; returns when the body ended cleanly."""
        offset = self.partial.state.verified
        headers: dict[str, str] = {}
        if offset:
            headers["Range"] = f"bytes={offset}-"
            validator = if_range(self.partial.version())
            if validator:
                headers["If-Range"] = validator
        try:
            response = open_url(self.url, "GET", headers, self.timeout)
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
        """Append the body if it continues the bytes on disk (or, restarted, replaces them)."""
        seen = self._seen(response)
        if not self._continues(response, offset, seen):
            return
        state = self.partial.state
        state.etag, state.last_modified = seen.etag, seen.last_modified
        state.expected_size = seen.size
        self.scale = max(self.scale, seen.size or 0)
        self.partial.save()
        self._stream(response, seen.size)

    def _seen(self, response: http.client.HTTPResponse) -> RemoteVersion:
        """The version this answer is of; a version other than the pinned one is refused."""
        etag, last_modified = validators(response)
        if response.status == 206:
            parsed = content_range(response)
            # "bytes a-b/*": the total is unknown; keep the one we learnt earlier, if any.
            known = self.partial.state.expected_size
            total = parsed[2] if parsed and parsed[2] is not None else known
        elif response.status == 200:
            total = content_length(response)
        else:
            raise DownloadError(f"{self.url}: unexpected HTTP {response.status} to a GET")
        seen = RemoteVersion(self.url, total, etag, last_modified)
        if self.expected is not None:
            changed = differences(self.expected, seen)
            if changed:
                raise DownloadError(
                    f"{self.url}: the object no longer matches its pinned version"
                    f" ({changed}); refusing to fetch different bytes"
                )
        return seen

    def _continues(
        self, response: http.client.HTTPResponse, offset: int, seen: RemoteVersion
    ) -> bool:
        """Whether to read this body: a 206 must resume the same version at ``offset``; a 200
        to a ranged request restarts from zero and is read whole."""
        changed = differences(self.partial.version(), seen) if offset else ""
        if response.status == 206:
            if changed:
                self._restart(f"the object changed ({changed})")
                return False
            parsed = content_range(response)
            if parsed is None or parsed[0] != offset:
                self._restart(
                    f"the server answered Content-Range {response.headers.get('Content-Range')!r}"
                    f" to a request from byte {offset}"
                )
                return False
            self.resumed = self.resumed or offset > 0
        elif offset:
            reason = f"the object changed ({changed})" if changed else "the server ignored Range"
            if not changed:
                self.ignored_range += 1
            if seen.size is not None:  # the whole object again: refused before a byte is read
                self._check_budget(seen.size, seen.size, reason)
            self._restart(reason)
        return True

    def _stream(self, response: http.client.HTTPResponse, total: int | None) -> None:
        """``_receive`` the body. A decoder that fails meanwhile shuts the connection down, so
        a read waiting on a server that stalled after a corrupt prefix returns at once instead
        of at its timeout, and the download stops with the decoder's error."""
        with _waker(response) as wake:
            self.partial.on_decode_error(wake)
            try:
                self._check_decoding()  # failed before the hook was set: nothing would wake
                self._receive(response, total)
            finally:
                self.partial.on_decode_error(None)

    def _receive(self, response: http.client.HTTPResponse, total: int | None) -> None:
        """Append the body chunk by chunk, checkpointing as it goes; a short body is a drop."""
        partial = self.partial
        declared = response.length
        received = 0
        while True:
            try:
                block = response.read1(self.chunk_size)
            except (OSError, http.client.HTTPException) as error:  # run() checks decoding
                raise _Dropped(f"connection dropped after {received} bytes: {error!r}") from error
            if not block:  # also a read the decoder woke: not a clean end of unknown length
                self._check_decoding()
                break
            self._check_budget(len(block), partial.state.verified + len(block))
            if total is not None and partial.state.verified + len(block) > total:
                raise DownloadError(
                    f"{self.url}: server sent more than the {total} bytes it declared"
                )
            partial.append(block)
            received += len(block)
            self.transferred += len(block)
            partial.save_if_due()
            self._check_decoding()
        if declared is not None and received < declared:
            raise _Dropped(f"body ended after {received} of {declared} bytes")
        if total is None:  # no length announced: a clean end (chunked terminator) is the end
            partial.state.expected_size = partial.state.verified

    def _publish(self) -> Fetched:
        """Publish the partial under the sha256 computed over exactly the bytes written to it
        (or re-hashed from it on adopt): it is fsynced by ``save`` and locked, so it is not read
        again here; the CAS re-checks those bytes on every read."""
        partial = self.partial
        partial.save()
        decoded = self._decoded()
        state = partial.state
        digest = partial.digest()
        size = os.fstat(partial.handle.fileno()).st_size
        if size != state.verified:
            self._reset()
            raise DownloadError(
                f"{self.url}: the partial file changed on disk: received {state.verified} bytes"
                f" hashing to {digest}, the file holds {size} bytes"
            )
        self.cas.adopt_hashed(partial.path, digest, size)
        partial.remove()
        return Fetched(
            digest=digest,
            size=size,
            etag=state.etag,
            last_modified=state.last_modified,
            bytes_transferred=self.transferred,
            resumed=self.resumed,
            restarts=self.restarts,
            codec=None if decoded is None else decoded.codec,
            decoded_bytes=None if decoded is None else decoded.decoded_bytes,
        )

    def _check_decoding(self) -> None:
        """Stop at once when the bytes so far already fail to decode (the partial is kept)."""
        error = self.partial.decode_error()
        if error is not None:
            self.partial.save()
            raise self._invalid(error, early=True)

    def _decoded(self) -> Decoded | None:
        try:
            return self.partial.decoded()
        except CodecError as error:
            raise self._invalid(error, early=False) from error

    def _invalid(self, error: BaseException, *, early: bool) -> InvalidObject:
        """``error`` names the URL (the decoder's ``what``); this adds what was kept."""
        state = self.partial.state
        when = (
            f"found at byte {state.verified} of {state.expected_size}, so the download stopped"
            if early
            else f"found once all {state.verified} bytes were received"
        )
        invalid = InvalidObject(f"{error} ({when}; nothing published, the partial is kept)")
        invalid.__cause__ = error
        return invalid


@contextlib.contextmanager
def _waker(response: http.client.HTTPResponse) -> Iterator[Callable[[], None]]:
    """A callable that shuts ``response``'s connection down from another thread, waking a read
    blocked on it. It holds a duplicate of the socket's descriptor for the block's length, so
    a late call never reaches a descriptor reused by another connection."""
    try:
        duplicate = socket.socket(fileno=os.dup(response.fileno()))
    except (OSError, ValueError, AttributeError):  # no socket under it (closed): nothing to wake
        yield lambda: None
        return

    def wake() -> None:
        with contextlib.suppress(OSError):  # closed already, or the peer went first
            duplicate.shutdown(socket.SHUT_RDWR)

    with duplicate:
        yield wake
