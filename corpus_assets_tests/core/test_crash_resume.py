"""A build killed with SIGKILL at random points (pinning, canonicalisation, MinHash signatures)
resumes and ends with the same digests."""

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import zstandard

BUILD = textwrap.dedent(
    """
    import json, sys
    from corpus_assets.core.pipeline import BUILDERS
    from corpus_assets.core.runtime.workspace import open_workspace
    with open_workspace(sys.argv[1]) as ws:
        raw = BUILDERS["raw_snapshot"](ws, "p1")
        canonical = BUILDERS["canonical_records"](ws, "p1")
        dedup = BUILDERS["dedup_clusters"](ws, "p1")
        print(json.dumps({
            "freeze": ws.catalog.freeze_digest("p1"),
            "raw": raw.digest,
            "canonical": canonical.digest,
            "dedup": dedup.digest,
            # finished work skipped: chunk by chunk, or the whole layer (the layer memo)
            "reused": sum(canonical.run_stats.get(k, 0) for k in ("chunks_reused", "layer_reused")),
            "signatures_reused": sum(
                dedup.run_stats.get(k, 0) for k in ("signatures_reused", "layer_reused")
            ),
        }))
    """
)


def _sources(root: Path, objects: int = 30) -> None:
    rng = random.Random(7)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()  # noqa: SIM905
    texts = [" ".join(rng.choices(words, k=80)) for _ in range(256)]
    for n in range(objects):
        lines = [
            json.dumps({"id": f"{n}-{i}", "text": f"{n} {i} " + texts[(n * 31 + i) % 256]})
            for i in range(800)
        ]
        data = ("\n".join(lines) + "\n").encode()
        (root / f"part-{n:03d}.jsonl.zst").write_bytes(zstandard.compress(data))


def _successes(catalog: Path) -> int:
    """Finished chunk tasks so far, read from the crashing build's own catalog."""
    if not catalog.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{catalog}?mode=ro", uri=True, timeout=5) as db:
            return db.execute(
                "SELECT count(*) FROM chunk_tasks WHERE status = 'SUCCESS'"
            ).fetchone()[0]
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0


def _home(base: Path, sources: Path) -> Path:
    base.mkdir()
    config = base / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: crash-test\nstorage: {{home: {base}}}\n"
        f"sources:\n  - {{id: parts, kind: objects, path: {sources}}}\n"
    )
    return config


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CORPUS_")}


def _finish(config: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", BUILD, str(config)], env=_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow  # the default run kills the real job instead: selftest 004.* (sweep, 95%)
def test_sigkilled_builds_resume_to_identical_digests(tmp_path: Path) -> None:
    sources = tmp_path / "sources"
    sources.mkdir()
    _sources(sources)

    reference = _finish(_home(tmp_path / "clean", sources))

    config = _home(tmp_path / "crashed", sources)
    catalog = tmp_path / "crashed" / "catalog.sqlite"
    total = 3 * 30  # one pin, one parse and one MinHash signature task per object
    rng = random.Random(2026)
    kills, points = 0, set()
    while kills < 40:  # until the build finishes on its own
        # kill at a random point of the remaining work: once 1-6 more chunk tasks have finished,
        # plus a random delay that usually lands inside the next one
        done = _successes(catalog)
        target = rng.randint(done + 1, max(done + 1, min(total - 2, done + 6)))
        process = subprocess.Popen(
            [sys.executable, "-c", BUILD, str(config)],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while process.poll() is None and _successes(catalog) < target:
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.05))
        if process.poll() is not None:
            break  # it finished: nothing left to interrupt
        points.add(_successes(catalog))
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills += 1
    assert kills >= 10, f"only {kills} runs could be killed before the build finished"
    assert len(points) >= 8, f"kills landed at too few distinct points: {sorted(points)}"
    phases = {min(p // 30, 2) for p in points}  # pinning, canonicalisation, signatures
    assert phases == {0, 1, 2}, f"kills missed a phase: {sorted(points)}"

    resumed = _finish(config)
    assert resumed["reused"] > 0  # finished chunks were skipped, not redone
    assert resumed["signatures_reused"] > 0
    assert {k: resumed[k] for k in ("freeze", "raw", "canonical", "dedup")} == {
        k: reference[k] for k in ("freeze", "raw", "canonical", "dedup")
    }
    leftovers = list((tmp_path / "crashed" / "cas" / "sha256").rglob(".tmp-*"))
    assert leftovers == []  # temp files live in cas/tmp, never beside published objects
