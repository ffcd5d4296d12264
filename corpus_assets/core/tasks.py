"""Chunk tasks (seed 004): idempotent per-chunk work with retries and a dead letter.

A task is keyed by (layer, chunk key, input digest, code version). SUCCESS with the same key and an
output that is present in the CAS at the recorded size is skipped. A failure is retried with
backoff; after ``max_attempts`` the task becomes a dead letter carrying its last error, the rest of
the layer goes on, and the snapshot cannot validate while the dead letter is open.
"""

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import and_, insert, select, update

from corpus_assets.core.cas import ContentStore
from corpus_assets.core.catalog import Catalog, chunk_tasks

PENDING, RUNNING, SUCCESS, FAILED = "PENDING", "RUNNING", "SUCCESS", "FAILED"


@dataclass(frozen=True)
class ChunkTask:
    layer: str
    chunk_key: str
    input_digest: str
    code_version: str

    def where(self):
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


def run_chunk(
    catalog: Catalog,
    cas: ContentStore,
    task: ChunkTask,
    work: Callable[[], str],
    max_attempts: int = 3,
    backoff_seconds: float = 0.05,
) -> ChunkOutcome:
    """Run ``work`` (puts its output in the CAS, returns the digest) at most once per key."""
    done = _reusable_output(catalog, cas, task)
    if done is not None:
        return ChunkOutcome(task, done, skipped=True)
    error = ""
    for attempt in range(1, max_attempts + 1):
        _mark_running(catalog, task)
        try:
            digest = work()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            _finish(
                catalog,
                task,
                FAILED,
                error=error + "\n" + traceback.format_exc(limit=5),
                dead_letter=attempt == max_attempts,
            )
            if attempt < max_attempts:
                time.sleep(backoff_seconds * 2 ** (attempt - 1))
            continue
        _finish(catalog, task, SUCCESS, output=(digest, cas.size(digest)))
        return ChunkOutcome(task, digest, skipped=False)
    return ChunkOutcome(task, None, skipped=False, error=error)


def open_dead_letters(catalog: Catalog, tasks: list[ChunkTask]) -> list[tuple[ChunkTask, str]]:
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


def _reusable_output(catalog: Catalog, cas: ContentStore, task: ChunkTask) -> str | None:
    with catalog.begin() as conn:
        row = conn.execute(
            select(
                chunk_tasks.c.status, chunk_tasks.c.output_digest, chunk_tasks.c.output_size
            ).where(task.where())
        ).first()
    if row is None or row.status != SUCCESS or row.output_digest is None:
        return None
    path = cas.path(row.output_digest)
    try:
        present = path.stat().st_size == row.output_size
    except FileNotFoundError:
        present = False
    return row.output_digest if present else None


def _mark_running(catalog: Catalog, task: ChunkTask) -> None:
    now = time.time()
    with catalog.begin() as conn:
        moved = conn.execute(
            update(chunk_tasks)
            .where(task.where())
            .values(
                status=RUNNING,
                attempts=chunk_tasks.c.attempts + 1,
                heartbeat_at=now,
                dead_letter=False,
                updated_at=now,
            )
        ).rowcount
        if not moved:
            conn.execute(
                insert(chunk_tasks).values(
                    layer=task.layer,
                    chunk_key=task.chunk_key,
                    input_digest=task.input_digest,
                    code_version=task.code_version,
                    status=RUNNING,
                    attempts=1,
                    heartbeat_at=now,
                    dead_letter=False,
                    updated_at=now,
                )
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
