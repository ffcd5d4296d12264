"""Near-dedup banding and verification on the task runner, same bytes as in-process.

Real builds of the demo sources plus near duplicates in two classes (document/prose: a family
of near copies of one long essay, larger than the bucket cap; messages/prose: near copies of a
long chat) with a small ``bucket_heads``, so some buckets are capped. With one worker the
classes run in the driver (the in-process path); with 2 and 4 workers map, reduce and verify
tasks run on the spawn pool, with partition counts that differ (and with the default count,
one partition, the classes stay in-process). Every output of the dedup layer and its digest
must be the same bytes, the tasks must have run in other processes, and each candidate pair
must have been verified once. An incremental child on workers equals fresh builds.
"""

import json
import random
import shutil
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.dedup.band_index import Banding
from corpus_assets.core.pipeline import BUILDERS, build_all
from corpus_assets.core.publication.publish import activate, approve
from corpus_assets.core.runtime.layer_index import LayerResult, read_layer_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.pool import shared_pool
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.table_lookup import TrustedFiles

_POLICY = "  dedup: {near: {bucket_heads: 3}}\n"  # a family of 9 fills capped buckets


def _long(rng: random.Random, vocab: list[str], words: int = 150) -> str:
    return " ".join(rng.choices(vocab, k=words))


def _edited(text: str, rng: random.Random, vocab: list[str]) -> str:
    split = text.split(" ")
    split[rng.randrange(len(split))] = rng.choice(vocab)
    return " ".join(split)


def _vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(3000)]


def _add_near_duplicates(home: Path, seed: int, name: str) -> None:
    """Essays: a family of near copies of one long text and a few pairs; chats: near copies."""
    rng = random.Random(seed)
    vocab = _vocabulary(rng)
    family = _long(rng, vocab)
    essays = [(f"{name}-fam{n:02d}", _edited(family, rng, vocab), "fam") for n in range(9)]
    for n in range(4):
        text = _long(rng, vocab, 100 + 10 * n)
        edited = _edited(text, rng, vocab)
        essays += [(f"{name}-pair{n}a", text, f"p{n}"), (f"{name}-pair{n}b", edited, f"q{n}")]
    lines = "".join(json.dumps({"id": i, "text": t, "topic": g}) + "\n" for i, t, g in essays)
    (home / "demo-sources" / "essays" / f"{name}.jsonl").write_text(lines)
    chat = [_long(rng, vocab, 80), _long(rng, vocab, 80)]
    chats = []
    for n in range(4):
        messages = [{"role": "user", "content": _edited(chat[0], rng, vocab)}]
        messages.append({"role": "assistant", "content": chat[1]})
        chats.append({"id": f"{name}-chat{n}", "messages": messages})
    lines = "".join(json.dumps(c) + "\n" for c in chats)
    (home / "demo-sources" / "chats" / f"{name}.jsonl").write_text(lines)


def _home(
    demo_home: Path,
    home: Path,
    workers: int,
    monkeypatch: pytest.MonkeyPatch,
    stages: str = "runner",
) -> Path:
    """A copy of the demo sources with the near duplicates, ``workers``, ``stages`` and the
    small cap."""
    if not (home / "demo-sources").exists():
        shutil.copytree(demo_home / "demo-sources", home / "demo-sources")
        _add_near_duplicates(home, 33, "near")
        # an object without a record: a chunk of no rows, whose part the runner's path puts too
        (home / "demo-sources" / "essays" / "blank.jsonl").write_text("\n")
    config = (demo_home / "corpus.yaml").read_text().replace("policies:\n", "policies:\n" + _POLICY)
    essays = "path: demo-sources/essays\n"  # grouped: group ids differ from record ids
    config = config.replace(essays, essays + "    group_field: topic\n")
    execution = f"execution: {{workers: {workers}, in_process_bytes: 0, stages: {stages}}}\n"
    (home / "corpus.yaml").write_text(config + execution)
    monkeypatch.setenv("CORPUS_HOME", str(home))
    monkeypatch.setenv("CORPUS_CONFIG", str(home / "corpus.yaml"))
    return home


def _dedup(ws: Workspace, key: str) -> LayerResult:
    """The layers up to dedup, on one pool (as a build runs them)."""
    with shared_pool():
        for layer in ("raw_snapshot", "canonical_records"):
            BUILDERS[layer](ws, key)
        return BUILDERS["dedup_clusters"](ws, key)


def _published(ws: Workspace, key: str, result: LayerResult) -> dict[str, object]:
    """The layer's digest and every output's ref (bytes: digests and sizes)."""
    _, index = read_layer_index(ws, key, "dedup_clusters")
    return {"digest": result.digest, "outputs": index.outputs}


def _build(
    demo_home: Path,
    home: Path,
    workers: int,
    partitions: int | None,
    monkeypatch: pytest.MonkeyPatch,
    stages: str = "runner",
) -> tuple[dict[str, object], LayerResult]:
    if partitions is None:
        monkeypatch.delenv("CORPUS_DEDUP_PARTITIONS", raising=False)
        monkeypatch.delenv("CORPUS_GATHER_ROWS", raising=False)
        monkeypatch.delenv("CORPUS_CODE_PARTITIONS", raising=False)
    else:  # ... the clusters join in several gather tasks, the codes in several merges
        monkeypatch.setenv("CORPUS_DEDUP_PARTITIONS", str(partitions))
        monkeypatch.setenv("CORPUS_GATHER_ROWS", str(40 * partitions + 7))
        monkeypatch.setenv("CORPUS_CODE_PARTITIONS", str(partitions))
    ws = open_workspace(_home(demo_home, home, workers, monkeypatch, stages) / "corpus.yaml")
    try:
        result = _dedup(ws, "p1")
        return _published(ws, "p1", result), result
    finally:
        ws.close()


def test_workers_and_partitions_publish_the_same_dedup_bytes(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, here = _build(demo_home, tmp_path / "w1", 1, None, monkeypatch)
    assert "band_reduce_tasks" not in here.run_stats  # one worker: the in-process path
    assert "code_run_tasks" not in here.run_stats  # ... and the coding sorts in DuckDB
    ws = open_workspace(tmp_path / "w1" / "corpus.yaml")
    parted = PartedTable.read(ws.cas, one["outputs"]["clusters"], "clusters")  # type: ignore[index]
    counts = parted.counts
    rows = [pq.read_table(p) for p in parted.paths(TrustedFiles(ws.cas, ws.catalog), "clusters")]
    ws.close()
    # the clusters count is the kept rows': every row not excluded stands behind one of them
    standing = [t.filter(pc.not_equal(t["verdict"], "excluded")) for t in rows]
    representatives = {r for t in standing for r in t["representative_id"].to_pylist()}
    kept = {r for t in standing for r in t.filter(t["is_representative"])["record_id"].to_pylist()}
    assert representatives == kept and here.counts["clusters"] == len(kept) > 0
    assert counts is not None and 0 in counts and sum(counts) > 0  # the blank object's part
    assert here.counts["near_duplicates"] >= 12
    classes = here.details["classes"]
    assert {c for c, v in classes.items() if v["near_duplicates"]} >= {
        "messages/prose",
        "document/prose",
    }, classes
    assert classes["document/prose"]["bands"]["capped_buckets"] > 0
    for workers, partitions in ((2, 3), (4, 5), (2, None)):
        home = tmp_path / f"w{workers}-p{partitions}"
        published, result = _build(demo_home, home, workers, partitions, monkeypatch)
        assert published == one, (workers, partitions)
        stats = result.run_stats
        assert stats["pairs_verified"] == here.run_stats["pairs_verified"]
        # the record codes came from tasks: a run per chunk, merges per partition of each set
        assert stats["code_run_tasks"] == stats["code_order_run_tasks"] == len(counts), stats
        merges = 3 * (partitions or 1)  # record and group ids, dedup keys, the total order
        assert stats["code_merge_tasks"] == merges, stats
        # each set's merges are one call: a lone merge runs here (as any lone job on the local
        # pool: same bytes, no worker started for it), several on the pool's workers
        assert stats["code_merge_elsewhere"] == (merges if partitions else 0), stats
        if partitions is None:  # small classes, one partition: in-process, as one worker does
            assert "band_reduce_tasks" not in stats, stats
            continue
        assert stats["band_reduce_tasks"] == len(classes) * partitions, stats
        assert stats["pair_verify_tasks"] == len(classes) * partitions, stats
        # the pool's workers ran every reduce and verify task, not this process
        assert stats["band_reduce_elsewhere"] == stats["band_reduce_tasks"], stats
        assert stats["pair_verify_elsewhere"] == stats["pair_verify_tasks"], stats
        # every candidate pair was verified once, the ones the scan skips too
        candidates = sum(c["candidate_pairs"] for c in classes.values())
        assert stats["band_pairs_verified"] == candidates > stats["pairs_verified"] > 0
        # ... and the clusters table was joined by gather tasks in the pool's workers
        assert stats["clusters_gather_elsewhere"] == stats["clusters_gather_tasks"] > 0, stats


@pytest.mark.parametrize("from_index", [True, False])
def test_incremental_child_on_workers_equals_a_fresh_build(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, from_index: bool
) -> None:
    """A child's classes banded from its parent's band index in the driver, or (a class its
    parent's index lacks) on the band tasks over the record codes carried from the parent:
    the order the driver holds, written for the tasks."""
    monkeypatch.setenv("CORPUS_DEDUP_PARTITIONS", "2")
    home = _home(demo_home, tmp_path / "chain", 2, monkeypatch)
    ws = open_workspace(home / "corpus.yaml")
    with shared_pool():
        first = build_all(ws, "p1")
    sid = first["manifest"].digests["snapshotId"]
    approve(ws, sid, by="reviewer")
    activate(ws, sid, actor="test")
    _add_near_duplicates(home, 34, "later")  # new near copies of each other
    extra = (home / "demo-sources" / "essays" / "near.jsonl").read_text().splitlines()
    with open(home / "demo-sources" / "essays" / "later.jsonl", "a") as f:
        for line in extra[:3]:  # ... and of old records (new ids, edited texts)
            row = json.loads(line)
            f.write(json.dumps({"id": row["id"] + "-again", "text": row["text"] + " more"}) + "\n")
    with monkeypatch.context() as patched:
        if not from_index:  # as for a class the parent's index lacks
            patched.setattr(Banding, "incremental", lambda self, name: False)
        child = _dedup(ws, "p2")
    chain = _published(ws, "p2", child)
    ws.close()
    stats = child.run_stats
    assert stats["near_incremental"] == 1, child.details["near_mode"]
    assert stats["pairs_reused"] > 0 and stats["codes_carried"] == 1
    if from_index:
        # its classes are banded from the parent's band index in the driver (a merge of the
        # new records' keys), so no band task runs and the scan verifies only what it needs
        assert stats["band_classes_incremental"] >= 1 and "band_reduce_tasks" not in stats
        assert 0 < stats["pairs_computed"] < stats["pairs_verified"]
    else:
        assert stats["band_reduce_tasks"] > 0 and not stats.get("band_classes_incremental")
    for workers in (2, 1):
        fresh = tmp_path / f"fresh{workers}"
        shutil.copytree(home / "demo-sources", fresh / "demo-sources")
        fresh_home = _home(demo_home, fresh, workers, monkeypatch)
        again = open_workspace(fresh_home / "corpus.yaml")
        scratch = _dedup(again, "p2")
        assert scratch.run_stats["near_incremental"] == 0
        outputs = _published(again, "p2", scratch)["outputs"]
        again.close()
        assert outputs == chain["outputs"], workers


def test_the_local_pool_keeps_near_dedup_in_the_driver_unless_asked(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``execution.stages: auto`` (the default) sends the stages to Ray only: on the local pool
    the in-process path is cheaper (it skips verifying linked pairs); the bytes are the same."""
    asked, on_workers = _build(demo_home, tmp_path / "runner", 2, 3, monkeypatch)
    auto, in_driver = _build(demo_home, tmp_path / "auto", 2, 3, monkeypatch, "auto")
    assert on_workers.run_stats["band_reduce_tasks"] > 0
    assert on_workers.run_stats["clusters_gather_tasks"] > 0  # the join's tasks: same bytes
    for stage in ("band_reduce_tasks", "clusters_gather_tasks"):
        assert stage not in in_driver.run_stats, in_driver.run_stats
    assert auto == asked
