"""A loopback HTTP server that serves objects and misbehaves on purpose: it drops connections at
chosen offsets (RST, FIN, stall, no response, an error status), ignores Range, changes an object
between requests, and counts every body byte it sends.

It lives in the package, not the tests, because ``corpus-assets selftest --faults`` runs on a
user's installation without pytest; the download tests import it from here too.
"""

import hashlib
import re
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

LAST_MODIFIED = "Wed, 01 Jan 2025 00:00:00 GMT"
CHANGED_LAST_MODIFIED = "Thu, 02 Jan 2025 00:00:00 GMT"


@dataclass
class Drop:
    """How one GET response fails: after ``at`` body bytes of this response (or at the object's
    byte ``offset``, whatever the response started at), by RST, FIN, stall or no response.
    ``pause`` waits before the failure, so the client has read what was sent."""

    at: int = 0
    how: str = "rst"  # rst | fin | stall | noresponse | status
    status: int = 503
    stall_seconds: float = 0.0
    offset: int | None = None
    pause: float = 0.0


@dataclass
class Remote:
    """One object the server serves, and how it misbehaves; shared with handler threads.
    ``sent`` counts body bytes written; ``ranges`` logs each GET's Range header, ``log`` each
    request as (method, Range header, status; 0 for no response)."""

    body: bytes = b""
    etag: str | None = '"v1"'
    last_modified: str | None = LAST_MODIFIED
    honor_range: bool = True
    allow_head: bool = True
    chunked: bool = False
    drops: list[Drop] = field(default_factory=list)
    after_drop: Callable[["Remote"], None] | None = None
    after_get: Callable[[], None] | None = None  # runs once, after a GET was answered
    piece: int = 64 << 10
    delay: float = 0.0
    # from ``hold_at`` body bytes of a response on, each further piece waits up to
    # ``hold_seconds`` for the client to close the connection (then nothing more is sent): a
    # client that stops early is seen to, however slowly either side runs
    hold_at: int | None = None
    hold_seconds: float = 1.0
    sent: int = 0
    gets: int = 0
    ranges: list[str | None] = field(default_factory=list)
    log: list[tuple[str, str | None, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def change(self, body: bytes, etag: str, last_modified: str = CHANGED_LAST_MODIFIED) -> None:
        """The object is rewritten: new bytes under new validators."""
        with self.lock:
            self.body, self.etag, self.last_modified = body, etag, last_modified


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "LoopbackServer"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        remote = self.server.remote_at(self.path)
        if remote is None or self.path.endswith("-missing"):
            self.send_error(404)
            return
        if not remote.allow_head:
            self._log(remote, 405)
            self.send_error(405)
            return
        self._log(remote, 200)
        with remote.lock:
            body, etag, last_modified = remote.body, remote.etag, remote.last_modified
        self.send_response(200)
        self._validators(etag, last_modified)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()

    def do_GET(self) -> None:
        remote = self.server.remote_at(self.path)
        if remote is None:
            self.send_error(404)
            return
        with remote.lock:
            remote.gets += 1
            body, etag, last_modified = remote.body, remote.etag, remote.last_modified
            drop = remote.drops.pop(0) if remote.drops else None
            remote.ranges.append(self.headers.get("Range"))
        if drop and drop.how == "noresponse":
            self._log(remote, 0)
            self._abort(drop, remote)
            return
        if drop and drop.how == "status":
            self._log(remote, drop.status)
            self.send_error(drop.status)
            return
        span = self._span(remote, len(body), etag, last_modified)
        if span is None:
            return
        start, end, status = span
        self._log(remote, status)
        payload = memoryview(body)[start : end + 1]
        self._head(remote, status, (start, len(payload), len(body)), etag, last_modified)
        self._send_body(remote, payload, status, drop, start)
        with remote.lock:
            hook, remote.after_get = remote.after_get, None
        if hook is not None:
            hook()

    def _span(
        self, remote: Remote, size: int, etag: str | None, last_modified: str | None
    ) -> tuple[int, int, int] | None:
        """``(first, last, status)`` to answer with; None once a 416 was sent."""
        wanted = self.headers.get("Range")
        if_range = self.headers.get("If-Range")
        if not (
            wanted
            and remote.honor_range
            and (if_range is None or if_range in (etag, last_modified))
        ):
            return 0, size - 1, 200
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted)
        if match is None:
            raise ValueError(f"unsupported Range {wanted!r}")
        start = int(match[1])
        end = min(int(match[2]), size - 1) if match[2] else size - 1
        if start >= size:
            self._log(remote, 416)
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return start, end, 206

    def _head(
        self,
        remote: Remote,
        status: int,
        span: tuple[int, int, int],
        etag: str | None,
        last_modified: str | None,
    ) -> None:
        """Status and headers of a body of ``span`` = (first byte, length, object size)."""
        start, length, size = span
        self.send_response(status)
        self._validators(etag, last_modified)
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{start + length - 1}/{size}")
        if remote.chunked and status == 200:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _send_body(
        self, remote: Remote, payload: memoryview, status: int, drop: Drop | None, start: int
    ) -> None:
        """The body piece by piece, counted in ``remote.sent``, until ``drop`` strikes."""
        chunked = remote.chunked and status == 200
        limit = len(payload) if drop is None else _limit(drop, start)
        position = 0
        hold = len(payload) if remote.hold_at is None else remote.hold_at
        try:
            while position < min(limit, len(payload)):
                if position >= hold and self._closed_by_client(remote.hold_seconds):
                    self.close_connection = True
                    return
                end = min(position + remote.piece, limit, hold if position < hold else limit)
                piece = payload[position:end]
                if chunked:
                    self.wfile.write(b"%x\r\n" % len(piece) + bytes(piece) + b"\r\n")
                else:
                    self.wfile.write(piece)
                with remote.lock:
                    remote.sent += len(piece)
                position += len(piece)
                if remote.delay:
                    time.sleep(remote.delay)
            if drop:
                self._abort(drop, remote)
            elif chunked:
                self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client went away (killed, or gave up after a timeout)
            self.close_connection = True

    def _closed_by_client(self, seconds: float) -> bool:
        """Whether the client closes the connection within ``seconds`` (everything sent so far
        flushed first)."""
        self.wfile.flush()
        ready, _, _ = select.select([self.connection], [], [], seconds)
        if not ready:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:  # reset by the client: closed too
            return True

    def _validators(self, etag: str | None, last_modified: str | None) -> None:
        if etag:
            self.send_header("ETag", etag)
        if last_modified:
            self.send_header("Last-Modified", last_modified)

    def _log(self, remote: Remote, status: int) -> None:
        with remote.lock:
            remote.log.append((self.command, self.headers.get("Range"), status))

    def _abort(self, drop: Drop, remote: Remote) -> None:
        self.close_connection = True
        if drop.pause:
            self.wfile.flush()
            time.sleep(drop.pause)
        if drop.how == "stall":
            self.server.released.wait(drop.stall_seconds)
        elif drop.how == "rst":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            self.connection.shutdown(socket.SHUT_RDWR)
        self.connection.close()
        if remote.after_drop:
            remote.after_drop(remote)


def content_etag(body: bytes) -> str:
    """A strong ETag derived from the bytes (a rewrite with other bytes changes it)."""
    return '"' + hashlib.sha256(body).hexdigest()[:16] + '"'


def _limit(drop: Drop, start: int) -> int:
    """Body bytes of this response to send before ``drop`` happens."""
    return drop.at if drop.offset is None else max(0, drop.offset - start)


class LoopbackServer(ThreadingHTTPServer):
    """Serves ``objects`` by path (``remote`` for any other path) on 127.0.0.1:``port`` from a
    thread; ``stop`` releases stalled responses and closes it. Usable as a context manager."""

    daemon_threads = True

    def __init__(
        self, remote: Remote | None = None, objects: dict[str, Remote] | None = None, port: int = 0
    ) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.remote, self.objects = remote, dict(objects or {})
        self.released = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def remote_at(self, path: str) -> Remote | None:
        return self.objects.get(path, self.remote)

    def put(self, path: str, body: bytes) -> Remote:
        """Serve ``body`` at ``path`` from now on, under its content ETag (no Last-Modified)."""
        remote = Remote(body=body, etag=content_etag(body), last_modified=None)
        self.objects[path] = remote
        return remote

    def remove(self, path: str) -> None:
        """``path`` answers 404 from now on."""
        del self.objects[path]

    def start(self) -> "LoopbackServer":
        self._thread = threading.Thread(target=self.serve_forever, args=(0.01,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
        self.server_close()

    def sent(self) -> int:
        """Body bytes sent for every object so far."""
        remotes = [*self.objects.values(), *([self.remote] if self.remote else [])]
        return sum(remote.sent for remote in remotes)

    def __enter__(self) -> "LoopbackServer":
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
