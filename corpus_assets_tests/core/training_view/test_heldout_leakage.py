"""A near-duplicate pair the dedup LSH misses never straddles two splits.

The pair (``selftest.leak_pair``) is found by searching generated variants against the
project's own signatures, band parameters and split hash: exact Jaccard just above the
threshold, no shared bucket in any of the dedup layer's bands, split hash in two splits. Planted
in the demo's essays and built through the real CLI, the held-out search must find it and put
both records in one split; the gate must refuse a members table where they straddle.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.publication import rules
from corpus_assets.core.publication.evidence import Evidence
from corpus_assets.core.publication.heldout_check import heldout_near_apart
from corpus_assets.core.publication.verify import load_manifest, resolve
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.config import NearDedupPolicy, SplitPolicy
from corpus_assets.core.runtime.layer_index import read_layer_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import Manifest
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.storage.cas import CasError
from corpus_assets.core.storage.cas_queries import VerifiedFiles, ordered_parts
from corpus_assets.core.training_view.splits import CODE as SPLITS_CODE
from corpus_assets.core.training_view.splits.heldout import INCREMENTAL, HeldoutScan, reuse
from corpus_assets.demo import CONFIG
from corpus_assets.selftest.leak_pair import LeakPair, find_leak_pair

CLI = str(Path(sys.executable).parent / "corpus-assets")
IDS = ("essays/leak-a", "essays/leak-b")


def _run(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    env.update(CORPUS_HOME=str(home / ".corpus"), DAGSTER_HOME=str(home / ".dagster"))
    return subprocess.run(
        [CLI, *args], cwd=home, env=env, capture_output=True, text=True, timeout=600
    )


def _outputs(home: Path, key: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The digests of the splits layer's tables (which do not name the partition)."""
    monkeypatch.setenv("CORPUS_HOME", str(home / ".corpus"))
    monkeypatch.setenv("CORPUS_CONFIG", str(home / ".corpus" / "corpus.yaml"))
    with open_workspace() as ws:
        _, index = read_layer_index(ws, key, "splits")
    names = ("splits", "split_moves", "split_conflicts", "heldout_pairs")
    return {name: index.output(name)["digest"] for name in names}


def _plant(home: Path) -> LeakPair:
    pair = find_leak_pair(SplitPolicy(salt="demo-v1"), NearDedupPolicy())
    essays = home / ".corpus" / "demo-sources" / "essays"
    essays.mkdir(parents=True)
    rows = [{"id": rid.split("/")[1], "text": t} for rid, t in zip(IDS, pair.texts, strict=True)]
    (essays / "essays-00009.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return pair


@pytest.fixture(scope="module")
def leak_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LeakPair, str, str]:
    """The demo built through the CLI with the missed pair planted among its essays (returns
    the home, the pair and the partition key); its snapshot validated."""
    home = tmp_path_factory.mktemp("leak")
    pair = _plant(home)
    demo = _run(home, "demo")
    assert demo.returncode == 0, demo.stderr
    assert "state VALIDATED" in demo.stdout
    key = next(x.split()[1] for x in demo.stdout.splitlines() if x.startswith("partition "))
    sid = next(x.split()[1] for x in demo.stdout.splitlines() if x.startswith("snapshotId "))
    return home, pair, key.rstrip(":"), sid


def test_the_planted_pair_is_missed_by_dedup_and_hashed_apart() -> None:
    pair = find_leak_pair(SplitPolicy(salt="demo-v1"), NearDedupPolicy())
    assert pair.splits[0] != pair.splits[1]
    assert 0.8 <= pair.jaccard < 0.85


def test_a_pair_dedup_missed_lands_in_one_split(
    leak_home: tuple[Path, LeakPair, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home, pair, key, _sid = leak_home
    monkeypatch.setenv("CORPUS_HOME", str(home / ".corpus"))
    monkeypatch.setenv("CORPUS_CONFIG", str(home / ".corpus" / "corpus.yaml"))
    with open_workspace() as ws:
        _, dedup = read_layer_index(ws, key, "dedup_clusters")
        clusters = PartedTable.read(ws.cas, dedup.output("clusters"), "c").table(
            VerifiedFiles(ws.cas), "c"
        )
        mine = clusters.filter(pc.is_in(clusters["record_id"], value_set=pa.array(IDS)))
        assert mine["verdict"].to_pylist() == ["keep", "keep"]  # dedup's LSH missed them
        _, splits = read_layer_index(ws, key, "splits")
        table = get_table(ws.cas, splits.output("splits"), "splits")
        where = dict(zip(table["record_id"].to_pylist(), table["split"].to_pylist(), strict=True))
        moves = get_table(ws.cas, splits.output("split_moves"), "moves").to_pylist()
    apart = [where[i] for i in IDS]
    assert where[IDS[0]] == where[IDS[1]], f"J={pair.jaccard:.4f} pair straddles: {apart}"
    moved = [m for m in moves if m["record_id"] in IDS]
    assert len(moved) == 1 and moved[0]["reason"] == "split.heldout_near", moves


def test_the_gate_refuses_a_near_pair_across_splits(
    leak_home: tuple[Path, LeakPair, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate searches the published members again: the built snapshot passes; the same
    members with the planted pair put back in two splits fail, naming both records."""
    home, pair, _key, sid = leak_home
    monkeypatch.setenv("CORPUS_HOME", str(home / ".corpus"))
    monkeypatch.setenv("CORPUS_CONFIG", str(home / ".corpus" / "corpus.yaml"))
    with open_workspace() as ws:
        gate = heldout_near_apart(ws)
        manifest = load_manifest(ws.cas, resolve(ws.catalog, sid))
        with Evidence.load(ws.cas, ws.catalog, manifest) as ev:
            clean = rules.RuleReport()
            assert gate(ev, clean) == [] and clean.heldout_near_pairs == 0
            _leak(ev, manifest)
            leaky = rules.RuleReport()
            found = gate(ev, leaky)
    assert leaky.heldout_near_pairs == 1
    assert len(found) == 1 and IDS[0] in found[0] and IDS[1] in found[0], found
    assert f"{pair.jaccard:.4f}" in found[0]


def test_two_workers_give_the_same_split_bytes(
    leak_home: tuple[Path, LeakPair, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Determinism: the planted demo built with two workers stores the same splits, moves and
    held-out pairs as with one."""
    home, _pair, key, _sid = leak_home
    _plant(tmp_path)
    execution = "execution: {workers: 2, in_process_bytes: 0}\n"
    (tmp_path / ".corpus" / "corpus.yaml").write_text(CONFIG + execution)
    demo = _run(tmp_path, "demo")
    assert demo.returncode == 0, demo.stderr
    other = next(x.split()[1] for x in demo.stdout.splitlines() if x.startswith("partition "))
    two = _outputs(tmp_path, other.rstrip(":"), monkeypatch)
    assert two == _outputs(home, key, monkeypatch)


def test_the_gate_takes_only_the_splits_layers_checked_jaccards(
    leak_home: tuple[Path, LeakPair, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate reuses the Jaccards the splits layer stored, never unchecked ones: with the
    planted pair's Jaccard lowered in the stored table (so it would look like no pair) the
    gate stops at the digest check instead of passing the leaky members."""
    home, pair, key, sid = leak_home
    monkeypatch.setenv("CORPUS_HOME", str(home / ".corpus"))
    monkeypatch.setenv("CORPUS_CONFIG", str(home / ".corpus" / "corpus.yaml"))
    with open_workspace() as ws:
        _, splits = read_layer_index(ws, key, "splits")
        _, dedup = read_layer_index(ws, key, "dedup_clusters")
        scan = HeldoutScan.open(ws, CanonicalIndex.read(ws, key)[1].chunks(), dedup)
        assert scan is not None
        known = reuse(ws, dedup, scan.spec, (splits, SPLITS_CODE, "splits layer"))
        assert known.mode == INCREMENTAL  # the gate's search takes the stored Jaccards
        path = ws.cas.path(splits.output("heldout_verified")["digest"])
        table = pq.read_table(path)
        planted = pc.is_in(table["jaccard"], value_set=pa.array([pair.jaccard]))
        assert pc.any(planted).as_py()
        lowered = pc.if_else(planted, 0.1, table["jaccard"])
        stored = path.read_bytes()
        path.chmod(0o644)
        try:
            pq.write_table(table.set_column(2, "jaccard", lowered), path)
            gate = heldout_near_apart(ws)
            manifest = load_manifest(ws.cas, resolve(ws.catalog, sid))
            with Evidence.load(ws.cas, ws.catalog, manifest) as ev:
                _leak(ev, manifest)
                with pytest.raises(CasError):
                    gate(ev, rules.RuleReport())
        finally:
            path.write_bytes(stored)


def _leak(ev: Evidence, manifest: Manifest) -> None:
    """The members view with the planted pair's second record put in another split."""
    split = ev.scalar("SELECT split FROM members WHERE record_id = ?", [IDS[1]])
    other = "test" if split != "test" else "validation"
    ev.con.execute(
        "CREATE OR REPLACE VIEW members AS SELECT * REPLACE (CASE WHEN record_id = "
        f"'{IDS[1]}' THEN '{other}' ELSE split END AS split) FROM "
        f"({ordered_parts(manifest.members.paths(ev.files), numbered=True)})"
    )
