"""The CAS lock: writers hold it shared, gc exclusive, on one machine and across nodes.

The lock: a data-home-wide ``flock`` (``locks/cas.lock``) and, when the catalog is PostgreSQL,
the catalog's session-level advisory lock ``CAS_LOCK_KEY`` on a dedicated connection: the nodes
of a scale-out deployment (an S3 CAS and one PostgreSQL catalog) have separate data homes, and a
flock on one machine means nothing to another. Advisory locks are per database, so corpora with
separate catalog databases never wait for each other; the connection must reach the server
itself or a session-pooling bouncer (transaction pooling would hand the session to others).
A writer (a build, every Dagster layer step, ``benchmark add``, ``tokenizer train`` ...) holds
both shared for its whole run, gc both exclusive from listing the CAS to the last delete. A
build creates objects before the catalog names them (a chunk's output, then its task row) and
reuses objects that already exist; a grace period by mtime would miss the second (reuse does
not touch the file), the lock misses neither. A SIGKILLed holder releases both: the kernel
drops the flock with its last descriptor, the server the advisory lock with its session (a
node that vanishes: once TCP keepalive gives up, ~2 minutes). gc waits for running writers; a
writer started during gc waits for it.
"""

import fcntl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, make_url, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from corpus_assets.core.storage.cas import CasError, ContentStore
from corpus_assets.core.storage.cas_s3 import S3ContentStore

CAS_LOCK_KEY = 0x636F7270_5F636173  # "corp_cas": the catalog's advisory lock of the CAS
SESSION_SETTINGS = (  # the lock's session: no timeout ends it; a dead peer is noticed in ~2 min
    "application_name = 'corpus-assets cas lock'",
    "statement_timeout = 0",
    "lock_timeout = 0",
    "idle_in_transaction_session_timeout = 0",
    "tcp_keepalives_idle = 60",
    "tcp_keepalives_interval = 10",
    "tcp_keepalives_count = 6",
)


class CasLockLost(CasError):
    """The catalog session holding the CAS lock ended before its holder let go: gc may have
    run meanwhile (``corpus-assets verify`` tells whether anything this run named is gone)."""


def lock_path(home: Path) -> Path:
    return home / "locks" / "cas.lock"


@contextmanager
def cas_lock(
    home: Path,
    cas: ContentStore,
    catalog_url: str,
    exclusive: bool,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold the CAS lock: shared for a writer, exclusive for gc (module docstring). Once held,
    an object-store cache drops what gc removed since it last looked."""
    waiting = "gc is waiting for running builds" if exclusive else "waiting for gc"
    said: list[str] = []

    def wait() -> None:
        if on_wait is not None and not said:
            said.append(waiting)
            on_wait(waiting)

    with _home_lock(home, exclusive, wait), _catalog_lock(catalog_url, exclusive, wait):
        if isinstance(cas, S3ContentStore):
            cas.forget_removed()
        yield


@contextmanager
def _home_lock(home: Path, exclusive: bool, wait: Callable[[], None]) -> Iterator[None]:
    path = lock_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            wait()
            fcntl.flock(handle, mode)
        yield


@dataclass
class _Session:
    """The dedicated catalog connection holding the advisory lock, and how many holders in
    this process share it."""

    engine: Engine
    conn: Connection
    holders: int = 0


_sessions: dict[tuple[str, bool], _Session] = {}
_guards: dict[tuple[str, bool], threading.Lock] = {}
_guards_guard = threading.Lock()


@contextmanager
def _catalog_lock(url: str, exclusive: bool, wait: Callable[[], None]) -> Iterator[None]:
    """With a PostgreSQL catalog, its session-level advisory lock ``CAS_LOCK_KEY``. Nested
    holders in one process share one session (an in-process build's steps take the lock its
    CLI holds): a second session's request would queue behind a waiting gc, which waits for
    the first: a deadlock no server can see."""
    if make_url(url).get_backend_name() != "postgresql":
        yield
        return
    slot = (url, exclusive)
    with _guards_guard:
        guard = _guards.setdefault(slot, threading.Lock())
    with guard:
        session = _sessions.get(slot) or _open_session(url, exclusive, wait)
        _sessions[slot] = session
        session.holders += 1
    try:
        yield
    finally:
        with guard:
            session.holders -= 1
            if session.holders == 0:
                del _sessions[slot]
                _close_session(session, exclusive)


def _open_session(url: str, exclusive: bool, wait: Callable[[], None]) -> _Session:
    """Connect (autocommit: never idle in a transaction), make the session immune to the
    server's or role's timeouts, and take the lock, saying so first if it has to wait."""
    engine = create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    conn = engine.connect()
    try:
        settings = list(SESSION_SETTINGS)
        if (conn.dialect.server_version_info or (0,)) >= (14,):
            settings.append("idle_session_timeout = 0")
        for setting in settings:
            conn.execute(text(f"SET {setting}"))
        kind = "" if exclusive else "_shared"
        key = {"key": CAS_LOCK_KEY}
        if not conn.scalar(text(f"SELECT pg_try_advisory_lock{kind}(:key)"), key):
            wait()
            conn.execute(text(f"SELECT pg_advisory_lock{kind}(:key)"), key)
    except BaseException:
        conn.close()
        engine.dispose()
        raise
    return _Session(engine, conn)


def _close_session(session: _Session, exclusive: bool) -> None:
    """Unlock and disconnect; a session that ended while held is an error: the lock was gone."""
    kind = "" if exclusive else "_shared"
    try:
        unlocked = session.conn.scalar(
            text(f"SELECT pg_advisory_unlock{kind}(:key)"), {"key": CAS_LOCK_KEY}
        )
    except DBAPIError as error:
        raise CasLockLost(f"the catalog session holding the CAS lock ended: {error}") from None
    finally:
        session.conn.close()
        session.engine.dispose()
    if not unlocked:
        raise CasLockLost("the catalog session no longer held the CAS lock")
