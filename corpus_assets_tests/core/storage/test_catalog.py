"""Catalog behaviour on both backends: write-once freezes, forward-only states, gate CAS, tasks."""

import threading

import pytest
from sqlalchemy import select, update

from corpus_assets.core.governance import alias_gate, states
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, chunk_tasks
from corpus_assets.core.storage.catalog import gate as gate_table
from corpus_assets.core.storage.tasks import (
    FAILED,
    SUCCESS,
    ChunkTask,
    open_dead_letters,
    run_chunk,
)

SID = "sha256:" + "a" * 64
SID2 = "sha256:" + "b" * 64
MANIFEST = "sha256:" + "c" * 64


@pytest.fixture
def catalog(catalog_url: str):
    cat = Catalog(catalog_url)
    yield cat
    cat.dispose()


def _approved(catalog: Catalog, sid: str = SID, alias: str = "train") -> None:
    states.register(catalog, sid, "p1", MANIFEST, alias)
    states.transition(catalog, sid, states.BUILDING, states.VALIDATED, "test")
    states.approve(catalog, sid, by="alice")


def test_freeze_is_written_once(catalog: Catalog) -> None:
    first = catalog.record_freeze("p1", "sha256:" + "1" * 64, "sha256:" + "f" * 64)
    second = catalog.record_freeze("p1", "sha256:" + "2" * 64, "sha256:" + "f" * 64)
    assert first == second == "sha256:" + "1" * 64
    assert catalog.freeze_digest("p1") == first


def test_states_only_move_forward(catalog: Catalog) -> None:
    states.register(catalog, SID, "p1", MANIFEST, "train")
    with pytest.raises(states.StateError, match="BUILDING -> APPROVED is not allowed"):
        states.transition(catalog, SID, states.BUILDING, states.APPROVED, "test")
    with pytest.raises(states.StateError, match="is BUILDING, not VALIDATED"):
        states.approve(catalog, SID, by="alice")
    states.transition(catalog, SID, states.BUILDING, states.VALIDATED, "test")
    snapshot = states.approve(catalog, SID, by="alice")
    assert (snapshot.state, snapshot.approved_by) == (states.APPROVED, "alice")
    with pytest.raises(states.StateError):
        states.transition(catalog, SID, states.VALIDATED, states.APPROVED, "again")
    # registering the same snapshot again (a rebuild) keeps its state
    assert states.register(catalog, SID, "p1", MANIFEST, "train").state == states.APPROVED


def test_a_partitions_snapshots_and_each_ones_newest_event_are_read_by_query(
    catalog: Catalog,
) -> None:
    """``for_partition`` and ``last_events`` (gc and ``status``, once per call, not once per
    partition or snapshot) give what a scan of every snapshot and its history gives."""
    third = "sha256:" + "d" * 64
    for sid, key in ((SID, "p1"), (SID2, "p2"), (third, "p1")):
        states.register(catalog, sid, key, MANIFEST, "train")
    states.transition(catalog, SID, states.BUILDING, states.REJECTED, "validator", "canary")
    states.transition(catalog, third, states.BUILDING, states.VALIDATED, "validator", "ok")
    assert [s.snapshot_id for s in states.for_partition(catalog, "p1")] == [
        s.snapshot_id for s in states.find(catalog) if s.partition_key == "p1"
    ]
    assert {s.snapshot_id for s in states.for_partition(catalog, "p1")} == {SID, third}
    assert states.for_partition(catalog, "p3") == []
    newest = states.last_events(catalog, [SID, third])
    assert newest == {sid: states.history(catalog, sid)[-1] for sid in (SID, third)}
    assert (newest[SID].to_state, newest[SID].detail) == (states.REJECTED, "canary")
    assert states.last_events(catalog, []) == {}


def test_activation_swaps_alias_and_bumps_generation(catalog: Catalog) -> None:
    _approved(catalog)
    row = alias_gate.activate(catalog, SID, 0, 0, actor="test")
    assert (row.generation, row.active_snapshot) == (1, SID)
    assert states.get(catalog, SID).state == states.ACTIVE
    with pytest.raises(alias_gate.AliasGateError, match="only APPROVED can activate"):
        alias_gate.activate(catalog, SID, 0, 0, actor="test")


def test_activation_loses_to_an_advanced_fence(catalog: Catalog) -> None:
    _approved(catalog)
    alias_gate.read_alias_gate(catalog, "train")
    with catalog.begin() as conn:
        conn.execute(update(gate_table).values(tombstone_watermark=5))
    with pytest.raises(alias_gate.AliasGateError, match="tombstone 5"):
        alias_gate.activate(catalog, SID, 0, 0, actor="test")
    row = alias_gate.read_alias_gate(catalog, "train")
    assert (row.generation, row.active_snapshot) == (0, None)
    assert states.get(catalog, SID).state == states.APPROVED


def test_concurrent_activations_have_one_winner(catalog: Catalog) -> None:
    _approved(catalog, SID)
    _approved(catalog, SID2)
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def attempt(sid: str) -> None:
        barrier.wait()
        try:
            outcomes[sid] = alias_gate.activate(catalog, sid, 0, 0, actor=sid)
        except alias_gate.AliasGateError as error:
            outcomes[sid] = error

    threads = [threading.Thread(target=attempt, args=(s,)) for s in (SID, SID2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    row = alias_gate.read_alias_gate(catalog, "train")
    winners = [s for s, o in outcomes.items() if isinstance(o, alias_gate.AliasGate)]
    # Both may win in turn (each read a fresh generation), but never both from generation 0.
    assert row.generation == len(winners) >= 1
    assert row.active_snapshot in winners


def test_chunk_task_skips_success_and_dead_letters_failures(catalog: Catalog, tmp_path) -> None:
    cas = ContentStore(tmp_path / "cas")
    task = ChunkTask("canonical_records", "s/a.jsonl", "sha256:" + "d" * 64, "v1")
    calls = []

    def work() -> str:
        calls.append(1)
        return cas.put_bytes(b"output")

    first = run_chunk(catalog, cas, task, work)
    again = run_chunk(catalog, cas, task, work)
    assert (first.skipped, again.skipped, len(calls)) == (False, True, 1)
    assert again.output_digest == first.output_digest

    cas.path(first.output_digest).unlink()  # output gone: the task must run again
    assert run_chunk(catalog, cas, task, work).skipped is False
    assert len(calls) == 2

    bad = ChunkTask("canonical_records", "s/b.jsonl", "sha256:" + "e" * 64, "v1")

    def boom() -> str:
        raise ValueError("line 7: cannot parse")

    outcome = run_chunk(catalog, cas, bad, boom, max_attempts=3, backoff_seconds=0)
    assert outcome.dead_letter and "line 7" in (outcome.error or "")
    with catalog.begin() as conn:
        row = conn.execute(select(chunk_tasks).where(bad.where())).mappings().one()
    assert (row["status"], row["attempts"], row["dead_letter"]) == (FAILED, 3, True)
    dead = open_dead_letters(catalog, [task, bad])
    assert [(t.chunk_key, msg) for t, msg in dead] == [
        ("s/b.jsonl", "ValueError: line 7: cannot parse")
    ]
    # A later success closes the dead letter.
    assert run_chunk(catalog, cas, bad, work).output_digest is not None
    assert open_dead_letters(catalog, [bad]) == []
    with catalog.begin() as conn:
        assert conn.execute(select(chunk_tasks.c.status).where(bad.where())).scalar() == SUCCESS
