"""Issue 33 on a real Ray cluster: the held-out search's tasks run in Ray workers, same bytes.

The demo with near copies of its essays is built with the local engine (one worker: the search
in-process) and on a two-node Ray cluster on loopback (``test_ray``'s fixture; the home on this
machine's disk, which every node shares), with one task per chunk: the splits layer's digest,
outputs and search counts are the local build's.
"""

from pathlib import Path

import pytest

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.training_view.heldout_tasks import GROUP_ENV
from corpus_assets_tests.test_heldout_distributed import demo_with_near_copies, found
from corpus_assets_tests.test_ray import ray_cluster  # noqa: F401 - fixture


def test_the_heldout_search_runs_on_ray_with_the_local_bytes(
    tmp_path: Path,
    ray_cluster: str,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    demo_with_near_copies(tmp_path / "local", "{workers: 1}", monkeypatch)
    with open_workspace() as ws:
        local = build_all(ws, "p1")["splits"]
    monkeypatch.setenv(GROUP_ENV, "1")
    demo_with_near_copies(
        tmp_path / "ray", f"{{engine: ray, address: '{ray_cluster}'}}", monkeypatch
    )
    with open_workspace() as ws:
        on_ray = build_all(ws, "p1")["splits"]
    search = on_ray.details["heldout_search"]
    assert search["tasks"] == 5, search  # chunks [120, 80, 240, 69, 20], one task each
    assert search["task_processes"] >= 1, search  # Ray workers, never this process
    assert "tasks" not in local.details["heldout_search"]
    assert found(on_ray) == found(local)
    assert found(local)[2]["pairs"] > 0
