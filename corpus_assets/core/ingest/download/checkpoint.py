"""The partial download on disk and its checkpoint: which prefix is verified, of which version.

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
re-hash; only a new process re-hashes the prefix once. Periodic checkpoints are committed by one
background thread, so the download keeps receiving while the disk syncs: the main thread flushes
the appended bytes to the OS and snapshots (verified, sha256) first, then the thread fsyncs the
file and only then writes the snapshot, so the order (data durable, then claim) is unchanged. One
commit is in flight at most; every other write to the partial or its checkpoint waits for it and
re-raises its error. The sha256 itself runs on another helper thread (``OverlappedHasher``), one
block behind the writes, so receiving and writing the next block overlap hashing this one; every
snapshot and the final digest wait for it, so a claim's hash always covers exactly its bytes.
When asked to, the state also decodes what it holds (``DecodeCheck``, a third helper thread): the
blocks appended and, on adopt, the prefix re-read from disk, so a resumed download is decoded from
its first byte like an uninterrupted one, and a restart starts a new decoder with its new state.
"""

import errno
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from corpus_assets.core.ingest.download.decode import DecodeCheck, Decoded
from corpus_assets.core.ingest.remote_http import DownloadError, RemoteVersion
from corpus_assets.core.storage.digests import PREFIX
from corpus_assets.core.storage.fsio import atomic_write
from corpus_assets.core.storage.hashing import OverlappedHasher

HASH_CHUNK = 1 << 20

_Signature = tuple[int, str | None, str | None, int | None]


@dataclass
class PartialState:
    """What the bytes on disk are: how many are verified and which version they belong to."""

    verified: int = 0
    hasher: OverlappedHasher = field(default_factory=OverlappedHasher)
    expected_size: int | None = None
    etag: str | None = None
    last_modified: str | None = None
    decoder: DecodeCheck | None = None

    @property
    def complete(self) -> bool:
        return self.expected_size is not None and self.verified == self.expected_size

    def close(self) -> None:
        """End the helper threads (the hasher stays usable inline)."""
        try:
            self.hasher.close()
        finally:
            if self.decoder is not None:
                self.decoder.close()


class ResumeRefused(DownloadError):
    """Resume-only mode found no usable checkpoint, so it refuses to download from scratch."""


@contextmanager
def locked_partial(
    url: str,
    work_dir: Path,
    *,
    checkpoint_bytes: int,
    checkpoint_seconds: float,
    decoding: Callable[[], DecodeCheck] | None = None,
    resume_only: bool = False,
) -> Iterator["PartialFile"]:
    """The URL's partial file in ``work_dir``, locked so no second process writes it meanwhile;
    ``decoding`` makes the decoder each new state feeds its bytes to (None: no decoding).
    ``resume_only`` opens an existing partial only: with none, ``ResumeRefused`` is raised
    before any file or directory is created (a refused download leaves nothing behind)."""
    work_dir = Path(work_dir)
    key = hashlib.sha256(url.encode("utf-8")).hexdigest()
    path = work_dir / f"{key}.partial"
    if not resume_only:
        work_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | (0 if resume_only else os.O_CREAT), 0o644)
    except FileNotFoundError:
        if not resume_only:
            raise
        raise ResumeRefused(
            f"{url}: resume-only mode and no partial file {path}; refusing to download from scratch"
        ) from None
    with os.fdopen(fd, "r+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise DownloadError(f"{url}: another process is downloading it into {path}") from None
        partial = PartialFile(
            url=url,
            handle=handle,
            path=path,
            checkpoint=work_dir / f"{key}.partial.json",
            checkpoint_bytes=checkpoint_bytes,
            checkpoint_seconds=checkpoint_seconds,
            decoding=decoding,
        )
        try:
            yield partial
        finally:
            partial.stop_committing()  # before the handle closes under the commit thread


@dataclass
class PartialFile:
    """The partial body and its checkpoint file; the only code that writes either of them."""

    url: str
    handle: BinaryIO
    path: Path
    checkpoint: Path
    checkpoint_bytes: int
    checkpoint_seconds: float
    decoding: Callable[[], DecodeCheck] | None = None
    state: PartialState = field(default_factory=PartialState)
    _saved: _Signature | None = None
    _saved_at: float = float("-inf")  # the first checkpoint is due at once (any uptime)
    _committer: ThreadPoolExecutor | None = None
    _committing: "Future[None] | None" = None

    def adopt(self) -> str | None:
        """Take over the checkpoint if the on-disk prefix still hashes to it; else say why not."""
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
            state = self._new_state(
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
        reason = self._rehash(state, prefix)
        if reason is not None:
            state.close()
        else:
            self._replace_state(state)
            self._saved = self._signature()
            self._saved_at = time.monotonic()
        return reason

    def _rehash(self, state: PartialState, prefix: str) -> str | None:
        """Hash the first ``state.verified`` bytes on disk into ``state``, cutting off the rest."""
        verified = state.verified
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
            if state.decoder is not None:
                state.decoder.feed(block)
            remaining -= len(block)
        if state.hasher.hexdigest() != prefix:
            return "partial file's prefix does not hash to its checkpoint"
        return None

    def reset(self) -> None:
        """Forget every byte on disk: truncate first, so a crash here never leaves a claim."""
        self._settle()
        self.handle.seek(0)
        self.handle.truncate(0)
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.checkpoint.unlink(missing_ok=True)
        self._replace_state(self._new_state())
        self._saved = None

    def append(self, block: bytes) -> None:
        """Write and hash body bytes; they count as verified once a checkpoint commits them.
        ``block`` is hashed (and decoded, with ``decoding``) on helper threads after this
        returns: it must be ``bytes``."""
        state = self.state
        self.handle.write(block)
        state.hasher.update(block)
        if state.decoder is not None:
            state.decoder.feed(block)
        state.verified += len(block)

    def save_if_due(self) -> None:
        """Start a background checkpoint every ``checkpoint_bytes`` or ``checkpoint_seconds``;
        while one is still syncing, the next is simply due a little later."""
        if (
            self.state.verified - (self._saved[0] if self._saved else 0) < self.checkpoint_bytes
            and time.monotonic() - self._saved_at < self.checkpoint_seconds
        ):
            return
        if self._committing is not None and not self._committing.done():
            return
        self._settle()
        self.handle.flush()  # the snapshot's bytes reach the OS before the thread fsyncs
        snapshot = self._snapshot()
        self._mark_saved()  # counted as committed now; undone by _settle if the commit fails
        if self._committer is None:
            self._committer = ThreadPoolExecutor(1, thread_name_prefix="download-checkpoint")
        self._committing = self._committer.submit(self._commit, *snapshot)

    def save(self) -> None:
        """Make the appended bytes durable, then commit them in the checkpoint (data first)."""
        self._settle()
        if self._saved == self._signature():
            return
        self.handle.flush()
        self._commit(*self._snapshot())
        self._mark_saved()

    def stop_committing(self) -> None:
        """Wait for the background checkpoint, re-raising its error, and end its thread."""
        try:
            self._settle()
        finally:
            self.state.close()
            if self._committer is not None:
                self._committer.shutdown()
                self._committer = None

    def _snapshot(self) -> tuple[int, bytes]:
        """The file descriptor and the checkpoint claiming every byte appended so far."""
        state = self.state
        payload = {
            "url": self.url,
            "verified_bytes": state.verified,
            "expected_size": state.expected_size,
            "sha256_prefix": state.hasher.hexdigest(),
            "etag": state.etag,
            "last_modified": state.last_modified,
        }
        return self.handle.fileno(), json.dumps(payload, sort_keys=True).encode("utf-8")

    def _mark_saved(self) -> None:
        self._saved = self._signature()
        self._saved_at = time.monotonic()

    def _commit(self, fd: int, checkpoint: bytes) -> None:
        os.fsync(fd)
        atomic_write(self.checkpoint, checkpoint)

    def _settle(self) -> None:
        """Wait for the commit in flight; a failed one is raised here, and stays unclaimed."""
        committing, self._committing = self._committing, None
        if committing is not None:
            try:
                committing.result()
            except BaseException:
                self._saved = None  # so the next save() writes the checkpoint again
                raise

    def version(self) -> RemoteVersion:
        """The version the bytes on disk belong to."""
        state = self.state
        return RemoteVersion(self.url, state.expected_size, state.etag, state.last_modified)

    def digest(self) -> str:
        """The sha256 of every byte appended (or re-hashed from disk) so far."""
        return PREFIX + self.state.hasher.hexdigest()

    def decode_error(self) -> BaseException | None:
        """The decoder's failure on the bytes appended so far, as soon as it is known."""
        decoder = self.state.decoder
        return None if decoder is None else decoder.error

    def on_decode_error(self, hook: Callable[[], None] | None) -> None:
        """Have the current decoder call ``hook`` from its thread when it fails (None: not)."""
        if self.state.decoder is not None:
            self.state.decoder.on_failure = hook

    def decoded(self) -> Decoded | None:
        """Wait for the decoder to reach the end of the bytes appended; raise its error."""
        decoder = self.state.decoder
        return None if decoder is None else decoder.finish()

    def _new_state(self, **values: object) -> PartialState:
        decoder = self.decoding() if self.decoding is not None else None
        return PartialState(decoder=decoder, **values)  # type: ignore[arg-type]

    def _replace_state(self, state: PartialState) -> None:
        old, self.state = self.state, state
        old.close()

    def remove(self) -> None:
        """Drop the checkpoint and the partial file once the CAS holds the bytes."""
        self._settle()
        self.checkpoint.unlink(missing_ok=True)
        self.path.unlink(missing_ok=True)

    def _signature(self) -> _Signature:
        state = self.state
        return (state.verified, state.etag, state.last_modified, state.expected_size)
