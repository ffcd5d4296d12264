"""A child snapshot reuses its parent's verified pairs.

Real builds on the demo home plus long essays: a parent is built and activated; the child's
sources drop one parent object (its records leave their clusters, some were representatives),
change one record's text (it joins another cluster) and add near copies of old essays, a
longer version of one (first in the total order, so the old one becomes its near duplicate)
and near copies of each other. The child's dedup layer must say it ran incrementally and reuse
pairs and text lengths, and publish the same bytes as a from-scratch build of the same final
sources in a fresh home, whatever the worker count.
"""

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from corpus_assets.core.dedup.fingerprint_store import SpilledFingerprints, TextLookup
from corpus_assets.core.dedup.jaccard import jaccard_sorted
from corpus_assets.core.dedup.near_dedup import LshParams, NearResult, RowMajor, near_dedup
from corpus_assets.core.dedup.signature_cache import signature_spec
from corpus_assets.core.pipeline import BUILDERS, DIRECT_BUILDERS, build_all
from corpus_assets.core.publication.publish import activate, approve
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import LayerResult, read_layer_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.cas import CasError
from corpus_assets.core.storage.cas_queries import VerifiedFiles

ESSAYS = Path("demo-sources") / "essays"
_OTHER_POLICY = "policies:\n  dedup: {near: {bucket_heads: 31}}\n"


def _vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(3000)]


def _edited(text: str, rng: random.Random, vocab: list[str], words: int = 1) -> str:
    split = text.split(" ")
    for _ in range(words):
        split[rng.randrange(len(split))] = rng.choice(vocab)
    return " ".join(split)


def _write(home: Path, name: str, rows: list[tuple[str, str]]) -> None:
    lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in rows)
    (home / ESSAYS / name).write_text(lines)


def _sources(home: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Parent-only objects written; the child's added object returned (not yet written)."""
    rng = random.Random(32)
    vocab = _vocabulary(rng)
    base = [" ".join(rng.choices(vocab, k=120)) for _ in range(12)]
    old = [(f"long{n:02d}", t) for n, t in enumerate(base)]
    old += [(f"long-copy{n:02d}", _edited(base[n], rng, vocab)) for n in range(4)]
    _write(home, "long-00000.jsonl", old)
    gone = [(f"gone{n:02d}", _edited(base[n], rng, vocab)) for n in (4, 5)]
    gone.append(("gone-rep", " ".join([*base[6].split(" "), "alpha", "beta"])))
    _write(home, "long-00001.jsonl", gone)  # removed from the child's sources
    fresh = [" ".join(rng.choices(vocab, k=120)) for _ in range(4)]
    new = [(f"new{n:02d}", _edited(base[n], rng, vocab)) for n in (0, 7, 8)]
    new.append(("new-longer", " ".join([*base[9].split(" "), "gamma", "delta", "eps"])))
    new += [(f"fresh{n:02d}", t) for n, t in enumerate(fresh)]
    new += [(f"fresh-copy{n:02d}", _edited(fresh[n], rng, vocab)) for n in range(2)]
    return old, new


def _dedup(ws: Workspace, key: str) -> LayerResult:
    for layer in ("raw_snapshot", "canonical_records"):
        BUILDERS[layer](ws, key)
    return BUILDERS["dedup_clusters"](ws, key)


def _outputs(ws: Workspace, key: str) -> dict[str, str]:
    _, index = read_layer_index(ws, key, "dedup_clusters")
    out = {k: index.output(k)["digest"] for k in ("clusters", "edges", "report", "pairs")}
    return out | {f"bands {b['class']}": b["index"]["digest"] for b in index.output("bands")}


def _open(home: Path, monkeypatch: pytest.MonkeyPatch, workers: int = 1) -> Workspace:
    config = home / "corpus.yaml"
    text = config.read_text().split("execution:")[0]
    config.write_text(text + f"execution: {{workers: {workers}, in_process_bytes: 0}}\n")
    monkeypatch.setenv("CORPUS_HOME", str(home))
    monkeypatch.setenv("CORPUS_CONFIG", str(config))
    return open_workspace()


def _active_parent(ws: Workspace) -> dict[str, LayerResult]:
    """p1 built, approved and activated: the parent of the next build."""
    first = build_all(ws, "p1")
    sid = first["manifest"].digests["snapshotId"]
    approve(ws, sid, by="reviewer")
    activate(ws, sid, actor="test")
    return first


def test_child_dedup_is_incremental_and_equals_a_fresh_build(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = _sources(demo_home)
    ws = _open(demo_home, monkeypatch)
    first = _active_parent(ws)
    assert first["dedup_clusters"].run_stats["near_incremental"] == 0
    (demo_home / ESSAYS / "long-00001.jsonl").unlink()
    changed = dict(old)  # a changed record: long-copy03 now copies long10 (and long03 loses it)
    changed["long-copy03"] = changed["long10"] + " zeta"
    _write(demo_home, "long-00000.jsonl", list(changed.items()))
    _write(demo_home, "long-00002.jsonl", new)
    child = _dedup(ws, "p2")
    ws.close()
    stats = child.run_stats
    assert stats["near_incremental"] == 1, child.details["near_mode"]
    assert stats["pairs_reused"] > 0
    # every chunk but the removed and changed objects': their texts are not read for lengths
    assert stats["lengths_reused"] == first["canonical_records"].counts["chunks"] - 2
    assert stats["pairs_computed"] < stats["pairs_verified"]
    # banded from the parent's band index: keys computed for the class records it lacks only
    assert stats["band_classes_incremental"] >= 1
    full_keys = first["dedup_clusters"].run_stats["band_keys_computed"]
    assert 0 < stats["band_keys_computed"] < full_keys / 2
    # rows whose decisions did not change come from the parent's clusters table, not a join
    assert child.details["clusters_mode"]["mode"] == "incremental", child.details
    assert 0 < stats["clusters_joined"] < stats["clusters_copied"]
    assert stats["clusters_copied"] + stats["clusters_joined"] == child.counts["records"]
    assert stats["clusters_parts_kept"] >= 1  # a kept part: the parent's, not written again
    assert stats["codes_carried"] == 1  # record codes from the parent's tables, no sorts
    assert child.counts["near_duplicates"] >= 8
    chain = _outputs(_open(demo_home, monkeypatch), "p2")
    fresh_home = tmp_path / "fresh"
    shutil.copytree(demo_home / "demo-sources", fresh_home / "demo-sources")
    shutil.copy(demo_home / "corpus.yaml", fresh_home / "corpus.yaml")
    fresh = _open(fresh_home, monkeypatch)
    scratch = _dedup(fresh, "p2")
    assert scratch.run_stats["near_incremental"] == 0
    assert "clusters_copied" not in scratch.run_stats
    assert "codes_carried" not in scratch.run_stats
    assert scratch.run_stats["band_classes_incremental"] == 0
    assert _outputs(fresh, "p2") == chain  # same verdicts, clusters, edges, report, pairs, bands
    ref = read_layer_index(fresh, "p2", "dedup_clusters")[1].output("clusters")
    table = PartedTable.read(fresh.cas, ref, "c").table(VerifiedFiles(fresh.cas), "c")
    rows = {r["record_id"]: r for r in table.to_pylist()}
    assert rows["essays/long09"]["verdict"] == "near_duplicate"  # its longer copy came first
    assert not any(r.startswith("essays/gone") for r in rows)
    assert rows["essays/long10"]["match_id"] == "essays/long-copy03"  # changed, longer: first
    fresh.close()
    again = _open(demo_home, monkeypatch, workers=2)
    rerun = DIRECT_BUILDERS["dedup_clusters"](again, "p2")  # not the layer memo: a real run
    assert rerun.run_stats["near_incremental"] == 1
    assert _outputs(again, "p2") == chain
    again.close()
    config = demo_home / "corpus.yaml"  # another dedup policy: the parent's pairs are not used
    config.write_text(config.read_text().replace("policies:\n", _OTHER_POLICY))
    other = _open(demo_home, monkeypatch)
    full = DIRECT_BUILDERS["dedup_clusters"](other, "p2")
    assert full.run_stats["near_incremental"] == 0
    assert "policy" in full.details["near_mode"]["reason"]
    assert "clusters_copied" not in full.run_stats
    assert "policy" in full.details["clusters_mode"]["reason"]
    other.close()


# --- the scan with known pairs ------------------------------------------------------------------


def _families(rng: np.random.Generator, n: int, params: LshParams) -> tuple[np.ndarray, list]:
    """Signatures where records of a family share random bands, and fingerprint sets whose
    Jaccards spread around the threshold."""
    sigs = rng.integers(0, 2**32, size=(n, params.bands * params.rows), dtype=np.uint32)
    sets = []
    for r in range(n):
        head = r - r % 5
        for band in range(params.bands):
            if r != head and rng.random() < 0.5:
                cols = slice(band * params.rows, (band + 1) * params.rows)
                sigs[r, cols] = sigs[head, cols]
        base = np.arange(head * 1000, head * 1000 + 100, dtype=np.uint64)
        edits = rng.integers(0, 100, size=int(rng.integers(0, 25)))
        changed = base.copy()
        changed[edits] += np.uint64(500)
        sets.append(np.unique(changed))
    return sigs, sets


def _run(order: np.ndarray, sigs, sets, params, known=None, fetched=None, fresh=None) -> NearResult:
    def fetch(ranks: np.ndarray) -> list[np.ndarray]:
        if fetched is not None:
            fetched.update(order[ranks].tolist())
        return [sets[order[r]] for r in ranks]

    blocks = [RowMajor(sigs)]
    return near_dedup(blocks, order, params, fetch, jaccard_sorted, known=known, fresh=fresh)


def _parent_cache(sigs, sets, params, parent_order: np.ndarray) -> dict:
    """(record, record) -> Jaccard of every pair the parent's scan verified."""
    parent = _run(parent_order, sigs, sets, params)
    done = ~np.isnan(parent.verified)
    ids = parent_order[parent.pair_x[done]], parent_order[parent.pair_y[done]]
    pairs = zip(*(i.tolist() for i in ids), parent.verified[done].tolist(), strict=True)
    return {(min(a, b), max(a, b)): j for a, b, j in pairs}


def _lookup(cache: dict, order: np.ndarray):
    def known(packed: np.ndarray) -> np.ndarray:
        x, y = np.divmod(packed, len(order))
        a, b = np.minimum(order[x], order[y]).tolist(), np.maximum(order[x], order[y]).tolist()
        return np.array([cache.get(k, np.nan) for k in zip(a, b, strict=True)], dtype=float)

    return known


@pytest.mark.parametrize("seed", range(6))
def test_known_pairs_from_a_parent_order_change_no_verdict(seed: int) -> None:
    rng = np.random.default_rng(seed)
    params = LshParams(bands=8, rows=2, threshold=0.8, bucket_heads=3)  # a cap that bites
    sigs, sets = _families(rng, 120, params)
    cache = _parent_cache(sigs, sets, params, rng.permutation(100))  # records 100.. are new
    order = rng.permutation(np.r_[np.arange(10, 120)])  # 0..9 removed, new ones interleaved
    known = _lookup(cache, order)
    fetched: set[int] = set()
    full, incremental = (
        _run(order, sigs, sets, params),
        _run(order, sigs, sets, params, known, fetched),
    )
    assert incremental.kept.tolist() == full.kept.tolist()
    assert incremental.match.tolist() == full.match.tolist()
    assert incremental.edges == full.edges
    np.testing.assert_array_equal(incremental.verified, full.verified)
    assert incremental.verified_pairs == full.verified_pairs
    assert incremental.computed_pairs < full.computed_pairs == full.verified_pairs
    assert incremental.fingerprinted == full.fingerprinted
    assert 0 < incremental.fingerprinted_now == len(fetched) < full.fingerprinted_now


@pytest.mark.parametrize("seed", range(6))
def test_a_child_fetches_only_records_of_fresh_or_verified_pairs(seed: int) -> None:
    """Old pairs the parent never verified are mostly skipped again: their records are not
    fingerprinted up front, only when the scan does verify such a pair."""
    rng = np.random.default_rng(seed)
    params = LshParams(bands=8, rows=2, threshold=0.8, bucket_heads=3)
    sigs, sets = _families(rng, 120, params)
    cache = _parent_cache(sigs, sets, params, rng.permutation(100))
    order = rng.permutation(np.r_[np.arange(10, 120)])  # 0..9 removed, 100.. new
    known, fresh = _lookup(cache, order), order >= 100
    fetched: set[int] = set()
    full = _run(order, sigs, sets, params)
    child = _run(order, sigs, sets, params, known, fetched, fresh)
    assert (child.kept.tolist(), child.match.tolist()) == (full.kept.tolist(), full.match.tolist())
    assert child.edges == full.edges
    np.testing.assert_array_equal(child.verified, full.verified)
    x, y = child.pair_x, child.pair_y
    unknown = np.isnan(known(x * len(order) + y))
    computed = unknown & ~np.isnan(child.verified)
    allowed = computed | (unknown & (fresh[x] | fresh[y]))
    assert fetched <= set(order[x[allowed]].tolist()) | set(order[y[allowed]].tolist())
    assert len(fetched) < len(set(order[x[unknown]].tolist()) | set(order[y[unknown]].tolist()))
    assert child.fingerprinted_now == len(fetched)


@pytest.mark.parametrize("built_demo", ["sqlite"], indirect=True)
def test_spilled_fingerprints_compute_a_record_not_prefetched(built_workspace: Workspace) -> None:
    """The scan of a child may verify an old pair it did not schedule: that record's
    fingerprints are computed from its text then, equal to a prefetched copy's."""
    ws = built_workspace
    _, canonical = CanonicalIndex.read(ws, "p1")
    chunks = canonical.chunks()
    spec = signature_spec(ws.config.policies.dedup.near)
    order = np.arange(sum(c.count for c in chunks), dtype=np.int64)[::-1].copy()
    texts = TextLookup(ws, chunks)
    every = SpilledFingerprints(texts, spec, order, ws.home / "tmp")
    every.prefetch(np.arange(len(order)))
    some = SpilledFingerprints(texts, spec, order, ws.home / "tmp")
    some.prefetch(np.arange(0, len(order), 3))
    ranks = np.arange(len(order))
    for got, want in zip(some(ranks), every(ranks), strict=True):
        np.testing.assert_array_equal(got, want)
    assert len(some.rows) < len(order)
    every.close()
    some.close()


def test_child_joins_every_row_when_the_parents_decisions_are_gone(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's decisions collected from the store: the child joins the whole table (and
    says why), publishing what a child that copied rows publishes."""
    _, new = _sources(demo_home)
    ws = _open(demo_home, monkeypatch)
    _active_parent(ws)
    _write(demo_home, "long-00002.jsonl", new)
    copied = _dedup(ws, "p2")
    assert copied.run_stats["clusters_copied"] > 0, copied.details["clusters_mode"]
    chain = _outputs(ws, "p2")
    decisions = read_layer_index(ws, "p1", "dedup_clusters")[1].output("decisions")
    ws.cas.path(decisions["digest"]).unlink()
    joined = DIRECT_BUILDERS["dedup_clusters"](ws, "p2")
    assert "clusters_copied" not in joined.run_stats
    assert "gone" in joined.details["clusters_mode"]["reason"]
    assert _outputs(ws, "p2") == chain
    ws.close()


def test_a_childs_old_chunk_changed_on_disk_is_named(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child reads an old chunk's lengths from its parent, so only the records join verifies
    that chunk: trusted while its file is unchanged since it last hashed right, hashed again
    (and named) once bytes changed in place."""
    _, new = _sources(demo_home)
    ws = _open(demo_home, monkeypatch)
    sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
    approve(ws, sid, by="reviewer")
    activate(ws, sid, actor="test")
    _write(demo_home, "long-00002.jsonl", new)
    assert _dedup(ws, "p2").run_stats["lengths_reused"] > 0
    _, canonical = CanonicalIndex.read(ws, "p1")
    chunk = canonical.chunks()[0]
    path = ws.cas.path(chunk.records["digest"])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size, new bytes
    path.write_bytes(bytes(data))
    with pytest.raises(CasError, match=chunk.records["digest"]):
        DIRECT_BUILDERS["dedup_clusters"](ws, "p2")
    ws.close()
