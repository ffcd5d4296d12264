"""The held-out search runs as chunk-group tasks in worker processes, same bytes.

Real builds of the demo with near copies of its essays (one, two and three words changed, so
the search finds held-out near pairs, some verified by dedup and many not): the splits layer's
digest and every output are the same with 1, 2 and 4 workers and two chunk-group sizes, the
tasks ran in spawned worker processes, and a child that starts from its parent's search state
with two workers publishes what the same child searched from scratch publishes.
"""

import json
import random
from pathlib import Path

import pytest

from corpus_assets.core.governance import states
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.publish import activate, approve
from corpus_assets.core.runtime.layer_index import LayerResult, load_index, read_layer_index
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.artifacts import get_json
from corpus_assets.core.training_view.splits import build_splits
from corpus_assets.core.training_view.splits.heldout import FULL, INCREMENTAL
from corpus_assets.core.training_view.splits.heldout_tasks import GROUP_ENV, chunk_groups
from corpus_assets.demo import write_demo

ESSAYS = Path("demo-sources") / "essays"
WORK = ("fingerprinted", "tasks", "task_processes", "task_cpu_s")  # done, not found


def _add_near_copies(home: Path, name: str, seed: int) -> None:
    """Near copies of every demo essay (1, 2 and 3 words changed) as one more object."""
    rng = random.Random(seed)
    rows = []
    for path in sorted((home / ESSAYS).glob("essays-000[0-3]*.jsonl")):
        for line in path.read_text().splitlines():
            old = json.loads(line)
            for copy in range(3):
                words = old["text"].split(" ")
                for _ in range(copy + 1):
                    words[rng.randrange(len(words))] = rng.choice(["zebra", "yak", "gnu"])
                rows.append({"id": f"{name}{copy}-{old['id']}", "text": " ".join(words)})
    (home / ESSAYS / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _home(tmp_path: Path, workers: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The demo with near copies, ``workers`` workers and the pool always used."""
    return demo_with_near_copies(
        tmp_path, f"{{workers: {workers}, in_process_bytes: 0, stages: runner}}", monkeypatch
    )


def demo_with_near_copies(tmp_path: Path, execution: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The demo with near copies of its essays under ``tmp_path``, run with ``execution``."""
    home = tmp_path / "corpus"
    config = write_demo(home)
    config.write_text(config.read_text() + f"execution: {execution}\n")
    _add_near_copies(home, "essays-00040", 33)
    monkeypatch.setenv("CORPUS_HOME", str(home))
    monkeypatch.setenv("CORPUS_CONFIG", str(config))
    return home


def _use_workers(home: Path, workers: int) -> None:
    config = home / "corpus.yaml"
    text = config.read_text().rsplit("execution:", 1)[0]
    execution = f"{{workers: {workers}, in_process_bytes: 0, stages: runner}}"
    config.write_text(text + f"execution: {execution}\n")


def found(result: LayerResult) -> tuple[str, dict[str, str], dict]:
    """The layer's digest, its outputs' digests and what its search found."""
    search = result.details["heldout_search"]
    return result.digest, result.digests, {k: v for k, v in search.items() if k not in WORK}


def test_chunk_groups_depend_on_record_counts_only() -> None:
    assert chunk_groups([120, 80, 240, 69, 20], 150) == [(0, 2), (2, 3), (3, 5)]
    assert chunk_groups([120, 80], 1) == [(0, 1), (1, 2)]
    assert chunk_groups([120, 80], 1000) == [(0, 2)]
    assert chunk_groups([], 10) == []


def test_the_splits_layer_is_the_same_bytes_on_1_2_and_4_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One build; its splits layer built again with each worker count and group size."""
    home = _home(tmp_path, 1, monkeypatch)
    with open_workspace() as ws:
        first = build_all(ws, "p1")["splits"]
    alone = found(first)
    assert "tasks" not in first.details["heldout_search"]  # one worker: searched here
    search = alone[2]
    assert search["pairs"] > 0 and first.counts["heldout_near_pairs"] > 0, search
    assert search["computed"] > 0 and search["known"] > 0, search  # verification ran
    for workers, group in ((2, 1), (2, 150), (4, 1)):
        monkeypatch.setenv(GROUP_ENV, str(group))
        _use_workers(home, workers)
        with open_workspace() as ws:
            again = build_splits(ws, "p1")
        done = again.details["heldout_search"]
        assert found(again) == alone, (workers, group)
        assert done["tasks"] == (5 if group == 1 else 3), done  # chunks [120, 80, 240, 69, 20]
        assert done["task_processes"] >= 1, done  # spawned workers, never this process


def test_an_incremental_child_on_two_workers_equals_a_full_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child starts from its parent's search state with its tasks on two workers; with the
    parent's state and verified pairs gone it searches every pair: the same bytes."""
    home = _home(tmp_path, 2, monkeypatch)
    monkeypatch.setenv(GROUP_ENV, "1")
    ws = open_workspace()
    sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
    approve(ws, sid, by="reviewer")
    activate(ws, sid, actor="test")
    _add_near_copies(home, "essays-00041", 34)
    child = build_all(ws, "p2")["splits"]
    search = child.details["heldout_search"]
    assert search["state"] == INCREMENTAL and search["reused"] > 0, search
    assert search["tasks"] > 1 and search["task_processes"] >= 1, search
    assert search["candidates"] > 0 and search["computed"] > 0, search

    _, index = read_layer_index(ws, "p2", "splits")
    manifest = get_json(ws.cas, states.get(ws.catalog, sid).manifest_digest, "manifest")
    parent = load_index(ws.cas, manifest["layers"]["splits"], "splits")
    for output in ("heldout_state", "heldout_verified"):
        ws.cas.local_path(parent.output(output)["digest"]).unlink(missing_ok=True)
    again = build_splits(ws, "p2")
    full = again.details["heldout_search"]
    assert full["state"] == FULL and full["mode"] == FULL, full
    assert full["tasks"] > 1, full
    assert (again.digest, again.digests) == (child.digest, child.digests)
    assert index.outputs["heldout_pairs"]["digest"] == again.digests["heldout_pairs"]
    ws.close()
