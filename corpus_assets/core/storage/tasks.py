"""Chunk tasks: idempotent per-chunk work with retries, heartbeats and a dead letter.

A task is keyed by (layer, chunk key, input digest, code version). SUCCESS with the same key and an
output present in the CAS at the recorded size is skipped; callers that walk many chunks preload
the layer's successes in one query (``preload``) so a skip costs a dict lookup and one ``stat``.
The code version is the stage's code identity (``runtime.code_identity``: its name and the digest
of the source it runs), so changed code never reuses what older code produced.

A worker claims a task with one conditional UPDATE that succeeds only if nobody else holds a live
claim. While ``work`` runs, a heartbeat thread refreshes the claim; a RUNNING row whose heartbeat
is older than ``stale_after`` - or whose owner process on this host is gone (SIGKILL) - is taken
over. A failure is retried with exponential backoff; after ``max_attempts`` the task becomes a dead
letter with its last error, the rest of the layer goes on, and the snapshot cannot validate while
the dead letter is open.
"""

import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import and_, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from corpus_assets.core.storage import failpoints
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, chunk_tasks
from corpus_assets.core.storage.fsio import FULL, DiskFullError, disk_full

PENDING, RUNNING, SUCCESS, FAILED = "PENDING", "RUNNING", "SUCCESS", "FAILED"
WORKER = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

Done = dict[tuple[str, str], tuple[str, int]]


@dataclass(frozen=True)
class ChunkTask:
    layer: str
    chunk_key: str
    input_digest: str
    code_version: str

    def where(self):  # a SQLAlchemy clause
        return and_(
            chunk_tasks.c.layer == self.layer,
            chunk_tasks.c.chunk_key == self.chunk_key,
            chunk_tasks.c.input_digest == self.input_digest,
            chunk_tasks.c.code_version == self.code_version,
        )


@dataclass(frozen=True)
class ChunkOutcome:
    task: ChunkTask
    output_digest: str | None
    skipped: bool
    error: str | None = None

    @property
    def dead_letter(self) -> bool:
        return self.output_digest is None


def preload(catalog: Catalog, layer: str, code_version: str) -> Done:
    """Every SUCCESS of one layer and code version, keyed by (chunk key, input digest)."""
    with catalog.begin() as conn:
        rows = conn.execute(
            select(
                chunk_tasks.c.chunk_key,
                chunk_tasks.c.input_digest,
                chunk_tasks.c.output_digest,
                chunk_tasks.c.output_size,
            )
            .where(chunk_tasks.c.layer == layer)
            .where(chunk_tasks.c.code_version == code_version)
            .where(chunk_tasks.c.status == SUCCESS)
        ).all()
    return {(r.chunk_key, r.input_digest): (r.output_digest, r.output_size) for r in rows}


def run_chunk(
    catalog: Catalog,
    cas: ContentStore,
    task: ChunkTask,
    work: Callable[[], str],
    max_attempts: int = 3,
    backoff_seconds: float = 0.05,
    *,
    done: Done | None = None,
    stale_after: float = 30.0,
    passthrough: tuple[type[Exception], ...] = (),
) -> ChunkOutcome:
    """Run ``work`` (puts its output in the CAS, returns the digest) at most once per key.

    Exceptions of a ``passthrough`` type are facts for the caller, not failures to retry: the
    task is marked FAILED (not a dead letter) and the exception propagates.
    """
    known = done.get((task.chunk_key, task.input_digest)) if done is not None else None
    if known is None and done is None:
        known = _success_row(catalog, task)
    if known is not None and _present(cas, *known):
        return ChunkOutcome(task, known[0], skipped=True)
    error = ""
    for attempt in range(1, max_attempts + 1):
        reused = _claim_or_wait(catalog, cas, task, stale_after)
        if reused is not None:
            return ChunkOutcome(task, reused, skipped=True)
        trace = ""
        with _Heartbeat(catalog, task, interval=max(stale_after / 4, 0.05)):
            try:
                digest = work()
            except passthrough as exc:
                _finish(catalog, task, FAILED, error=f"{type(exc).__name__}: {exc}")
                raise
            except OSError as exc:
                if exc.errno not in FULL:
                    error = f"{type(exc).__name__}: {exc}"
                    trace = traceback.format_exc(limit=5)
                else:  # a full disk is the machine's state, not the task's: no retry, say so
                    _finish(catalog, task, FAILED, error=f"{type(exc).__name__}: {exc}")
                    if isinstance(exc, DiskFullError):
                        raise
                    raise disk_full(exc, f"the output of chunk task {task.layer}") from None
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                trace = traceback.format_exc(limit=5)
        if not trace:
            _finish(catalog, task, SUCCESS, output=(digest, cas.size(digest)))
            failpoints.hit(f"task/{task.layer}")
            return ChunkOutcome(task, digest, skipped=False)
        _finish(
            catalog, task, FAILED, error=f"{error}\n{trace}", dead_letter=attempt == max_attempts
        )
        if attempt < max_attempts:
            time.sleep(backoff_seconds * 2 ** (attempt - 1))
    return ChunkOutcome(task, None, skipped=False, error=error)


def open_dead_letters(catalog: Catalog, tasks: Iterable[ChunkTask]) -> list[tuple[ChunkTask, str]]:
    """Dead letters among ``tasks`` (with their last error) that no later success has closed."""
    found = []
    with catalog.begin() as conn:
        for task in tasks:
            row = conn.execute(
                select(
                    chunk_tasks.c.status, chunk_tasks.c.dead_letter, chunk_tasks.c.last_error
                ).where(task.where())
            ).first()
            if row is not None and row.status == FAILED and row.dead_letter:
                found.append((task, (row.last_error or "").splitlines()[0]))
    return found


def _present(cas: ContentStore, digest: str, size: int) -> bool:
    try:
        return cas.path(digest).stat().st_size == size
    except FileNotFoundError:
        return False


def _success_row(catalog: Catalog, task: ChunkTask) -> tuple[str, int] | None:
    with catalog.begin() as conn:
        row = conn.execute(
            select(
                chunk_tasks.c.status, chunk_tasks.c.output_digest, chunk_tasks.c.output_size
            ).where(task.where())
        ).first()
    if row is None or row.status != SUCCESS or row.output_digest is None:
        return None
    return row.output_digest, row.output_size


def _owner_is_gone(owner: str | None) -> bool:
    """True if ``owner`` names a process on this host that no longer exists."""
    if not owner:
        return True
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _claim_or_wait(
    catalog: Catalog, cas: ContentStore, task: ChunkTask, stale_after: float
) -> str | None:
    """Claim the task; if another live worker finishes it first, reuse its output."""
    while True:
        with catalog.begin() as conn:
            row = conn.execute(
                select(
                    chunk_tasks.c.status,
                    chunk_tasks.c.owner,
                    chunk_tasks.c.output_digest,
                    chunk_tasks.c.output_size,
                ).where(task.where())
            ).first()
        if row is None:
            if _insert_claim(catalog, task):
                return None
            continue
        if row.status == SUCCESS and _present(cas, row.output_digest, row.output_size):
            return row.output_digest
        gone = row.status == RUNNING and _owner_is_gone(row.owner)
        if _claim(catalog, task, row.status, stale_after, row.owner if gone else None):
            return None
        time.sleep(min(1.0, stale_after / 10))


def _claim_values() -> dict[str, object]:
    now = time.time()
    return {
        "status": RUNNING,
        "owner": WORKER,
        "heartbeat_at": now,
        "dead_letter": False,
        "updated_at": now,
    }


def _claim(
    catalog: Catalog, task: ChunkTask, seen: str, stale_after: float, take_over: str | None
) -> bool:
    """Compare-and-swap the row from the status just seen to RUNNING under this worker.

    A RUNNING row is only free when its heartbeat is stale, it is ours, or its owner is gone.
    """
    condition = chunk_tasks.c.status == seen
    if seen == RUNNING:
        live = [
            chunk_tasks.c.heartbeat_at < time.time() - stale_after,
            chunk_tasks.c.owner == WORKER,
        ]
        if take_over is not None:
            live.append(chunk_tasks.c.owner == take_over)
        condition = and_(condition, or_(*live))
    with catalog.begin() as conn:
        return bool(
            conn.execute(
                update(chunk_tasks)
                .where(task.where())
                .where(condition)
                .values(attempts=chunk_tasks.c.attempts + 1, **_claim_values())
            ).rowcount
        )


def _insert_claim(catalog: Catalog, task: ChunkTask) -> bool:
    try:
        with catalog.begin() as conn:
            conn.execute(
                insert(chunk_tasks).values(
                    layer=task.layer,
                    chunk_key=task.chunk_key,
                    input_digest=task.input_digest,
                    code_version=task.code_version,
                    attempts=1,
                    **_claim_values(),
                )
            )
    except IntegrityError:
        return False
    return True


class _Heartbeat:
    """Refreshes this worker's claim on a task from a daemon thread while the work runs."""

    def __init__(self, catalog: Catalog, task: ChunkTask, interval: float) -> None:
        self._catalog, self._task, self._interval = catalog, task, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def __enter__(self) -> "_Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            with self._catalog.begin() as conn:
                conn.execute(
                    update(chunk_tasks)
                    .where(self._task.where())
                    .where(chunk_tasks.c.owner == WORKER)
                    .values(heartbeat_at=time.time())
                )


def _finish(
    catalog: Catalog,
    task: ChunkTask,
    status: str,
    error: str | None = None,
    output: tuple[str, int] | None = None,
    dead_letter: bool = False,
) -> None:
    values = {
        "status": status,
        "last_error": error,
        "dead_letter": dead_letter,
        "updated_at": time.time(),
    }
    if output is not None:
        values.update(output_digest=output[0], output_size=output[1])
    with catalog.begin() as conn:
        conn.execute(update(chunk_tasks).where(task.where()).values(**values))
