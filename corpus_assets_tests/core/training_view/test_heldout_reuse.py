"""The held-out search reuses Jaccards computed before, and finds the same pairs.

Real builds on the demo home: a parent is built and activated, the child adds near copies of
old essays and new ones. The child's splits layer must say it took its parent's verified
Jaccards and compute only the new texts' pairs; the search with that reuse must give the same
pairs and the same ``heldout_verified`` bytes as the search computing every Jaccard; a parent
that ran other splits code is not used.
"""

import json
import random
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from corpus_assets.core.governance import states
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.publish import activate, approve
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import LayerIndex, load_index, read_layer_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_json
from corpus_assets.core.storage.cas_queries import VerifiedFiles, cas_parquet
from corpus_assets.core.training_view.splits import CODE, build_splits
from corpus_assets.core.training_view.splits.heldout import (
    FULL,
    INCREMENTAL,
    HeldoutScan,
    Reuse,
    put_verified,
    reuse,
)
from corpus_assets.core.training_view.splits.heldout_rows import searched_records
from corpus_assets.core.training_view.splits.heldout_state import PriorSearch, prior_search

ESSAYS = Path("demo-sources") / "essays"


def _add_near_copies(home: Path) -> None:
    """A new essays object: one-word edits of every old essay, and a few fresh texts."""
    rng = random.Random(32)
    rows = []
    for path in sorted((home / ESSAYS).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            old = json.loads(line)
            words = old["text"].split(" ")
            words[rng.randrange(len(words))] = "zebra"
            rows.append({"id": f"copy-{old['id']}", "text": " ".join(words)})
    fresh = [" ".join(rng.choices(["alpha", "beta", "gamma", "delta"], k=60)) for _ in range(3)]
    rows += [{"id": f"fresh{n}", "text": t} for n, t in enumerate(fresh)]
    (home / ESSAYS / "essays-00042.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _parent_splits(ws: Workspace, key: str) -> LayerIndex:
    _, index = read_layer_index(ws, key, "splits")
    parent = index.outputs["parent"]
    manifest = get_json(ws.cas, states.get(ws.catalog, parent).manifest_digest, "manifest")
    return load_index(ws.cas, manifest["layers"]["splits"], "splits")


def _search(ws: Workspace, key: str, known: Reuse | None) -> tuple[list, dict, str]:
    """The search over the child's published splits: pairs, counts, heldout_verified digest."""
    _, dedup = read_layer_index(ws, key, "dedup_clusters")
    _, splits = read_layer_index(ws, key, "splits")
    scan = HeldoutScan.open(ws, CanonicalIndex.read(ws, key)[1].chunks(), dedup)
    assert scan is not None
    with duckdb.connect() as con:
        con.execute(
            "CREATE TABLE final AS SELECT record_id, split FROM "
            + cas_parquet(ws.cas, splits.output("splits"), "splits")
        )
        clusters = PartedTable.read(ws.cas, dedup.output("clusters"), "c").relation(
            VerifiedFiles(ws.cas), "c"
        )
        pairs, stats = scan.pairs(con, searched_records(clusters, "final"), known)
        return pairs.to_pylist(), stats, put_verified(ws, con)["digest"]


def test_a_child_reuses_its_parents_jaccards_for_the_same_pairs(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = open_workspace()
    first = build_all(ws, "p1")
    assert first["splits"].run_stats["heldout_incremental"] == 0
    assert first["splits"].details["heldout_search"]["reason"] == "no parent snapshot"
    sid = first["manifest"].digests["snapshotId"]
    approve(ws, sid, by="reviewer")
    activate(ws, sid, actor="test")
    _add_near_copies(demo_home)
    child = build_all(ws, "p2")["splits"]
    stats = child.run_stats
    assert stats["heldout_incremental"] == 1, child.details["heldout_search"]
    assert stats["heldout_pairs_known"] > 0
    assert 0 < stats["heldout_pairs_computed"] < stats["heldout_pairs_known"]

    _, dedup = read_layer_index(ws, "p2", "dedup_clusters")
    scan = HeldoutScan.open(ws, CanonicalIndex.read(ws, "p2")[1].chunks(), dedup)
    assert scan is not None
    parent = _parent_splits(ws, "p2")
    known = reuse(ws, dedup, scan.spec, (parent, CODE, "parent"))
    assert known.mode == INCREMENTAL and len(known.tables) == 2  # the parent's and dedup's
    plain = _search(ws, "p2", None)
    reused = _search(ws, "p2", known)
    assert plain[2] == reused[2]  # the same heldout_verified bytes
    assert plain[0] == reused[0] and len(plain[0]) > 0
    assert plain[1]["known"] < reused[1]["known"]  # identical texts only, without tables
    assert reused[1]["computed"] < plain[1]["computed"]

    other = reuse(ws, dedup, scan.spec, (parent, "splits.other@sha256:0", "parent"))
    assert other.mode == FULL and "other splits code" in other.reason
    assert len(other.tables) == 1  # dedup's pairs only (the dedup layer ran this code)
    ws.close()


def test_a_parents_collected_tables_are_computed_again_not_failed_on(demo_home: Path) -> None:
    """The parent's ``heldout_verified`` and dedup ``pairs`` gone from the store (a store
    restored without them): the child's dedup and splits say so and compute them again (a full
    search, full verification) instead of failing on a missing object."""
    ws = open_workspace()
    sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
    approve(ws, sid, by="reviewer")
    activate(ws, sid, actor="test")
    manifest = get_json(ws.cas, states.get(ws.catalog, sid).manifest_digest, "manifest")
    splits = load_index(ws.cas, manifest["layers"]["splits"], "splits")
    dedup = load_index(ws.cas, manifest["layers"]["dedup_clusters"], "dedup_clusters")
    for ref in (splits.output("heldout_verified"), dedup.output("pairs")):
        ws.cas.local_path(ref["digest"]).unlink(missing_ok=True)  # the two may be one object
    _add_near_copies(demo_home)
    child = build_all(ws, "p2")
    search = child["splits"].details["heldout_search"]
    assert search["mode"] == FULL, search
    assert search["reason"] == f"parent {sid}'s verified pairs are gone from the store", search
    assert child["splits"].run_stats["heldout_pairs_computed"] > 0
    near = child["dedup_clusters"].details["near_mode"]
    assert near == {
        "mode": "full",
        "reason": f"parent {sid}'s verified pairs are gone from the store",
    }
    ws.close()


def _searched(
    ws: Workspace, scan: HeldoutScan, splits: LayerIndex, flip: str, prior: PriorSearch | None
) -> tuple[list, str, pa.Table]:
    """The search over the child's published splits, ``flip`` (a SQL condition on record_id)
    moving some records to test: its pairs, ``heldout_verified`` digest and state."""
    with duckdb.connect() as con:
        con.execute(
            f"CREATE TABLE final AS SELECT record_id, CASE WHEN {flip} THEN 'test' ELSE split "
            f"END AS split FROM {cas_parquet(ws.cas, splits.output('splits'), 'splits')}"
        )
        parted = PartedTable.read(ws.cas, scan_dedup(ws).output("clusters"), "c")
        clusters = parted.relation(VerifiedFiles(ws.cas), "c")
        pairs, _, state = scan.searched(con, searched_records(clusters, "final"), prior=prior)
        return pairs.to_pylist(), put_verified(ws, con)["digest"], state


def scan_dedup(ws: Workspace) -> LayerIndex:
    return read_layer_index(ws, "p2", "dedup_clusters")[1]


def test_a_child_searches_only_its_changed_records_and_stores_what_a_full_search_does(
    demo_home: Path,
) -> None:
    """The child's splits layer starts from its parent's search state: the pairs of two records
    the parent searched with the same status are the parent's, only the others are searched.
    Its outputs are the bytes of a full search (its parent's state gone from the store), and a
    search over statuses many of which changed finds the pairs a full search finds."""
    ws = open_workspace()
    sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
    approve(ws, sid, by="reviewer")
    activate(ws, sid, actor="test")
    _add_near_copies(demo_home)
    child = build_all(ws, "p2")["splits"]
    search = child.details["heldout_search"]
    assert child.run_stats["heldout_state_reused"] == 1, search
    assert search["reused"] > 0 and search["candidates"] > 0, search

    parent = _parent_splits(ws, "p2")
    manifest = get_json(ws.cas, states.get(ws.catalog, sid).manifest_digest, "manifest")
    chunks = CanonicalIndex.load(ws.cas, manifest["layers"]["canonical_records"]).chunks()
    scan = HeldoutScan.open(ws, CanonicalIndex.read(ws, "p2")[1].chunks(), scan_dedup(ws))
    assert scan is not None
    policy = ws.config.policy_digest("splits")
    prior, why = prior_search(ws, scan, (parent, chunks, "parent"), CODE, policy)
    assert prior is not None, why
    _, splits = read_layer_index(ws, "p2", "splits")
    for flip in ("false", "hash(record_id) % 3 = 0"):
        plain = _searched(ws, scan, splits, flip, None)
        reused = _searched(ws, scan, splits, flip, prior)
        assert plain[:2] == reused[:2] and len(plain[0]) > 0, flip
        assert plain[2].equals(reused[2]), flip

    ws.cas.local_path(parent.output("heldout_state")["digest"]).unlink()
    again = build_splits(ws, "p2")
    assert again.details["heldout_search"]["state"] == FULL
    reason = again.details["heldout_search"]["state_reason"]
    assert reason == f"parent {sid}'s search state is gone from the store", reason
    assert again.digests == child.digests
    ws.close()
