"""The ``corpus-assets`` command as a user runs it: real processes, data home, exit codes."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

CLI = str(Path(sys.executable).parent / "corpus-assets")


def run(
    home: Path, *args: str, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    env.update(CORPUS_HOME=str(home / ".corpus"), DAGSTER_HOME=str(home / ".dagster"))
    env.update(extra_env or {})
    return subprocess.run(
        [CLI, *args], cwd=home, env=env, capture_output=True, text=True, timeout=300
    )


def _field(output: str, name: str) -> str:
    match = re.search(rf"^{name} (\S+)", output, re.MULTILINE)
    assert match, f"no {name!r} line in:\n{output}"
    return match.group(1)


def test_demo_verify_rebuild_reuse_and_tamper(tmp_path: Path) -> None:
    demo = run(tmp_path, "demo")
    assert demo.returncode == 0, demo.stderr
    sid = _field(demo.stdout, "snapshotId")
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", sid)
    assert re.search(r"^alias demo generation 1$", demo.stdout, re.MULTILINE)
    assert "dedup: 4 exact and 1 near duplicates removed from 289 records" in demo.stdout

    verified = run(tmp_path, "verify", sid)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith(f"OK {sid}: ")

    status = json.loads(run(tmp_path, "status", "--json").stdout)
    (snap,) = status["snapshots"]
    assert (snap["state"], snap["current"], snap["approvedBy"]) == ("ACTIVE", True, "demo")
    assert status["aliases"] == [
        {
            "alias": "demo",
            "generation": 1,
            "active": sid,
            "tombstoneWatermark": "0",
            "benchmarkFence": "0",
        }
    ]

    rebuilt = run(tmp_path, "build", "--partition", snap["partition"])
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert _field(rebuilt.stdout, "snapshotId") == sid

    second = run(tmp_path, "build")
    assert second.returncode == 0, second.stderr
    reuse = re.search(r"CAS objects in this snapshot: (\d+), .*\(reused\): (\d+)", second.stdout)
    assert reuse, second.stdout
    total, reused = map(int, reuse.groups())
    assert total - reused == 2  # a new freeze spec and a new manifest; everything else reused
    assert _field(second.stdout, "snapshotId") != sid

    shown = json.loads(run(tmp_path, "show", sid).stdout)
    assert shown["schema"] == "training.dataset.snapshot.v1" and shown["snapshotId"] == sid

    # why the demo's near copy was removed: the direct evidence, its cluster, its leakage group
    why = json.loads(run(tmp_path, "dedup", sid, "essays/e0020").stdout)
    assert why["record"]["verdict"] == "near_duplicate"
    assert why["record"]["match_id"] == why["record"]["representative_id"] == "essays/e0123"
    assert 0.8 <= why["record"]["match_jaccard"] < 1
    assert {r["record_id"] for r in why["cluster"]} == {"essays/e0020", "essays/e0123"}
    kept = [r for r in why["leakage_group"]["records"] if r["verdict"] == "keep"]
    assert [r["record_id"] for r in kept] == ["essays/e0123"] and kept[0]["split"]
    unknown = run(tmp_path, "dedup", sid, "essays/none")
    assert unknown.returncode == 1 and "'essays/none' is not in snapshot" in unknown.stderr

    members = shown["members"]["digest"]
    path = tmp_path / ".corpus" / "cas" / "sha256" / members[7:9] / members[9:11] / members[7:]
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    tampered = run(tmp_path, "verify", sid)
    assert tampered.returncode == 1
    assert f"CAS object at manifest.members {members} is corrupt" in tampered.stderr
    assert (
        tampered.stderr.strip().splitlines()[-1].startswith("corpus-assets: error: verify failed")
    )
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    assert run(tmp_path, "verify", sid).returncode == 0

    # a tombstone fences the gate: the candidate built before it cannot activate, the record's
    # lineage is answerable, and the next build excludes it
    candidate = _field(second.stdout, "snapshotId")
    assert run(tmp_path, "approve", candidate, "--by", "alice").returncode == 0
    added = run(tmp_path, "tombstone", "add", "--record", "essays/e0001", "--reason", "erase")
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("tombstone 1: record essays/e0001")
    hits = json.loads(run(tmp_path, "tombstone", "hits", "1").stdout)
    assert {s["snapshotId"] for s in hits["snapshots"]} == {sid, candidate}
    refused = run(tmp_path, "activate", candidate)
    assert refused.returncode == 1
    assert "gate is at tombstone 1" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    after = run(tmp_path, "build")
    assert after.returncode == 0, after.stderr
    shown = json.loads(run(tmp_path, "show", _field(after.stdout, "snapshotId")).stdout)
    assert shown["tombstoneWatermark"] == "1"


def test_errors_are_one_clear_line(tmp_path: Path) -> None:
    unknown = run(tmp_path, "verify", "sha256:" + "0" * 64)
    assert unknown.returncode == 1
    assert unknown.stderr == (
        f"corpus-assets: error: no snapshot with id or manifest digest sha256:{'0' * 64} "
        "in the catalog\n"
    )

    (tmp_path / ".corpus").mkdir(exist_ok=True)
    (tmp_path / ".corpus" / "corpus.yaml").write_text(
        "version: 1\npurpose: p\nsources:\n  - {id: a, kind: objects, path: src}\n"
        "policies:\n  packing: {block_tokens: 512, tail: drop}\n"
    )
    bad_value = run(tmp_path, "build")
    assert bad_value.returncode == 1
    assert "policies.packing.tail: Input should be 'pad'" in bad_value.stderr
    assert len(bad_value.stderr.strip().splitlines()) == 1

    (tmp_path / ".corpus" / "corpus.yaml").write_text(
        "version: 1\npurpose: p\nsources:\n  - {id: a, kind: objects, path: src, colour: red}\n"
    )
    bad_key = run(tmp_path, "build")
    assert bad_key.returncode == 1
    assert "sources[0].colour: Extra inputs are not permitted" in bad_key.stderr

    (tmp_path / ".corpus" / "src").mkdir()
    (tmp_path / ".corpus" / "corpus.yaml").write_text(
        "version: 1\npurpose: p\nsources:\n  - {id: a, kind: objects, path: src}\n"
    )
    bad_partition = run(tmp_path, "build", "--partition", "Not/A/Key")
    assert bad_partition.returncode == 1
    assert "partition key 'Not/A/Key' is invalid" in bad_partition.stderr


@pytest.mark.postgres
def test_demo_runs_on_postgresql_catalog(tmp_path: Path, postgres_url: str) -> None:
    demo = run(tmp_path, "demo", extra_env={"CORPUS_CATALOG_URL": postgres_url})
    assert demo.returncode == 0, demo.stderr
    sid = _field(demo.stdout, "snapshotId")
    assert not (tmp_path / ".corpus" / "catalog.sqlite").exists()
    verified = run(tmp_path, "verify", sid, extra_env={"CORPUS_CATALOG_URL": postgres_url})
    assert verified.returncode == 0, verified.stderr
    status = json.loads(
        run(tmp_path, "status", "--json", extra_env={"CORPUS_CATALOG_URL": postgres_url}).stdout
    )
    assert status["catalog"].startswith(
        "postgresql+psycopg2://postgres@127.0.0.1:5432/corpus_test_"
    )
    assert status["aliases"][0]["generation"] == 1
