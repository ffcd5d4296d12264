"""The SQLite event log keeps one connection per database file and process: a run's events open
no new SQLite connection each, other processes see every event as it is committed, a forked
child makes its own, and nothing stays open after ``dispose``."""

import multiprocessing
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun
from sqlalchemy import event
from sqlalchemy.pool import Pool

from corpus_assets.assets.event_log import SharedEngineSqliteEventLogStorage
from corpus_assets.cli.instance import dagster_instance

EVENTS = 40


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dg.DagsterInstance]:
    """The instance the CLI makes in a fresh ``DAGSTER_HOME`` (its generated ``dagster.yaml``)."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    made = dagster_instance()
    yield made
    made.dispose()


@pytest.fixture
def opened() -> Iterator[list[object]]:
    """Every SQLite connection SQLAlchemy opens while the test runs."""
    seen: list[object] = []

    def count(connection: object, _record: object) -> None:
        seen.append(connection)

    event.listen(Pool, "connect", count)
    yield seen
    event.remove(Pool, "connect", count)


def new_run(instance: dg.DagsterInstance, run_id: str) -> DagsterRun:
    return instance.add_run(DagsterRun(job_name="build_snapshot", run_id=run_id))


def stored(db: Path) -> int:
    """The events in a run's database, read by a connection of its own."""
    with sqlite3.connect(db) as reader:
        return reader.execute("select count(*) from event_logs").fetchone()[0]


def test_the_cli_instance_uses_the_shared_connection_event_log(
    instance: dg.DagsterInstance,
) -> None:
    assert type(instance.event_log_storage) is SharedEngineSqliteEventLogStorage


def test_a_runs_events_open_no_connection_each(
    instance: dg.DagsterInstance, opened: list[object]
) -> None:
    run = new_run(instance, "r1")
    instance.report_engine_event("first", run)  # the run's database made and opened once
    before = len(opened)
    for n in range(EVENTS):
        instance.report_engine_event(f"event {n}", run)
    assert len(opened) == before  # Dagster's own storage opens one per event
    assert len(instance.all_logs("r1")) == EVENTS + 1


def test_asset_events_and_partition_reads_open_no_connection_each(
    instance: dg.DagsterInstance, opened: list[object]
) -> None:
    """An asset event is mirrored in the index file; a partition read first asks whether the
    partitions table exists (Dagster's storage makes a new engine of the index file for that)."""
    materialization = dg.AssetMaterialization("a", partition="k1")
    instance.add_dynamic_partitions("snapshots", ["k1"])
    instance.report_runless_asset_event(materialization)
    before = len(opened)
    for _ in range(EVENTS):
        instance.report_runless_asset_event(materialization)
        assert instance.has_dynamic_partition("snapshots", "k1")
    assert len(opened) == before
    event = instance.get_latest_materialization_event(dg.AssetKey("a"))
    assert event is not None and event.asset_materialization is not None
    assert event.asset_materialization.partition == "k1"


def test_each_event_is_visible_to_other_connections_once_stored(
    instance: dg.DagsterInstance,
) -> None:
    run = new_run(instance, "r2")
    db = Path(instance.event_log_storage.path_for_shard("r2"))  # type: ignore[attr-defined]
    for n in range(3):
        instance.report_engine_event(f"event {n}", run)
        assert stored(db) == n + 1


def _child_stores(run_id: str) -> None:
    instance = dagster_instance()
    run = instance.get_run_by_id(run_id)
    assert run is not None
    instance.report_engine_event(f"from child {os.getpid()}", run)


def _forked_child_stores(storage_instance: dg.DagsterInstance, run: DagsterRun) -> None:
    storage_instance.report_engine_event("from forked child", run)


def test_a_forked_child_and_a_spawned_process_store_beside_the_parent(
    instance: dg.DagsterInstance,
) -> None:
    run = new_run(instance, "r3")
    instance.report_engine_event("parent before", run)
    for method, target, args in (
        ("fork", _forked_child_stores, (instance, run)),
        ("spawn", _child_stores, ("r3",)),
    ):
        child = multiprocessing.get_context(method).Process(target=target, args=args)
        child.start()
        child.join(60)
        assert child.exitcode == 0, method
    instance.report_engine_event("parent after", run)  # the parent's connection still works
    messages = [entry.message for entry in instance.all_logs("r3")]
    assert messages[0] == "parent before" and messages[-1] == "parent after"
    assert "from forked child" in messages
    assert any(message.startswith("from child") for message in messages)


def test_dispose_closes_the_connections_and_the_wal_is_checkpointed(
    instance: dg.DagsterInstance,
) -> None:
    run = new_run(instance, "r4")
    instance.report_engine_event("one", run)
    db = Path(instance.event_log_storage.path_for_shard("r4"))  # type: ignore[attr-defined]
    instance.dispose()
    # the last connection closed checkpoints a WAL database and removes its -wal file
    assert not Path(f"{db}-wal").exists()
    instance.report_engine_event("two", run)  # reopened on the next use
    assert stored(db) == 2


CLI_EXIT = """
import sys
from dagster._core.storage.dagster_run import DagsterRun
from corpus_assets.cli.instance import dagster_instance
from corpus_assets.cli.main import run
instance = dagster_instance()
instance.report_engine_event("stored", instance.add_run(DagsterRun(job_name="j", run_id="r5")))
sys.argv = ["corpus-assets", "--config", "/nonexistent/corpus.yaml", "history", "a"]
run()
"""


def test_the_cli_closes_the_connections_before_it_leaves(tmp_path: Path) -> None:
    """The console script leaves with ``os._exit`` (no atexit): it closes them first, so the
    run's file is checkpointed (no ``-wal`` left) with the event in it."""
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster")}
    done = subprocess.run([sys.executable, "-c", CLI_EXIT], env=env, capture_output=True)
    assert done.returncode == 2, done.stderr  # the command's refusal: the config is not there
    runs = tmp_path / "dagster" / "history" / "runs"
    assert not list(runs.glob("*.db-wal"))
    assert stored(runs / "r5.db") == 1
