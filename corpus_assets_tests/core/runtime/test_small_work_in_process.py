"""A local map whose missing work is small runs in the build's process: a child's few new
chunks cost less there than the ~1 CPU-s of imports each spawn worker pays before its first job.
The bytes are the pool's, and a pool already started is used (its start is paid)."""

import os
from pathlib import Path

import pytest
from sqlalchemy import select

from corpus_assets.core.pipeline import BUILDERS
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.pool import WorkerSetup, shared_pool
from corpus_assets.core.runtime.runners import LocalRunner
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.catalog import chunk_tasks
from corpus_assets.core.tokens.cache import token_cache
from corpus_assets.core.tokens.spec import resolve_tokenizer
from corpus_assets_tests.conftest import use_demo_copy
from corpus_assets_tests.worker_probe import no_setup, worker_pid

LAYERS = ("raw_snapshot", "canonical_records", "dedup_clusters")
MAPPED = ("canonical_records", "dedup_signatures", "tokens")  # the chunk tasks mapped


def _build(home: Path, execution: str) -> tuple[dict[str, str], dict[str, set[int]]]:
    """The layers' digests and, per mapped task layer, the pids that ran its chunk tasks."""
    config = home / "corpus.yaml"
    config.write_text(config.read_text().split("execution:")[0] + f"execution: {execution}\n")
    with open_workspace(config) as ws, shared_pool():
        digests = {layer: BUILDERS[layer](ws, "p1").digest for layer in LAYERS}
        chunks = CanonicalIndex.read(ws, "p1")[1].chunks()
        tokens = token_cache(ws, chunks, resolve_tokenizer(ws)).chunks
        digests["tokens"] = ",".join(c.digest for c in tokens)
        with ws.catalog.begin() as conn:
            rows = conn.execute(select(chunk_tasks.c.layer, chunk_tasks.c.owner)).all()
    owners: dict[str, set[int]] = {layer: set() for layer in MAPPED}
    for layer, owner in rows:
        if layer in owners:
            owners[layer].add(int(owner.split(":")[1]))
    return digests, owners


def test_a_few_small_chunks_run_here_and_write_the_pools_bytes(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_demo_copy(demo_home, tmp_path / "here", 2, monkeypatch)
    here, here_owners = _build(tmp_path / "here", "{workers: 2}")
    use_demo_copy(demo_home, tmp_path / "pool", 2, monkeypatch)
    pool, pool_owners = _build(tmp_path / "pool", "{workers: 2, in_process_bytes: 0}")
    assert here == pool
    assert all(owners == {os.getpid()} for owners in here_owners.values()), here_owners
    assert all(owners and os.getpid() not in owners for owners in pool_owners.values())


def test_a_pool_already_started_takes_small_work_too() -> None:
    """Once a big map started the build's pool, small maps use its (paid) workers too."""
    runner = LocalRunner(2, in_process_bytes=1 << 20)
    with shared_pool():
        assert not runner.wants(4, 1000)  # small, no pool yet: here
        assert runner.wants(4, 2 << 20) and runner.wants(4)  # big or unknown: the pool
        LocalRunner(2).map(worker_pid, range(2), WorkerSetup(no_setup, ""))
        assert runner.wants(4, 1000)  # the session's pool is up
        assert not runner.wants(1, 1000)  # one job never leaves the process
    assert not runner.wants(4, 1000)  # the session closed its pool
