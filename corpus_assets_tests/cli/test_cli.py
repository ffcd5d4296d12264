"""The ``corpus-assets`` command as a user runs it: real processes, data home, exit codes."""

import getpass
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from corpus_assets.cli.main import main
from corpus_assets.core.governance import alias_gate, states
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets_tests.cli_process import CLI, output_field, run


@pytest.mark.heavy  # the whole CLI journey: a dozen CLI processes, three builds
def test_demo_verify_rebuild_reuse_and_tamper(tmp_path: Path) -> None:
    demo = run(tmp_path, "demo", extra_env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert demo.returncode == 0, demo.stderr
    # -X importtime lists refused imports too: a package really imported loads its submodules
    imported = {line.rsplit("|", 1)[1].strip() for line in demo.stderr.splitlines() if "|" in line}
    assert "dagster._core" in imported
    assert not {m for m in imported if m.startswith(("pandas.", "boto3."))}  # absent_imports
    sid = output_field(demo.stdout, "snapshotId")
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", sid)
    assert re.search(r"^alias demo generation 1$", demo.stdout, re.MULTILINE)
    assert "dedup: 4 exact and 1 near duplicates removed from 289 records" in demo.stdout

    verified = run(tmp_path, "verify", sid)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith(f"OK {sid}: ")
    partition = _status_after_demo(tmp_path, sid)
    candidate = _rebuild_is_identical_and_reuses(tmp_path, sid, partition)

    shown = json.loads(run(tmp_path, "show", sid).stdout)
    assert shown["schema"] == "training.dataset.snapshot.v1" and shown["snapshotId"] == sid
    _dedup_is_explained(tmp_path, sid)
    _tampering_is_named(tmp_path, sid, shown["members"]["digest"])
    _tombstone_fences_the_candidate(tmp_path, sid, candidate)


def _status_after_demo(home: Path, sid: str) -> str:
    """The demo's snapshot is ACTIVE, approved by demo, at generation 1; returns its partition."""
    status = json.loads(run(home, "status", "--json").stdout)
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
    return snap["partition"]


def _rebuild_is_identical_and_reuses(home: Path, sid: str, partition: str) -> str:
    """Rebuilding the partition gives the same id; a new one reuses all but five objects.
    Returns the new partition's snapshotId."""
    rebuilt = run(home, "build", "--partition", partition)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert output_field(rebuilt.stdout, "snapshotId") == sid

    second = run(home, "build")
    assert second.returncode == 0, second.stderr
    reuse = re.search(r"CAS objects in this snapshot: (\d+), .*\(reused\): (\d+)", second.stdout)
    assert reuse, second.stdout
    total, reused = map(int, reuse.groups())
    # a new freeze spec and manifest, and - the demo's snapshot being active, so the parent -
    # new splits, mixed_samples and packed_blocks indexes (the splits index names its parent
    # and reads its splits layer); every table is reused
    assert total - reused == 5
    candidate = output_field(second.stdout, "snapshotId")
    assert candidate != sid
    return candidate


def _dedup_is_explained(home: Path, sid: str) -> None:
    """Why the demo's near copy was removed: the direct evidence, its cluster, its leakage group."""
    why = json.loads(run(home, "dedup", sid, "essays/e0020").stdout)
    assert why["record"]["verdict"] == "near_duplicate"
    assert why["record"]["match_id"] == why["record"]["representative_id"] == "essays/e0123"
    assert 0.8 <= why["record"]["match_jaccard"] < 1
    assert {r["record_id"] for r in why["cluster"]} == {"essays/e0020", "essays/e0123"}
    kept = [r for r in why["leakage_group"]["records"] if r["verdict"] == "keep"]
    assert [r["record_id"] for r in kept] == ["essays/e0123"] and kept[0]["split"]
    unknown = run(home, "dedup", sid, "essays/none")
    assert unknown.returncode == 1 and "'essays/none' is not in snapshot" in unknown.stderr


def _tampering_is_named(home: Path, sid: str, members: str) -> None:
    """One flipped byte of the members table fails verify naming it; restored, it verifies."""
    path = home / ".corpus" / "cas" / "sha256" / members[7:9] / members[9:11] / members[7:]
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    tampered = run(home, "verify", sid)
    assert tampered.returncode == 1
    assert f"CAS object at manifest.members {members} is corrupt" in tampered.stderr
    assert (
        tampered.stderr.strip().splitlines()[-1].startswith("corpus-assets: error: verify failed")
    )
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    assert run(home, "verify", sid).returncode == 0


def _tombstone_fences_the_candidate(home: Path, sid: str, candidate: str) -> None:
    """A tombstone fences the gate: the candidate built before it cannot activate, the record's
    lineage is answerable, and the next build excludes it."""
    assert run(home, "approve", candidate, "--by", "alice").returncode == 0
    added = run(home, "tombstone", "add", "--record", "essays/e0001", "--reason", "erase")
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("tombstone 1: record essays/e0001")
    hits = json.loads(run(home, "tombstone", "hits", "1").stdout)
    assert {s["snapshotId"] for s in hits["snapshots"]} == {sid, candidate}
    refused = run(home, "activate", candidate)
    assert refused.returncode == 1
    assert "gate is at tombstone 1" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    after = run(home, "build")
    assert after.returncode == 0, after.stderr
    shown = json.loads(run(home, "show", output_field(after.stdout, "snapshotId")).stdout)
    assert shown["tombstoneWatermark"] == "1"
    _lift_gives_the_record_back(home, sid, candidate)


def _lift_gives_the_record_back(home: Path, sid: str, candidate: str) -> None:
    """Lifting the tombstone fences every alias again; the next build holds the record (its
    deletion lineage lists it), a second lift of the same tombstone is refused in one line."""
    lifted = run(home, "tombstone", "lift", "1", "--reason", "request withdrawn")
    assert lifted.returncode == 0, lifted.stderr
    assert lifted.stdout.startswith("tombstone 2 lifts tombstone 1; every alias is fenced")
    again = run(home, "tombstone", "lift", "1", "--reason", "twice")
    assert again.returncode == 1
    assert again.stderr == (
        "corpus-assets: error: tombstone 1 was lifted already by 2; nothing lifted\n"
    )
    back = run(home, "build")
    assert back.returncode == 0, back.stderr
    rebuilt = output_field(back.stdout, "snapshotId")
    assert json.loads(run(home, "show", rebuilt).stdout)["tombstoneWatermark"] == "2"
    hits = json.loads(run(home, "tombstone", "hits", "1").stdout)
    assert (hits["lifted_by"], hits["actor"]) == (2, f"cli:{getpass.getuser()}")
    assert {s["snapshotId"] for s in hits["snapshots"]} == {sid, candidate, rebuilt}


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
        "policies:\n  packing: {block_tokens: 512, tail: sideways}\n"
    )
    bad_value = run(tmp_path, "build")
    assert bad_value.returncode == 1
    assert "policies.packing.tail: Input should be 'drop' or 'pad'" in bad_value.stderr
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


@pytest.mark.heavy  # the CLI demo again, on PostgreSQL: a duplicated full build
@pytest.mark.postgres
def test_demo_runs_on_postgresql_catalog(tmp_path: Path, postgres_url: str) -> None:
    demo = run(tmp_path, "demo", extra_env={"CORPUS_CATALOG_URL": postgres_url})
    assert demo.returncode == 0, demo.stderr
    sid = output_field(demo.stdout, "snapshotId")
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


# The approve and activate commands apply every validity rule (the one rule set of
# ``validate_snapshot``), not only the digests: these run the real entry point in-process.
def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().err


def test_a_snapshot_whose_canary_replay_differs_is_neither_approved_nor_activated(
    demo_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with open_workspace() as ws:
        sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
    config = demo_home / "corpus.yaml"
    original = config.read_text()
    # The same code and sources under a stricter quality policy: re-parsing the canary chunks
    # no longer gives the records the snapshot recorded.
    changed = original + "  quality: {min_chars: 200}\n"
    config.write_text(changed)
    code, err = _cli(capsys, "approve", sid, "--by", "alice")
    assert code == 1 and "canary replay of" in err, err
    with open_workspace() as ws:
        assert states.get(ws.catalog, sid).state == states.REJECTED

    config.write_text(original)
    with open_workspace() as ws:  # after the fix, a rebuild of the partition is a new attempt
        build_all(ws, "p1")
    assert _cli(capsys, "approve", sid, "--by", "alice")[0] == 0
    config.write_text(changed)
    code, err = _cli(capsys, "activate", sid)
    assert code == 1 and "canary replay of" in err, err
    with open_workspace() as ws:
        assert states.get(ws.catalog, sid).state == states.APPROVED
        assert alias_gate.read_alias_gate(ws.catalog, "demo").active_snapshot is None


def _cdc_event(lsn: int, key: int, body: str) -> str:
    event = {"op": "c", "before": None, "after": {"id": key, "body": body}, "source": {"lsn": lsn}}
    return json.dumps(event) + "\n"


def test_a_late_cdc_event_fails_verify_and_blocks_cli_approval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``verify`` applies the gate's boundary rule too: a late CDC event fails it,
    naming the source, the offset and the watermark; without a config it says it could not
    look. Approval refuses the snapshot and makes it INCOMPLETE."""
    log = tmp_path / "cdc" / "000.jsonl"
    log.parent.mkdir()
    log.write_text("".join(_cdc_event(n, n, f"ticket {n}") for n in (1, 2, 3)))
    config = tmp_path / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: cdc-test\nstorage: {{home: {tmp_path / 'home'}}}\n"
        "sources:\n  - {id: tickets, kind: changelog, path: cdc, key_field: id, "
        "text_field: body}\n"
    )
    monkeypatch.setenv("CORPUS_CONFIG", str(config))
    monkeypatch.delenv("CORPUS_CATALOG_URL", raising=False)
    with open_workspace() as ws:
        sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
    code, err = _cli(capsys, "verify", sid)
    assert code == 0, err
    # an event at or below the frozen watermark 3, appended after the freeze
    (log.parent / "001.jsonl").write_text(_cdc_event(2, 2, "second ticket, rewritten late"))
    code, err = _cli(capsys, "verify", sid)
    assert code == 1, err
    assert "FAIL source 'tickets': late CDC events at or below watermark 3: lsn 2 " in err, err
    with open_workspace() as ws:
        assert states.get(ws.catalog, sid).state == states.BUILDING  # verify moves no state

    monkeypatch.delenv("CORPUS_CONFIG")  # a bare data home: no change log to re-read
    monkeypatch.setenv("CORPUS_HOME", str(tmp_path / "home"))
    code, err = _cli(capsys, "verify", sid)
    assert code == 1 and "source 'tickets': late CDC events not checked" in err, err

    monkeypatch.setenv("CORPUS_CONFIG", str(config))
    code, err = _cli(capsys, "approve", sid, "--by", "alice")
    assert code == 1 and "late CDC events at or below watermark 3: lsn 2" in err, err
    with open_workspace() as ws:
        assert states.get(ws.catalog, sid).state == states.INCOMPLETE


def test_a_cdc_gap_build_names_the_incomplete_snapshot_and_the_missing_offsets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The raw_snapshot check warns about the gap too (no snapshotId in its metadata): the
    build's error is still the gate's verdict, not a KeyError (found by selftest 001.cdc-gap)."""
    log = tmp_path / "cdc"
    log.mkdir()
    (log / "000.jsonl").write_text(_cdc_event(1, 1, "first ticket") + _cdc_event(2, 2, "second"))
    (log / "001.jsonl").write_text(_cdc_event(5, 5, "fifth ticket"))  # lsn 3-4 missing
    config = tmp_path / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: cdc-test\nstorage: {{home: {tmp_path / 'home'}}}\n"
        "sources:\n  - {id: tickets, kind: changelog, path: cdc, key_field: id, "
        "text_field: body}\n"
    )
    monkeypatch.setenv("CORPUS_CONFIG", str(config))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    monkeypatch.delenv("CORPUS_CATALOG_URL", raising=False)
    code, err = _cli(capsys, "build", "--partition", "p1")
    assert code == 1, err
    assert "(partition p1) did not validate and is INCOMPLETE" in err, err
    assert "CDC offsets missing lsn 3-4 (watermark 5)" in err, err


@pytest.mark.heavy  # CLI processes, two full builds
def test_build_prints_each_benchmark_checked_and_what_it_excluded(tmp_path: Path) -> None:
    """After ``benchmark add``, the next ``build`` says per benchmark how its items were checked
    and how many records they excluded (the report in the build output)."""
    assert run(tmp_path, "demo").returncode == 0
    essays = tmp_path / ".corpus" / "demo-sources" / "essays" / "essays-00001.jsonl"
    leaked = json.loads(essays.read_text().splitlines()[0])["text"]  # a training record, whole
    items = tmp_path / "quiz.jsonl"
    items.write_text(
        json.dumps({"id": "q1", "text": leaked})
        + "\n"
        + json.dumps({"id": "q2", "text": "Capital of Peru?"})  # 3 tokens: too short to check
        + "\n"
    )
    assert run(tmp_path, "benchmark", "add", "quiz", str(items)).returncode == 0
    built = run(tmp_path, "build")
    assert built.returncode == 0, built.stderr
    assert (
        "contamination (contamination.v2) quiz: 2 items, 1 shorter than the n-gram "
        "(0 checked whole, 1 unchecked); 2 records excluded"  # e0120 and its exact copy
    ) in built.stdout, built.stdout
    assert "dedup: 3 exact and 1 near" in built.stdout  # the copy no longer counts as a duplicate


def _ignore_sigterm() -> None:
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)


@pytest.mark.heavy  # a full CLI demo in a process
def test_demo_completes_when_its_parent_ignores_sigterm(tmp_path: Path) -> None:
    """A parent that ignores SIGTERM (pytest-xdist's workers do; so can supervisors) passed that
    on to Dagster's compute-log ``tail`` helpers, which Dagster stops with SIGTERM and waits
    for: every step hung, and the demo never finished. The CLI takes SIGTERM's default again."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    env.update(CORPUS_HOME=str(tmp_path / ".corpus"), DAGSTER_HOME=str(tmp_path / ".dagster"))
    demo = subprocess.run(
        [CLI, "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard, not a timing assertion: the bug hung for good
        preexec_fn=_ignore_sigterm,
    )
    assert demo.returncode == 0, demo.stderr
    assert "alias demo generation 1" in demo.stdout


def _tails() -> list[int]:
    """This process's descendants that are ``tail`` (Dagster's compute-log helpers)."""
    from corpus_assets.cli.interrupt import _children

    found = []
    for pid in _children(os.getpid()):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "tail":
                found.append(pid)
        except OSError:
            continue  # gone while looking
    return found


def test_an_in_process_build_under_an_ignored_sigterm_leaves_no_tail(demo_home: Path) -> None:
    """In-process CLI tests run in a worker that may ignore SIGTERM (pytest-xdist's do on some
    machines): ``main`` gives SIGTERM its default while the command runs, so each step's
    compute-log ``tail`` stops when Dagster terminates it, and puts the caller's back."""
    import signal

    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        assert main(["build", "--partition", "p1"]) == 0
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # the caller's, put back
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert _tails() == []
