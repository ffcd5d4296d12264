"""A whole snapshot through the core layers on both catalogs: determinism, reuse, verification."""

import json
import shutil
from pathlib import Path

import pytest
import zstandard
from sqlalchemy import insert, select

from corpus_assets.core.governance import deletion_index, states
from corpus_assets.core.governance.tombstones import add_tombstone
from corpus_assets.core.pipeline import BUILDERS, DIRECT_BUILDERS, MEMOIZED, build_all
from corpus_assets.core.publication.narrowed import NARROWED
from corpus_assets.core.publication.signing import key_paths
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.publication.verify import verify
from corpus_assets.core.runtime.layer_index import LAYERS
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.catalog import chunk_tasks, layer_memo, tombstones


def _layer_digests(ws: Workspace, key: str) -> dict[str, str]:
    return {layer: ws.catalog.layer_output(key, layer) for layer in LAYERS}


@pytest.mark.parametrize("catalog_url", ["sqlite"], indirect=True)  # the memo is plain SQL
def test_an_unchanged_snapshot_reuses_its_layers_and_a_rebuild_gives_the_same_bytes(
    workspace: Workspace,
) -> None:
    """A new partition over unchanged sources publishes the earlier layers (the memo) - the
    bytes a build would give - and anything that decides bytes (here a tombstone, which moves
    the freeze's watermark) makes the layers that read it build again."""
    first = build_all(workspace, "p1")
    second = build_all(workspace, "p2")
    for layer in MEMOIZED:
        assert second[layer].run_stats == {"layer_reused": 1}, layer
        assert second[layer].digest == first[layer].digest
        assert second[layer].counts == first[layer].counts
    assert second["dedup_clusters"].details == first["dedup_clusters"].details
    for layer in MEMOIZED:  # building for real: the same index (the catalog refuses other bytes)
        assert DIRECT_BUILDERS[layer](workspace, "p2").digest == second[layer].digest
    sids = {r["manifest"].digests["snapshotId"] for r in (first, second)}
    assert len(sids) == 2  # a new snapshot all the same: the manifest names its partition
    assert validate_snapshot(workspace, second["manifest"].digest).findings == []

    add_tombstone(workspace.catalog, "record", "no-such-record", "test")
    third = build_all(workspace, "p3")
    for layer in MEMOIZED:  # the whole freeze is in the key: conservative, chunks still reused
        assert "layer_reused" not in third[layer].run_stats, layer
    assert third["canonical_records"].run_stats == {"chunks_reused": 4, "chunks_built": 0}
    assert third["dedup_clusters"].counts["tombstoned"] == 0


def test_build_validates_and_rebuild_is_identical(workspace: Workspace) -> None:
    first = build_all(workspace, "p1")
    sid = first["manifest"].digests["snapshotId"]
    report = validate_snapshot(workspace, sid)
    assert report.ok, report.findings
    assert states.get(workspace.catalog, sid).state == states.VALIDATED
    assert report.gate.dedup_invariant_violations == 0
    assert report.gate.leakage_group_split_violations == 0
    assert report.gate.heldout_near_pairs == 0
    # the keys the blocking check shows as its gate report, in its order
    assert list(report.gate.serialized()) == [
        "source_watermark_coverage",
        "canonical_unexplained_rows",
        "dead_letters",
        "duplicate_ids",
        "unknown_sources",
        "orphan_ids",
        "lineage_completeness",
        "unexplained_rows",
        "accounting_mismatches",
        "dedup_invariant_violations",
        "leakage_group_split_violations",
        "heldout_near_pairs",
        "split_conflicts",
        "split_quarantined",
        "packing_violations",
        "tombstone_hits",
        "benchmark_hits",
        "canary_chunks",
        "canary_lines",
        "transform_replay_hash",
        "set_difference",
        "build_latency_seconds",
        "incomplete",
    ]
    counts = first["manifest"].counts
    # demo set: 4 exact duplicates; 1 malformed, 1 blank line, 1 non-chat row quarantined
    assert (counts["duplicates_removed"], counts["quarantined"]) == (5, 3)  # 4 exact, 1 near
    assert counts["members"] == counts["records"] - counts["duplicates_removed"]
    assert counts["train"] + counts["validation"] + counts["test"] == counts["members"]

    digests = _layer_digests(workspace, "p1")
    again = build_all(workspace, "p1")
    assert again["manifest"].digests["snapshotId"] == sid
    assert _layer_digests(workspace, "p1") == digests
    assert all(again[layer].run_stats == {"layer_reused": 1} for layer in MEMOIZED)


def test_second_partition_reuses_every_unchanged_object(workspace: Workspace) -> None:
    build_all(workspace, "p1")
    before = set(workspace.cas.iter_digests())
    second = build_all(workspace, "p2")
    created = set(workspace.cas.iter_digests()) - before
    one, two = _layer_digests(workspace, "p1"), _layer_digests(workspace, "p2")
    assert {k for k in LAYERS if one[k] != two[k]} == {"manifest"}
    # only the new freeze spec (it names the partition), the new manifest and its deletion
    # index directory (it names the manifest; its shards are the first snapshot's) are new bytes
    index = workspace.catalog.memo(deletion_index.memo_key(two["manifest"]))
    assert index is not None
    assert created == {workspace.catalog.freeze_digest("p2"), two["manifest"], index[0]}
    manifest = json.loads(workspace.cas.get_bytes(two["manifest"]))
    first_id = states.for_partition(workspace.catalog, "p1")[0].snapshot_id
    assert manifest["snapshotId"] == second["manifest"].digests["snapshotId"] != first_id


def test_same_inputs_give_same_bytes_in_another_home(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_workspace() as ws:
        ids = [build_all(ws, "p1")["manifest"].digests["snapshotId"]]
        first = _layer_digests(ws, "p1")
    other = tmp_path / "elsewhere"
    shutil.copytree(demo_home / "demo-sources", other / "demo-sources")
    shutil.copy(demo_home / "corpus.yaml", other / "corpus.yaml")
    monkeypatch.setenv("CORPUS_HOME", str(other))
    monkeypatch.setenv("CORPUS_CONFIG", str(other / "corpus.yaml"))
    # the same signing key too: then even the signed manifest is byte-identical
    monkeypatch.setenv("CORPUS_SIGNING_KEY", str(key_paths(demo_home)[0]))
    with open_workspace() as ws:
        ids.append(build_all(ws, "p1")["manifest"].digests["snapshotId"])
        assert _layer_digests(ws, "p1") == first
    assert ids[0] == ids[1]


def test_flipping_any_byte_of_any_object_fails_verify_naming_it(demo_home: Path) -> None:
    with open_workspace() as ws:
        manifest = build_all(ws, "p1")["manifest"]
        sid = manifest.digests["snapshotId"]
        assert verify(ws.cas, ws.catalog, sid).ok
        # The deletion index is a side table outside the snapshot (every read of it re-hashes)
        directory = ws.catalog.memo(deletion_index.memo_key(manifest.digest))[0]
        index = deletion_index.load(ws.cas, manifest.digest, directory)
        side = {directory, *index.fanout.column("digest").to_pylist()}
        # so are the narrowed canonical chunks the members table is joined from (a cache)
        with ws.catalog.begin() as conn:
            query = select(layer_memo.c.index_digest).where(layer_memo.c.layer == NARROWED)
            side |= {digest for (digest,) in conn.execute(query)}
        every = sorted(set(ws.cas.iter_digests()) - side)
        assert len(every) > 20
        for digest in every:
            path = ws.cas.path(digest)
            original = path.read_bytes()
            flipped = bytearray(original)
            flipped[len(flipped) // 2] ^= 0x01
            path.write_bytes(bytes(flipped))
            try:
                report = verify(ws.cas, ws.catalog, sid)
            finally:
                path.write_bytes(original)
            assert not report.ok, f"flipping {digest} went unnoticed"
            assert any(digest in finding for finding in report.findings), report.findings
        assert verify(ws.cas, ws.catalog, sid).ok


def test_corrupt_raw_object_is_dead_lettered_and_blocks_validation(workspace: Workspace) -> None:
    BUILDERS["raw_snapshot"](workspace, "p1")
    spec = json.loads(workspace.cas.get_bytes(workspace.catalog.freeze_digest("p1")))
    victim = spec["sources"][0]["objects"][1]["sha256"]
    path = workspace.cas.path(victim)
    path.write_bytes(path.read_bytes() + b"tampered")

    results = {layer: BUILDERS[layer](workspace, "p1") for layer in LAYERS[1:]}
    canonical = results["canonical_records"].counts
    assert (canonical["dead_letters"], canonical["chunks"]) == (1, 3)  # the rest went on
    report = validate_snapshot(workspace, results["manifest"].digests["snapshotId"])
    assert any(
        f.startswith("dead letter open: chunk essays/essays-00001.jsonl: CorruptObjectError")
        for f in report.findings
    ), report.findings
    assert any(victim in f for f in report.findings)  # verify names the corrupt object too
    sid = results["manifest"].digests["snapshotId"]
    assert states.get(workspace.catalog, sid).state == states.REJECTED

    # repaired bytes: the dead letter is retried, closes, and the new snapshot validates
    path.write_bytes(path.read_bytes()[: -len(b"tampered")])
    results = {layer: BUILDERS[layer](workspace, "p1") for layer in LAYERS[1:]}
    assert results["canonical_records"].counts["dead_letters"] == 0
    assert validate_snapshot(workspace, results["manifest"].digests["snapshotId"]).ok


def test_tombstoned_member_blocks_validation(workspace: Workspace) -> None:
    results = build_all(workspace, "p1")
    sid = results["manifest"].digests["snapshotId"]
    with workspace.catalog.begin() as conn:
        conn.execute(
            insert(tombstones).values(seq=0, record_id="essays/e0001", reason="test", at=0.0)
        )
    report = validate_snapshot(workspace, sid)
    assert report.findings == ["tombstone 0 (record 'essays/e0001') hits this snapshot"]
    assert states.get(workspace.catalog, sid).state == states.REJECTED


def test_poisoned_chunk_is_dead_lettered_while_the_others_finish(workspace: Workspace) -> None:
    source = workspace.loaded.resolve("demo-sources/essays")
    whole = zstandard.compress(b'{"id": "t", "text": "cut short"}\n' * 5000)
    (source / "essays-00002.jsonl.zst").write_bytes(whole[: len(whole) // 2])
    results = build_all(workspace, "p1")
    canonical = results["canonical_records"].counts
    assert (canonical["dead_letters"], canonical["chunks"]) == (1, 4)
    assert canonical["records"] == 289  # every other object was parsed
    with workspace.catalog.begin() as conn:
        row = conn.execute(
            select(chunk_tasks.c.attempts, chunk_tasks.c.dead_letter, chunk_tasks.c.last_error)
            .where(chunk_tasks.c.chunk_key == "essays/essays-00002.jsonl.zst")
            .where(chunk_tasks.c.layer == "canonical_records")
        ).one()
    assert (row.attempts, row.dead_letter) == (3, True)
    assert row.last_error.startswith(
        "TruncatedStreamError: raw object essays/essays-00002.jsonl.zst"
    )
    report = validate_snapshot(workspace, results["manifest"].digests["snapshotId"])
    assert [f for f in report.findings if f.startswith("dead letter open")] == [
        "dead letter open: chunk essays/essays-00002.jsonl.zst: " + row.last_error.splitlines()[0]
    ]
