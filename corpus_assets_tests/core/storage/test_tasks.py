"""Chunk task claims across real processes: stale heartbeats, dead owners, live owners."""

import errno
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlalchemy import select, update

from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, chunk_tasks
from corpus_assets.core.storage.fsio import DiskFullError
from corpus_assets.core.storage.tasks import RUNNING, SUCCESS, ChunkTask, preload, run_chunk

TASK = ChunkTask("canonical_records", "s/a.jsonl", "sha256:" + "d" * 64, "v1")

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from corpus_assets.core.storage.cas import ContentStore
    from corpus_assets.core.storage.catalog import Catalog
    from corpus_assets.core.storage.tasks import ChunkTask, run_chunk
    url, root, flag, hold = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), float(sys.argv[4])
    task = ChunkTask("canonical_records", "s/a.jsonl", "sha256:" + "d" * 64, "v1")
    def work():
        flag.write_text("running")
        time.sleep(hold)
        return ContentStore(root).put_bytes(b"from the holder")
    run_chunk(Catalog(url), ContentStore(root), task, work, stale_after=3.0)
    """
)


def _holder(url: str, root: Path, flag: Path, hold: float) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLDER, url, str(root), str(flag), str(hold)])
    deadline = time.monotonic() + 30
    while not flag.exists():
        assert process.poll() is None, "holder exited early"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return process


@pytest.fixture
def catalog(catalog_url: str):
    cat = Catalog(catalog_url)
    yield cat
    cat.dispose()


def test_task_of_a_sigkilled_worker_is_taken_over_at_once(catalog: Catalog, tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "cas")
    holder = _holder(catalog.url, cas.root, tmp_path / "flag", hold=60)
    holder.kill()
    holder.wait()
    with catalog.begin() as conn:
        assert conn.execute(select(chunk_tasks.c.status).where(TASK.where())).scalar() == RUNNING
    started = time.monotonic()
    outcome = run_chunk(catalog, cas, TASK, lambda: cas.put_bytes(b"mine"), stale_after=30)
    assert time.monotonic() - started < 5  # the owner pid is gone: no need to wait 30 s
    assert (outcome.skipped, cas.get_bytes(outcome.output_digest)) == (False, b"mine")


def test_stale_heartbeat_of_another_host_is_taken_over(catalog: Catalog, tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "cas")
    run_chunk(catalog, cas, TASK, lambda: (_ for _ in ()).throw(RuntimeError("x")), max_attempts=1)
    with catalog.begin() as conn:
        conn.execute(
            update(chunk_tasks)
            .where(TASK.where())
            .values(status=RUNNING, owner="elsewhere:1:abc", heartbeat_at=time.time())
        )
    started = time.monotonic()
    outcome = run_chunk(catalog, cas, TASK, lambda: cas.put_bytes(b"late"), stale_after=0.5)
    waited = time.monotonic() - started
    assert 0.4 < waited < 5, waited  # waited for the heartbeat to go stale, then took over
    assert cas.get_bytes(outcome.output_digest) == b"late"


def test_live_owner_is_waited_for_and_its_output_reused(catalog: Catalog, tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "cas")
    # held for 1.5x stale_after; a heartbeat every 0.75 s keeps it live (3 s, not 1 s: on a
    # loaded 2-core runner one late UPDATE once let the waiter take the claim over)
    holder = _holder(catalog.url, cas.root, tmp_path / "flag", hold=4.5)
    calls = []
    outcome = run_chunk(
        catalog, cas, TASK, lambda: calls.append(1) or cas.put_bytes(b"dup"), stale_after=3.0
    )
    assert holder.wait(timeout=30) == 0
    assert calls == []  # the heartbeat kept the claim alive past stale_after
    assert (outcome.skipped, cas.get_bytes(outcome.output_digest)) == (True, b"from the holder")
    with catalog.begin() as conn:
        row = conn.execute(select(chunk_tasks).where(TASK.where())).mappings().one()
    assert (row["status"], row["attempts"]) == (SUCCESS, 1)


def test_preloaded_successes_skip_without_queries(catalog: Catalog, tmp_path: Path) -> None:
    cas = ContentStore(tmp_path / "cas")
    tasks = [ChunkTask("canonical_records", f"s/{n}", f"sha256:{n:064x}", "v1") for n in range(50)]
    for n, task in enumerate(tasks):
        run_chunk(catalog, cas, task, lambda n=n: cas.put_bytes(f"out {n}".encode()))
    done = preload(catalog, "canonical_records", "v1")
    assert len(done) == 50
    catalog.dispose()
    broken = Catalog.__new__(Catalog)  # a catalog that cannot answer: skips must not ask it
    outcomes = [run_chunk(broken, cas, t, lambda: "unused", done=done) for t in tasks]
    assert all(o.skipped for o in outcomes)


def test_a_full_disk_stops_the_task_at_once_saying_so(catalog: Catalog, tmp_path: Path) -> None:
    """No space left is the machine's state, not the task's: one attempt, no dead letter, and
    the one-line DiskFullError (a retry or a "task failed" would hide what to do)."""
    cas = ContentStore(tmp_path / "cas")
    task = ChunkTask("tokens", "s/0", "sha256:" + "0" * 64, "v1")
    attempts = []

    def work() -> str:
        attempts.append(1)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskFullError, match="no space left on device writing the output of chunk"):
        run_chunk(catalog, cas, task, work)
    assert len(attempts) == 1
    with catalog.begin() as conn:
        row = conn.execute(select(chunk_tasks)).mappings().one()
    assert (row["status"], row["dead_letter"]) == ("FAILED", False)
    assert run_chunk(catalog, cas, task, lambda: cas.put_bytes(b"out")).output_digest
