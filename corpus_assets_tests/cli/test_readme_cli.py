"""Every command of the README's CLI table, run as a user runs it, in one snapshot lifecycle.

The table in README.md is the contract: a documented command that no step here runs fails
``test_every_documented_command_is_exercised``, so the examples cannot drift from the code.
"""

import hashlib
import json
import re
from pathlib import Path

import pytest

from corpus_assets_tests.cli_process import output_field, run
from corpus_assets_tests.paths import REPO


def documented_commands() -> set[str]:
    """First word after ``corpus-assets`` in each row of the README's CLI table."""
    table = REPO.joinpath("README.md").read_text().split("## The CLI", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `corpus-assets ([a-z]+)", table, re.MULTILINE))


class Session:
    """Runs CLI commands in one data home and remembers which commands it ran."""

    def __init__(self, home: Path) -> None:
        self.home, self.ran = home, set()

    def __call__(self, *args: str, ok: bool = True) -> str:
        self.ran.add(args[0])
        done = run(self.home, *args)
        assert (done.returncode == 0) == ok, (args, done.stdout, done.stderr)
        return done.stdout if ok else done.stderr

    def json(self, *args: str) -> dict:
        return json.loads(self(*args))

    def json_lines(self, *args: str) -> list[dict]:
        return [json.loads(line) for line in self(*args).splitlines()]


@pytest.mark.heavy  # every README command as a process
def test_every_documented_command_is_exercised(tmp_path: Path) -> None:
    cli = Session(tmp_path)
    first = output_field(cli("demo"), "snapshotId")
    second = output_field(cli("build"), "snapshotId")
    assert cli("verify", second).startswith(f"OK {second}: ")
    trust = cli.json("trust", "list", "--json")  # the demo's key, created and pinned on first use
    assert trust["home_key_trusted"] and trust["alias_keys"] == {"demo": [trust["home_key"]]}
    assert cli.json("show", second)["snapshotId"] == second
    assert cli("approve", second, "--by", "alice") == f"{second} APPROVED by alice\n"

    diff = cli.json("diff", second)  # against what the alias serves now
    assert (diff["candidate"], diff["active"]) == (second, first)
    assert (diff["added"], diff["removed"], diff["split_migrations"]) == (0, 0, 0)

    assert cli("activate", second) == f"alias demo -> {second} generation 2\n"
    lineage = cli.json("lineage", second, "--format", "json")
    assert {n["id"] for n in lineage["nodes"]} >= {"freeze", "manifest", "generation:demo/2"}
    page = cli("card", second, "--out", str(tmp_path / "card"))
    assert (
        page == f"{tmp_path / 'card' / 'index.html'}\n" and second in Path(page.strip()).read_text()
    )
    prov = cli.json("prov", second)
    assert second in prov["entity"] and "latest" not in json.dumps(prov)
    (activity,) = prov["activity"].values()
    assert activity["corpus:transformImage"].startswith("corpus-assets/")

    read = cli.json("read", second, "--run-id", "run-1", "--purpose", "demo-pretraining")
    assert (read["snapshotId"], read["runId"], read["resumed"]) == (second, "run-1", False)
    assert read["blocks"] > 0 and all(e["digest"].startswith("sha256:") for e in read["read"])
    again = cli.json("read", second, "--run-id", "run-1", "--purpose", "demo-pretraining")
    assert again["resumed"] is True and again["read"] == read["read"]
    for fmt in ("megatron", "mds"):
        out = tmp_path / f"export-{fmt}"
        args = (second, "--run-id", f"export-{fmt}", "--purpose", "demo-pretraining")
        exported = cli.json("export", fmt, *args, "--out", str(out))
        files = exported["files"] if fmt == "megatron" else [exported["index"], *exported["shards"]]
        for entry in files:  # each file written is the one its digest names
            data = (out / entry["basename"]).read_bytes()
            assert "sha256:" + hashlib.sha256(data).hexdigest() == entry["digest"]
        assert exported["export"].startswith("sha256:") and exported["run"]["runId"] == args[2]
    other_digest = cli(
        "read", first, "--run-id", "run-1", "--purpose", "demo-pretraining", ok=False
    )
    assert "run-1" in other_digest and len(other_digest.strip().splitlines()) == 1

    assert cli("rollback", first) == f"alias demo -> {first} generation 3 (rollback)\n"
    why = cli.json("dedup", first, "essays/e0020")
    assert why["record"]["verdict"] == "near_duplicate"

    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"id": "q1", "text": "What is the capital of France?"}) + "\n")
    assert (
        cli("benchmark", "quiz", str(bench)) == "benchmark quiz: 1 items; benchmark fence now 1\n"
    )
    refused = cli("rollback", second, ok=False)  # built before the fence: never resurrected
    assert "benchmark fence" in refused
    again = cli("benchmark", "add", "quiz", str(bench))
    assert again == "benchmark quiz: 0 items (1 already registered); benchmark fence now 1\n"
    (listed,) = cli.json("benchmark", "list")["benchmarks"]
    assert (listed["benchmark"], listed["items"], listed["lastSeq"]) == ("quiz", 1, 1)
    removed = cli("benchmark", "remove", "quiz", "--item", "q1")
    assert removed.startswith("benchmark quiz: 1 items removed;") and removed.endswith(" 2\n")
    excluded = cli.json_lines("excluded", first)
    assert excluded and all(row["line"] >= 1 and row["reason"] for row in excluded)
    essays = cli.json_lines("excluded", first, "--source", "essays")
    assert essays and {row["source"] for row in essays} == {"essays"}

    seq = cli("tombstone", "add", "--record", "essays/e0001", "--reason", "erase")
    assert seq.startswith("tombstone 1: record essays/e0001")
    hits = cli.json("tombstone", "hits", "1")
    assert {s["snapshotId"] for s in hits["snapshots"]} == {first, second}
    status = cli.json("status", "--json")
    swept = cli.json("gc", "--dry-run", "--json")  # no retention set: every snapshot is kept
    assert swept["dropped_snapshots"] == [] and swept["dry_run"] is True
    scrubbed = cli.json("scrub", "--json")  # both were active once: both can be served
    assert scrubbed["ok"] and {s["snapshot_id"] for s in scrubbed["snapshots"]} == {first, second}
    assert [a["generation"] for a in status["aliases"]] == [3]
    check_history(cli, first, second)

    partition = next(s["partition"] for s in status["snapshots"] if s["snapshotId"] == first)
    trained = cli("tokenizer", "train", "--partition", partition, "--vocab-size", "300")
    digest = output_field(trained, "tokenizer")
    assert f"trained on {status_train(cli, first)} train records" in trained
    assert "    kind: huggingface\n" in trained and f"    digest: {digest}\n" in trained

    partitions = [s["partition"] for s in status["snapshots"]]
    listed = [line.split()[:3] for line in cli("partition", "list").splitlines()]
    assert listed == [[p, "dagster", "frozen"] for p in partitions]
    assert "pass --force" in cli("partition", "delete", partitions[1], ok=False)
    deleted = cli("partition", "delete", partitions[1], "--force")
    assert deleted == f"deleted partition {partitions[1]!r} from the Dagster instance\n"
    assert cli("partition", "list").splitlines()[1].split()[:2] == [partitions[1], "catalog-only"]

    assert documented_commands() == cli.ran


def status_train(cli: Session, snapshot: str) -> int:
    """The train split's size in a snapshot's manifest."""
    return cli.json("show", snapshot)["counts"]["train"]


def check_history(cli: Session, first: str, second: str) -> None:
    """The alias's audit trail after the lifecycle: who approved, activated and rolled back, at
    which generation and fences, and the rollback the benchmark fence refused."""
    moves = cli.json("history", "demo", "--json")["moves"]
    gated = [
        (m["snapshot_id"], m["from_state"], m["to_state"], m["generation"], m["benchmark_fence"])
        for m in moves
        if m["from_state"] in ("VALIDATED", "APPROVED", "ACTIVE")
    ]
    A, AP, V = "ACTIVE", "APPROVED", "VALIDATED"
    assert gated == [
        (first, V, AP, 0, 0),
        (first, AP, A, 1, 0),
        (second, V, AP, 1, 0),
        (second, AP, A, 2, 0),
        (first, A, A, 3, 0),  # the rollback
        (second, A, A, 3, 0),  # the rollback refused: built before benchmark fence 1
    ]
    actors = [m["actor"] for m in moves if m["from_state"] in (V, AP, A)]
    assert actors[0] == "demo" and actors[2] == "alice" and actors[1].startswith("run:")
    assert actors[4] == actors[5] and actors[4].startswith("cli:")
    assert "the gate is at 1" in moves[-1]["detail"]
    table = cli("history", "demo").splitlines()
    assert table[0].split()[:3] == ["when", "(UTC)", "snapshot"] and len(table) == len(moves) + 1
    assert "alice" in table[1 + [m["actor"] for m in moves].index("alice")]
    assert "no snapshot" in cli("history", "nobody")
