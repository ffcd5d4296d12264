"""A source changed between the freeze's listing and its pins, by a test holding a real freeze
process at its ``pin/<source>/listed`` failpoint (the way selftest 001.scan-add-delete does)."""

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from corpus_assets.core.runtime.workspace import open_workspace

FREEZE = """
import sys
from corpus_assets.core.pipeline import BUILDERS
from corpus_assets.core.runtime.workspace import open_workspace
with open_workspace(sys.argv[1]) as ws:
    BUILDERS["raw_snapshot"](ws, "p1")
"""
WAIT = 60.0


def _paused_freeze(config: Path, point: str, points: Path) -> subprocess.Popen[str]:
    """A process freezing ``config``, held at ``point`` until ``<points>/<slug>.go`` exists."""
    points.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CORPUS_")},
        "CORPUS_FAILPOINTS": f"{point}=pause@1",
        "CORPUS_FAILPOINT_DIR": str(points),
    }
    process = subprocess.Popen(
        [sys.executable, "-c", FREEZE, str(config)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    paused = points / (point.replace("/", "_") + ".paused")
    deadline = time.monotonic() + WAIT
    while not paused.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the freeze never paused at {point}: {process.communicate()}")
        time.sleep(0.02)
    return process


def test_index_rewritten_after_listing_pins_the_bytes_that_were_listed(tmp_path: Path) -> None:
    """The index is read once: the objects are listed from those bytes and those bytes are
    pinned, so the pinned index names exactly what the freeze saw; the rewrite is deferred."""
    for name in "abc":
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"id": name, "text": name * 8}) + "\n")
    listed = b"a.jsonl\nb.jsonl\n"
    (tmp_path / "index.txt").write_bytes(listed)
    config = tmp_path / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: race-test\nstorage: {{home: {tmp_path / 'home'}}}\n"
        "sources:\n  - {id: web, kind: objects, index: index.txt}\n"
    )
    process = _paused_freeze(config, "pin/web/listed", tmp_path / "points")
    (tmp_path / "index.txt").write_bytes(b"b.jsonl\nc.jsonl\n")  # rewritten between list and pin
    (tmp_path / "points" / "pin_web_listed.go").touch()
    _out, err = process.communicate(timeout=WAIT)
    assert process.returncode == 0, err
    with open_workspace(config) as ws:
        spec = json.loads(ws.cas.get_bytes(ws.catalog.freeze_digest("p1")))
    (source,) = spec["sources"]
    base = (tmp_path / "x").as_uri()[:-1]
    assert [o["name"].removeprefix(base) for o in source["objects"]] == ["a.jsonl", "b.jsonl"]
    assert source["index"]["digest"] == "sha256:" + hashlib.sha256(listed).hexdigest()
    assert source["index"]["size"] == len(listed)
    changes = source["deferred"]
    deferred = [(d["name"].removeprefix(base), d["change"], d["pinned"]) for d in changes]
    assert deferred == [("a.jsonl", "removed", True), ("c.jsonl", "added", False)]
