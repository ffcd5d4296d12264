"""Garbage collection of the CAS: remove the objects nothing retained can reach.

Live objects are the closure, by ``verify.reachable`` (the walk ``verify`` does), of these roots:

- the manifest of every retained snapshot. A snapshot is dropped only when the alias's
  ``retention.keep_generations`` is set and it is SUPERSEDED, or ACTIVE in state but neither the
  alias's active snapshot nor one of its last N generations; never when a training permit names
  it. BUILDING/VALIDATED/APPROVED (not superseded yet) and REJECTED/INCOMPLETE snapshots (the
  quarantine: the evidence of why a snapshot was refused) are always kept, as are the
  snapshots of other aliases, whose retention this config does not set;
- the freeze spec and current layer indexes of every partition with a retained snapshot or with
  none yet (an open build: its finished layers are referenced by ``layer_outputs`` only);
- the outputs of successful chunk tasks finished since the earliest open build's freeze (chunk
  tasks name no partition, so all of them from then on: an open build resumes with them);
- benchmark item texts.

Memo rows (``layer_memo``) and older chunk tasks are not roots: every reader checks that their
objects are present and rebuilds otherwise, so removing them costs time, never correctness.

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

An S3 CAS: gc lists the store under its prefix (sizes from the listing); keys that are not
``sha256/ab/cd/<hex>`` objects are reported and left alone. Before deleting (``DeleteObjects``,
1,000 keys a call) it writes the list to the store's gc log; every writer, once it holds the
lock, drops from its node's cache what the logs since its last look name. Without that, a
node's cached copy of a removed object would pass ``contains`` and a memo or chunk-task check
there, and a build would name an object the store no longer has. Left open: a reader that
holds no lock (``verify``, ``read``) downloading an object while gc removes it may cache it
after its node's writer looked at the log.
"""

import fcntl
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, make_url, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from corpus_assets.core.governance import states
from corpus_assets.core.release.verify import reachable
from corpus_assets.core.storage.artifacts import BINARY, JSON, make_ref
from corpus_assets.core.storage.cas import CasError, ContentStore
from corpus_assets.core.storage.cas_s3 import S3ContentStore
from corpus_assets.core.storage.catalog import (
    Catalog,
    alias_history,
    benchmark_items,
    chunk_tasks,
    freezes,
    gate,
    layer_outputs,
    permits,
)

KEPT_STATES = (
    states.BUILDING,
    states.VALIDATED,
    states.APPROVED,
    states.REJECTED,
    states.INCOMPLETE,
)
SMALL_JSON = 1 << 20  # a catalog-named object this small that parses as JSON is walked
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
FOREIGN_SHOWN = 100  # foreign keys named in the report (all are counted)


class GcError(RuntimeError):
    """gc cannot tell what is live, so it removes nothing."""


class CasLockLost(CasError):
    """The catalog session holding the CAS lock ended before its holder let go: gc may have
    run meanwhile (``corpus-assets verify`` tells whether anything this run named is gone)."""


@dataclass
class Plan:
    """What gc keeps and what it would remove (digest, bytes), in digest order; the entries in
    the store that are not CAS objects (left alone: counted, the first ``FOREIGN_SHOWN`` named)."""

    retained: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    live: int = 0
    garbage: list[tuple[str, int]] = field(default_factory=list)
    foreign: list[tuple[str, int]] = field(default_factory=list)
    foreign_count: int = 0
    foreign_bytes: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "retained_snapshots": self.retained,
            "dropped_snapshots": self.dropped,
            "live_objects": self.live,
            "objects": [{"digest": d, "bytes": n} for d, n in self.garbage],
            "bytes": sum(n for _, n in self.garbage),
            "foreign": {
                "count": self.foreign_count,
                "bytes": self.foreign_bytes,
                "shown": [{"key": k, "bytes": n} for k, n in self.foreign],
            },
        }

    def add_foreign(self, where: str, size: int) -> None:
        self.foreign_count += 1
        self.foreign_bytes += size
        if len(self.foreign) < FOREIGN_SHOWN:
            self.foreign.append((where, size))


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


def retained_snapshots(
    catalog: Catalog, alias: str, keep: int | None
) -> tuple[list[str], list[str]]:
    """(retained, dropped) snapshot ids by the alias's retention policy (module docstring)."""
    with catalog.begin() as conn:
        active = conn.scalar(select(gate.c.active_snapshot).where(gate.c.alias == alias))
        history = conn.scalars(
            select(alias_history.c.snapshot_id)
            .where(alias_history.c.alias == alias)
            .order_by(alias_history.c.generation.desc())
        ).all()
        permitted = set(conn.scalars(select(permits.c.snapshot_id)))
    recent = set(history[:keep]) if keep is not None else set()
    retained, dropped = [], []
    for snap in states.find(catalog):
        keeps = (
            keep is None
            or snap.alias != alias
            or snap.state in KEPT_STATES
            or snap.snapshot_id in recent | permitted | {active}
        )
        (retained if keeps else dropped).append(snap.snapshot_id)
    return sorted(retained), sorted(dropped)


def _ref(cas: ContentStore, digest: str) -> dict[str, Any]:
    """A ref to a catalog-named object: JSON (walked) if it is a small JSON document."""
    size = cas.size(digest)
    if size <= SMALL_JSON:
        try:
            json.loads(cas.get_bytes(digest))
            return make_ref(digest, JSON, size)
        except ValueError:
            pass
    return make_ref(digest, BINARY, size)


def _partition_roots(catalog: Catalog, retained: set[str]) -> tuple[list[str], float | None]:
    """Freeze specs and layer indexes of kept partitions; when the earliest open build froze."""
    roots: list[str] = []
    earliest_open: float | None = None
    with catalog.begin() as conn:
        frozen = conn.execute(
            select(freezes.c.partition_key, freezes.c.spec_digest, freezes.c.created_at)
        ).all()
        layers = conn.execute(
            select(layer_outputs.c.partition_key, layer_outputs.c.index_digest)
        ).all()
    for key, spec, created in frozen:
        snaps = states.for_partition(catalog, key)
        if snaps and not any(s.snapshot_id in retained for s in snaps):
            continue
        roots.append(spec)
        roots += [digest for part, digest in layers if part == key]
        if not snaps or any(s.state == states.BUILDING for s in snaps):
            earliest_open = created if earliest_open is None else min(earliest_open, created)
    return roots, earliest_open


def _task_outputs(catalog: Catalog, since: float | None) -> list[str]:
    if since is None:
        return []
    with catalog.begin() as conn:
        return list(
            conn.scalars(
                select(chunk_tasks.c.output_digest)
                .where(chunk_tasks.c.status == "SUCCESS")
                .where(chunk_tasks.c.output_digest.is_not(None))
                .where(chunk_tasks.c.updated_at >= since)
            )
        )


def live_objects(cas: ContentStore, catalog: Catalog, retained: list[str]) -> set[str]:
    """Every digest a root reaches; GcError if a document on the way is missing or corrupt."""
    keep = set(retained)
    manifests = [s.manifest_digest for s in states.find(catalog) if s.snapshot_id in keep]
    named, earliest_open = _partition_roots(catalog, keep)
    named += [d for d in _task_outputs(catalog, earliest_open) if cas.contains(d)]
    roots = [make_ref(d, JSON, cas.size(d) if cas.contains(d) else 0) for d in manifests]
    missing = [d for d in named if not cas.contains(d)]
    if missing:
        raise GcError(f"catalog-named objects are missing, gc removes nothing: {missing[:5]}")
    live, findings = reachable(cas, roots + [_ref(cas, d) for d in named])
    if findings:
        raise GcError("cannot walk every retained object, gc removes nothing: " + findings[0])
    with catalog.begin() as conn:
        live |= set(conn.scalars(select(benchmark_items.c.text_digest)))
    return live


def plan(cas: ContentStore, catalog: Catalog, alias: str, keep: int | None) -> Plan:
    """What gc would remove now (call under ``cas_lock(exclusive=True)``): every object in the
    store's listing (sizes from the listing itself) that no root reaches."""
    retained, dropped = retained_snapshots(catalog, alias, keep)
    live = live_objects(cas, catalog, retained)
    planned = Plan(retained=retained, dropped=dropped, live=len(live))
    for digest, where, size in cas.listing():
        if digest is None:
            planned.add_foreign(where, size)
        elif digest not in live:
            planned.garbage.append((digest, size))
    planned.garbage.sort()
    return planned


def collect(cas: ContentStore, planned: Plan) -> None:
    """Remove every planned object (still under the exclusive lock ``plan`` ran under). From an
    object store: logged first (so every node's cache drops them), then deleted in batches."""
    digests = [digest for digest, _ in planned.garbage]
    if not isinstance(cas, S3ContentStore):
        for digest in digests:
            cas.local_path(digest).unlink(missing_ok=True)
    elif digests:
        cas.record_removal(digests)
        cas.remove(digests)
