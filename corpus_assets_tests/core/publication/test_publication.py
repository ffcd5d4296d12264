"""Publication end to end on both catalogs: tombstones through the gate, rollback rules, lineage."""

import json

import pyarrow.compute as pc
import pytest

from corpus_assets.core.governance import alias_gate, benchmarks, states, tombstones
from corpus_assets.core.governance.deletion_reach import tombstone_hits
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.block_reader import BlockReader
from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.publication.publish import activate, approve, rollback
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.tokens.spec import UTF8_IDS


def _publish(ws: Workspace, key: str) -> str:
    sid = build_all(ws, key)["manifest"].digests["snapshotId"]
    report = validate_snapshot(ws, sid)
    assert report.ok, report.findings
    approve(ws, sid, by="reviewer")
    activate(ws, sid, actor="test")
    return sid


def _members(ws: Workspace, sid: str) -> list[str]:
    snapshot = states.get(ws.catalog, sid)
    manifest = json.loads(ws.cas.get_bytes(snapshot.manifest_digest))
    table = read_members(ws.cas, manifest["members"])
    return table.column("record_id").to_pylist()


def test_rollback_bumps_generation_and_never_crosses_a_tombstone(workspace: Workspace) -> None:
    first = _publish(workspace, "p1")
    second = _publish(workspace, "p2")
    row = rollback(workspace.cas, workspace.catalog, first, actor="test")
    assert (row.active_snapshot, row.generation) == (first, 3)
    with pytest.raises(alias_gate.AliasGateError, match="already points"):
        rollback(workspace.cas, workspace.catalog, first, actor="test")

    seq = tombstones.add_tombstone(workspace.catalog, "record", "essays/e0001", "deletion request")
    fenced = alias_gate.read_alias_gate(workspace.catalog, "demo")
    assert (fenced.tombstone_watermark, fenced.generation) == (seq, 3)
    with pytest.raises(
        alias_gate.AliasGateError, match=f"tombstone watermark 0, the gate is at {seq}"
    ):
        rollback(workspace.cas, workspace.catalog, second, actor="test")
    assert alias_gate.read_alias_gate(workspace.catalog, "demo").active_snapshot == first

    # the next build excludes the revoked record, validates and activates past the fence
    third = _publish(workspace, "p3")
    assert "essays/e0001" in _members(workspace, second)
    assert "essays/e0001" not in _members(workspace, third)
    assert alias_gate.read_alias_gate(workspace.catalog, "demo").generation == 4

    lineage = tombstone_hits(workspace.cas, workspace.catalog, seq)
    assert [s["snapshotId"] for s in lineage["snapshots"]] == [first, second]
    assert all(s["members"] == ["essays/e0001"] and s["spans"] for s in lineage["snapshots"])
    _check_hit_spans(workspace, lineage["snapshots"][0], "essays/e0001")


def _check_hit_spans(ws: Workspace, hit: dict, record_id: str) -> None:
    """The listed shard, block and [start, end) of every span hold the record's whole token
    stream (utf8-bytes-v1: its text's bytes, then EOS), read back from the shard itself."""
    text = CanonicalIndex.read(ws, hit["partition"])[1].table(["record_id", "text"])
    (row,) = text.filter(pc.equal(text.column("record_id"), record_id)).to_pylist()
    manifest = json.loads(
        ws.cas.get_bytes(states.get(ws.catalog, hit["snapshotId"]).manifest_digest)
    )
    packed = load_index(ws.cas, manifest["layers"]["packed_blocks"], "packed_blocks")
    stream = []
    with BlockReader.open(ws.cas, packed.output("shard_index")["digest"]) as reader:
        for span in hit["spans"]:
            assert span["record_id"] == record_id and span["record_offset"] == len(stream)
            shard, _row = reader.locate(span["block"])
            assert reader.index.shards[shard].digest == span["shard"]
            stream += reader.block(span["block"])["input_ids"][span["start"] : span["end"]].tolist()
    assert stream == [*row["text"].encode(), UTF8_IDS["eos"]]


def test_a_candidate_built_before_a_fence_cannot_activate(workspace: Workspace) -> None:
    sid = build_all(workspace, "p1")["manifest"].digests["snapshotId"]
    assert validate_snapshot(workspace, sid).ok
    approve(workspace, sid, by="reviewer")
    item = benchmarks.BenchmarkItem("bench-x/1", "sha256:" + "8" * 64, "sha256:" + "9" * 64)
    benchmarks.add_benchmark_items(workspace.catalog, "bench-x", [item])
    with pytest.raises(alias_gate.AliasGateError, match="benchmark fence 1"):
        activate(workspace, sid, actor="test")
    assert states.get(workspace.catalog, sid).state == states.APPROVED
    assert alias_gate.read_alias_gate(workspace.catalog, "demo").active_snapshot is None
