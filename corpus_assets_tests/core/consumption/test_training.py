"""The training entry point on both catalogs: digest-only API, gate permits, verified reads."""

import json
import threading
import time

import pytest
from sqlalchemy import select, text

from corpus_assets.core.consumption.training import (
    Permit,
    TrainingError,
    TrainingReader,
    resolve_alias,
    take_permit,
)
from corpus_assets.core.governance import states
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.block_reader import ReaderStateError
from corpus_assets.core.publication.publish import activate, approve
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import get_json
from corpus_assets.core.storage.catalog import permits
from corpus_assets.core.storage.shards import ShardCorruptError


def _built(ws: Workspace, key: str) -> str:
    sid = build_all(ws, key)["manifest"].digests["snapshotId"]
    report = validate_snapshot(ws, sid)
    assert report.ok, report.findings
    return sid


def _active(ws: Workspace, key: str) -> str:
    sid = _built(ws, key)
    approve(ws, sid, "reviewer")
    activate(ws, sid, "publisher")
    assert states.get(ws.catalog, sid).state == states.ACTIVE
    return sid


def _packed(ws: Workspace, sid: str) -> dict:
    manifest = json.loads(ws.cas.get_bytes(states.get(ws.catalog, sid).manifest_digest))
    return json.loads(ws.cas.get_bytes(manifest["layers"]["packed_blocks"]["digest"]))


def _all_tokens(reader: TrainingReader) -> tuple[list[int], bytes]:
    indexes, data = [], bytearray()
    for index, block in reader.blocks():
        assert len(block) == reader.block_tokens
        indexes.append(index)
        data += bytes(block)
    return indexes, bytes(data)


def test_only_an_active_digest_for_its_purpose_gets_a_permit(workspace: Workspace) -> None:
    ws = workspace
    alias, purpose = ws.config.alias, ws.config.purpose
    validated = _built(ws, "p1")
    with pytest.raises(TrainingError, match=r"VALIDATED.*ACTIVE") as refused:
        take_permit(ws.cas, ws.catalog, validated, "run-1", purpose)
    assert validated in str(refused.value) and "run-1" in str(refused.value)
    with pytest.raises(TrainingError, match="no active snapshot"):
        resolve_alias(ws.catalog, alias)

    approve(ws, validated, "reviewer")
    activate(ws, validated, "publisher")
    for name in ("latest", alias, validated.removeprefix("sha256:"), validated.upper()):
        with pytest.raises(TrainingError, match="accepts only a snapshot digest"):
            take_permit(ws.cas, ws.catalog, name, "run-1", purpose)
    with pytest.raises(TrainingError, match="no snapshot with id or manifest digest"):
        take_permit(ws.cas, ws.catalog, "sha256:" + "0" * 64, "run-1", purpose)
    with pytest.raises(TrainingError, match=r"purposes must match") as wrong:
        take_permit(ws.cas, ws.catalog, validated, "run-1", "not-" + purpose)
    assert repr(purpose) in str(wrong.value) and validated in str(wrong.value)
    with pytest.raises(TrainingError, match="non-empty run id"):
        take_permit(ws.cas, ws.catalog, validated, " ", purpose)
    with ws.catalog.begin() as conn:
        assert conn.execute(select(permits)).all() == []  # refusals leave nothing behind

    # the alias is resolved once, explicitly; the manifest CAS digest names the same snapshot
    assert resolve_alias(ws.catalog, alias) == validated
    manifest_digest = states.get(ws.catalog, validated).manifest_digest
    permit = take_permit(ws.cas, ws.catalog, manifest_digest, "run-1", purpose)
    assert (permit.snapshot_id, permit.alias, permit.resumed) == (validated, alias, False)
    assert permit.generation == 1


def test_reader_yields_the_verified_tokens_and_reports_every_digest(workspace: Workspace) -> None:
    ws = workspace
    sid = _active(ws, "p1")
    permit = take_permit(ws.cas, ws.catalog, sid, "run-1", ws.config.purpose)
    packed = _packed(ws, sid)
    outputs, counts = packed["outputs"], packed["counts"]
    reader = TrainingReader(ws.cas, ws.catalog, permit)

    indexes, data = _all_tokens(reader)
    assert indexes == list(range(counts["blocks"]))
    assert len(data) == counts["blocks"] * counts["block_tokens"] * 2
    index = json.loads(ws.cas.get_bytes(outputs["shard_index"]["digest"]))
    stored = b"".join(  # input_ids is each shard's first field: its (blocks, T) uint16 array
        ws.cas.get_bytes(s["digest"])[: s["blocks"] * counts["block_tokens"] * 2]
        for s in index["shards"]
    )
    assert data == stored
    assert [i for i, _ in reader.blocks(start=counts["blocks"] - 1)] == [counts["blocks"] - 1]

    members, spans = reader.members(), reader.spans()
    manifest = json.loads(ws.cas.get_bytes(states.get(ws.catalog, sid).manifest_digest))
    assert members.num_rows == manifest["members"]["count"]
    assert spans.num_rows == counts["spans"]
    # every span points at a member
    assert set(spans.column("record_id").to_pylist()) <= set(
        members.column("record_id").to_pylist()
    )

    report = reader.report()
    assert (report["snapshotId"], report["runId"], report["permitId"]) == (
        sid,
        "run-1",
        permit.permit_id,
    )
    read = {entry["what"]: (entry["digest"], entry["bytes"]) for entry in report["read"]}
    assert read["shard index"] == (outputs["shard_index"]["digest"], outputs["shard_index"]["size"])
    assert read["shard"] == (outputs["shards"][-1]["digest"], outputs["shards"][-1]["size"])
    assert read["spans"] == (outputs["spans"]["digest"], outputs["spans"]["size"])
    assert read["members parts"] == (manifest["members"]["digest"], manifest["members"]["size"])
    parts = {(p["digest"], p["size"]) for p in get_json(ws.cas, manifest["members"])["parts"]}
    assert {(e["digest"], e["bytes"]) for e in report["read"] if e["what"] == "members"} == parts
    assert read["manifest"][0] == states.get(ws.catalog, sid).manifest_digest

    # a Permit object that the catalog never granted opens nothing
    forged = Permit(**{**permit.__dict__, "run_id": "run-forged"})
    with pytest.raises(TrainingError, match="not recorded in the catalog"):
        TrainingReader(ws.cas, ws.catalog, forged)


def test_resume_keeps_the_original_digest_and_new_data_is_a_new_run(workspace: Workspace) -> None:
    ws = workspace
    purpose = ws.config.purpose
    first = _active(ws, "p1")
    permit = take_permit(ws.cas, ws.catalog, first, "run-1", purpose)
    second = _active(ws, "p2")
    assert second != first and resolve_alias(ws.catalog, ws.config.alias) == second

    resumed = take_permit(ws.cas, ws.catalog, first, "run-1", purpose)
    assert resumed == Permit(**{**permit.__dict__, "resumed": True})
    with pytest.raises(TrainingError, match="changed data means a new run") as changed:
        take_permit(ws.cas, ws.catalog, second, "run-1", purpose)
    assert first in str(changed.value) and second in str(changed.value)
    with pytest.raises(TrainingError, match="purposes must match"):
        take_permit(ws.cas, ws.catalog, first, "run-1", "other")
    fresh = take_permit(ws.cas, ws.catalog, second, "run-2", purpose)
    assert (fresh.snapshot_id, fresh.resumed, fresh.generation) == (second, False, 2)
    assert fresh.permit_id != permit.permit_id


def test_a_fence_moved_after_activation_refuses_new_permits_not_pinned_runs(
    workspace: Workspace,
) -> None:
    ws = workspace
    purpose = ws.config.purpose
    sid = _active(ws, "p1")
    pinned = take_permit(ws.cas, ws.catalog, sid, "run-1", purpose)
    reader = TrainingReader(ws.cas, ws.catalog, pinned)
    before = _all_tokens(reader)

    with ws.catalog.begin() as conn:  # what a tombstone advance does to the gate row
        conn.execute(text("UPDATE gate SET tombstone_watermark = tombstone_watermark + 1"))
    with pytest.raises(TrainingError, match=r"tombstone watermark 0 .* tombstone watermark 1"):
        take_permit(ws.cas, ws.catalog, sid, "run-2", purpose)
    with ws.catalog.begin() as conn:
        conn.execute(text("UPDATE gate SET benchmark_fence = benchmark_fence + 5"))
    with pytest.raises(TrainingError, match=r"benchmark fence 0.*benchmark fence 5"):
        take_permit(ws.cas, ws.catalog, sid, "run-2", purpose)

    # the run that already holds a permit resumes and reads its pinned inputs unchanged
    again = take_permit(ws.cas, ws.catalog, sid, "run-1", purpose)
    assert again.permit_id == pinned.permit_id and again.resumed
    assert _all_tokens(TrainingReader(ws.cas, ws.catalog, again)) == before


def _let_it_wait(ws: Workspace, worker: threading.Thread, timeout: float = 60) -> None:
    """Until PostgreSQL shows a session of the catalog waiting on a lock (the permit on the gate
    row). SQLite shows no waiter: there the worker gets half a second to decide wrongly."""
    if ws.catalog.engine.dialect.name != "postgresql":
        worker.join(timeout=0.5)
        return
    waiting = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    deadline = time.monotonic() + timeout
    while True:
        with ws.catalog.begin() as conn:
            if conn.scalar(waiting):
                return
        assert worker.is_alive() and time.monotonic() < deadline, "the permit never waited"
        time.sleep(0.02)


def test_a_permit_serialises_with_a_concurrent_fence_advance(workspace: Workspace) -> None:
    """The advance holds the gate row; the permit waits for it and then sees the new fence."""
    ws = workspace
    sid = _active(ws, "p1")
    outcome: dict[str, object] = {}

    def permit() -> None:
        try:
            outcome["permit"] = take_permit(ws.cas, ws.catalog, sid, "run-1", ws.config.purpose)
        except TrainingError as error:
            outcome["error"] = error

    with ws.catalog.engine.connect() as conn:
        advance = conn.begin()
        conn.execute(text("UPDATE gate SET tombstone_watermark = tombstone_watermark + 1"))
        worker = threading.Thread(target=permit)
        worker.start()
        _let_it_wait(ws, worker)
        assert worker.is_alive(), outcome  # waiting on the gate row, not deciding on stale data
        advance.commit()
    worker.join(timeout=30)
    assert "permit" not in outcome
    assert "tombstone watermark 1" in str(outcome["error"])


def test_a_flipped_byte_in_a_shard_is_caught_before_its_block(workspace: Workspace) -> None:
    ws = workspace
    sid = _active(ws, "p1")
    permit = take_permit(ws.cas, ws.catalog, sid, "run-1", ws.config.purpose)
    reader = TrainingReader(ws.cas, ws.catalog, permit)
    shard = _packed(ws, sid)["outputs"]["shards"][0]["digest"]
    path = ws.cas.path(shard)
    flipped = bytearray(path.read_bytes())
    flipped[len(flipped) - 1] ^= 0x01  # the last label byte of the last block
    path.write_bytes(bytes(flipped))

    delivered = []
    with pytest.raises(ShardCorruptError, match=rf"shard {shard} chunk 0 is corrupt"):
        for block in reader.blocks():
            delivered.append(block)
    assert delivered == []  # the demo's shard is one chunk: no block of it is handed out
    assert all(entry["what"] != "shard" for entry in reader.report()["read"])


def test_a_damaged_members_table_gets_no_permit_and_a_pinned_run_keeps_its_own(
    workspace: Workspace,
) -> None:
    ws = workspace
    sid = _active(ws, "p1")
    pinned = take_permit(ws.cas, ws.catalog, sid, "run-1", ws.config.purpose)
    members = json.loads(ws.cas.get_bytes(ws.catalog.layer_output("p1", "manifest")))["members"]
    path = ws.cas.path(members["digest"])
    original = path.read_bytes()
    path.write_bytes(original[:-100])
    with pytest.raises(TrainingError, match=rf"is damaged: .*manifest.members {members['digest']}"):
        take_permit(ws.cas, ws.catalog, sid, "run-2", ws.config.purpose)
    path.write_bytes(original)
    part = ws.cas.path(get_json(ws.cas, members)["parts"][0]["digest"])
    part.write_bytes(part.read_bytes()[:-100])
    with pytest.raises(TrainingError, match=r"is damaged: .*manifest.members part of "):
        take_permit(ws.cas, ws.catalog, sid, "run-2", ws.config.purpose)
    again = take_permit(ws.cas, ws.catalog, sid, "run-1", ws.config.purpose)
    assert again.resumed and again.permit_id == pinned.permit_id


def test_a_stream_resumes_under_another_layout_and_refuses_another_pack(
    workspace: Workspace,
) -> None:
    """Stop after some positions at world 2 x 2 workers, resume at world 1: the blocks read
    are exactly the uninterrupted epoch's, in order; a state of another pack or seed is refused."""
    ws = workspace
    sid = _active(ws, "p1")
    permit = take_permit(ws.cas, ws.catalog, sid, "run-1", ws.config.purpose)
    with TrainingReader(ws.cas, ws.catalog, permit) as reader:
        whole = reader.stream(seed=7).block_numbers().tolist()
        assert sorted(whole) == list(range(reader.block_count)) and whole != sorted(whole)
        first = reader.stream(seed=7)
        per_worker = {
            (rank, worker): first.block_numbers(rank, 2, worker, 2).tolist()
            for rank in range(2)
            for worker in range(2)
        }
        stop = 3  # positions 0..2: rank p % 2, its k-th position to worker k % 2
        consumed = [per_worker[(p % 2, (p // 2) % 2)][p // 4] for p in range(stop)]
        saved = json.loads(json.dumps(first.state_after(stop).state_dict()))
    with TrainingReader(ws.cas, ws.catalog, permit) as again:
        rest = [n for n, _ in again.stream(seed=7, saved=saved).blocks()]
        assert consumed + rest == whole
        for field, value in [("pack_digest", "sha256:" + "0" * 64), ("seed", 8)]:
            with pytest.raises(ReaderStateError, match=field):
                again.stream(seed=7, saved={**saved, field: value})
