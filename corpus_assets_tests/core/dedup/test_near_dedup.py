"""Near-dedup: the deletion scan over verified LSH candidates, leakage groups, labelled recall."""

import json
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from corpus_assets.core.dedup.in_memory import cluster
from corpus_assets.core.dedup.jaccard import jaccard_sorted
from corpus_assets.core.dedup.minhash import (
    fingerprints,
    signatures,
    signatures_and_modes,
    stores_modes,
)
from corpus_assets.core.dedup.near_dedup import (
    LshParams,
    RowMajor,
    candidate_pairs,
    near_dedup,
    s_curve,
)
from corpus_assets.core.dedup.near_stage import NearStage
from corpus_assets.core.dedup.report import NearReport
from corpus_assets.core.dedup.signature_cache import signature_spec
from corpus_assets.core.dedup.verdicts import EXACT, KEEP, NEAR
from corpus_assets.core.governance.deletion_reach import hits
from corpus_assets.core.pipeline import BUILDERS, DIRECT_BUILDERS
from corpus_assets.core.publication.leakage_check import dedup_invariants
from corpus_assets.core.records.index import RECORD_COLUMNS, CanonicalIndex
from corpus_assets.core.records.normalize import dedup_key
from corpus_assets.core.runtime.config import NearDedupPolicy
from corpus_assets.core.runtime.layer_index import LayerResult
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.cas import CasError
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets_tests.cas_hashing import hashed_digests
from corpus_assets_tests.conftest import BuiltDemo, use_demo_copy
from corpus_assets_tests.paths import CORPORA


def _sets_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


def _chapter_sets() -> list[np.ndarray]:
    """A = {1, 2}, B = {1, 2, 3}, C = {2, 3}: J(A,B) = J(B,C) = 2/3, J(A,C) = 1/3."""
    return [np.array(s, dtype=np.uint64) for s in ([1, 2], [1, 2, 3], [2, 3])]


def _all_collide(n: int, params: LshParams) -> list[RowMajor]:
    return [RowMajor(np.zeros((n, params.bands * params.rows), dtype=np.uint32))]


def test_chapter_example_keeps_a_and_c_and_links_all_three_for_leakage() -> None:
    sets, params = _chapter_sets(), LshParams(bands=4, rows=4, threshold=2 / 3)
    result = near_dedup(
        _all_collide(3, params),
        np.arange(3),
        params,
        lambda ranks: [sets[r] for r in ranks],
        _sets_jaccard,
    )
    assert result.kept.tolist() == [True, False, True]
    assert result.match.tolist() == [-1, 0, -1]
    assert result.match_jaccard[1] == pytest.approx(2 / 3)
    # C was compared with B (dropped) too: the edge B-C joins A and C in one leakage group.
    assert sorted((x, y) for x, y, _ in result.edges) == [(1, 0), (2, 1)]


def test_order_decides_who_stays_not_input_position() -> None:
    sets, params = _chapter_sets(), LshParams(bands=4, rows=4, threshold=2 / 3)
    # B first in the total order: both A and C reach tau with B directly and are dropped.
    order = np.array([1, 0, 2])
    result = near_dedup(
        _all_collide(3, params),
        order,
        params,
        lambda ranks: [sets[order[r]] for r in ranks],
        _sets_jaccard,
    )
    assert result.kept.tolist() == [True, False, False]
    assert result.match.tolist() == [-1, 0, 0]


def test_colliding_but_dissimilar_records_are_never_dropped() -> None:
    params = LshParams(bands=4, rows=4, threshold=0.8)
    sets = [np.arange(i * 100, i * 100 + 50, dtype=np.uint64) for i in range(5)]
    result = near_dedup(
        _all_collide(5, params), np.arange(5), params, lambda r: [sets[i] for i in r], _sets_jaccard
    )
    assert result.kept.all()
    assert result.verified_pairs == 10 and not result.edges


def test_bucket_heads_cap_bounds_pairs_and_is_reported() -> None:
    params = LshParams(bands=2, rows=4, threshold=0.8, bucket_heads=3)
    n = 50
    pairs, stats = candidate_pairs(_all_collide(n, params), np.arange(n), params)
    # Each member pairs with at most 3 earlier heads: 0+1+2 + 47*3 pairs, same in both bands.
    assert len(pairs) == 3 + 47 * 3
    assert all(b.capped_buckets == 1 and b.largest == n for b in stats)
    assert stats[0].pairs_skipped_by_cap == n * (n - 1) // 2 - len(pairs)
    xs, ys = np.divmod(pairs, n)
    assert (ys < xs).all() and (ys < 3).all()


def test_identical_records_in_a_hot_bucket_each_match_the_first() -> None:
    params = LshParams(bands=4, rows=4, threshold=0.8, bucket_heads=8)
    same = np.arange(40, dtype=np.uint64)
    result = near_dedup(
        _all_collide(200, params), np.arange(200), params, lambda r: [same] * len(r), _sets_jaccard
    )
    assert result.kept.tolist() == [True] + [False] * 199
    assert (result.match[1:] == 0).all()
    # Once a record is linked to the first, the other heads of its group are not re-verified.
    assert result.verified_pairs == 199


def test_s_curve_matches_the_formula() -> None:
    curve = {p["s"]: p["p"] for p in s_curve(16, 8)}
    assert list(curve) == [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95]
    assert curve[0.8] == pytest.approx(1 - (1 - 0.8**8) ** 16, abs=1e-6)
    assert curve[0.5] < 0.07 and curve[0.95] > 0.999


# --- through real shingles and signatures ------------------------------------------------------


class ListTexts:
    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def get(self, rows: np.ndarray) -> list[str]:
        return [self.texts[int(i)] for i in rows]

    def release(self) -> None:
        pass


def _records(rows: list[tuple[str, str]], content: str = "prose") -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "record_id": rid,
                "group_id": rid,
                "source_id": rid.split("/", 1)[0],
                "object": "sha256:" + "0" * 64,
                "line": n,
                "kind": "document",
                "dedup_key": dedup_key(text, content),
                "text": text,
            }
            for n, (rid, text) in enumerate(rows)
        ],
        schema=RECORD_COLUMNS,
    )


def near_stage(policy: NearDedupPolicy, texts: list[str], content: dict[str, str]) -> NearStage:
    """A stage over in-memory signatures (and, from v3 on, the shingle modes)."""
    spec = signature_spec(policy)
    if stores_modes(spec):
        sig, modes = signatures_and_modes(texts, spec)
    else:
        sig, modes = signatures(texts, spec), None
    tmp = Path(tempfile.gettempdir())
    return NearStage(policy, [RowMajor(sig)], ListTexts(texts), content, tmp, modes)


def _cluster(
    rows: list[tuple[str, str]], policy: NearDedupPolicy | None = None
) -> tuple[dict[str, dict[str, Any]], NearReport]:
    policy = policy or NearDedupPolicy()
    texts = [t for _, t in rows]
    table = _records(rows)
    sources = set(table.column("source_id").to_pylist())
    stage = near_stage(policy, texts, {s: "prose" for s in sources})
    out, report, _ = cluster(table, {s: n for n, s in enumerate(sorted(sources))}, near=stage)
    assert report is not None
    return {r["record_id"]: r for r in out.to_pylist()}, report


def _words(rng: random.Random, n: int) -> list[str]:
    return [f"w{rng.randrange(10**9)}" for _ in range(n)]


def _shingle_jaccard(a: str, b: str, policy: NearDedupPolicy) -> float:
    fa, fb = fingerprints([a, b], signature_spec(policy))
    return jaccard_sorted(fa, fb)


def test_chapter_example_through_real_text_keeps_a_and_c() -> None:
    # Word 1-shingles make the A-B-C sets; 64 x 2 bands make every pair a candidate.
    policy = NearDedupPolicy(shingle_words=1, bands=64, rows=2, threshold=0.66, bucket_heads=4)
    rows = [("s/a", "one two"), ("s/b", "one two three"), ("s/c", "two three")]
    # Equal lengths would let B win; the order is A, B, C, so give A the most text.
    rows[0] = ("s/a", "one two two two two two two two")
    out, _ = _cluster(rows, policy)
    assert out["s/a"]["verdict"] == KEEP and out["s/c"]["verdict"] == KEEP
    assert out["s/b"]["verdict"] == NEAR and out["s/b"]["match_id"] == "s/a"
    assert out["s/a"]["leakage_id"] == out["s/b"]["leakage_id"] == out["s/c"]["leakage_id"]


def test_exact_then_near_with_representative_chain_and_evidence() -> None:
    rng = random.Random(1)
    base = " ".join(_words(rng, 300))
    near = base.replace(base.split()[150], "changed", 1)
    rows = [
        ("s/1", base + " tail"),  # longest: the representative
        ("s/2", near),
        ("s/3", near.upper()),  # exact duplicate of s/2 after case folding
        ("s/4", " ".join(_words(rng, 300))),  # unrelated
    ]
    out, report = _cluster(rows)
    assert out["s/1"]["verdict"] == KEEP and out["s/4"]["verdict"] == KEEP
    # s/2 and s/3 share a dedup key (case folds away); record id order makes s/3 the copy.
    assert out["s/3"]["verdict"] == EXACT and out["s/3"]["match_id"] == "s/2"
    assert out["s/3"]["match_jaccard"] == 1.0
    assert out["s/2"]["verdict"] == NEAR and out["s/2"]["match_id"] == "s/1"
    assert 0.8 <= out["s/2"]["match_jaccard"] < 1.0
    # Both point at the kept record, so their lineage stays attached to what training reads.
    assert out["s/2"]["representative_id"] == out["s/3"]["representative_id"] == "s/1"
    assert {r["leakage_id"] for k, r in out.items() if k != "s/4"} == {"s/1"}
    assert out["s/4"]["leakage_id"] == "s/4"
    assert report.classes["document/prose"].near_duplicates == 1


def _edited(rng: random.Random, words: list[str], edits: int) -> list[str]:
    out = list(words)
    for _ in range(edits):
        out[rng.randrange(len(out))] = f"x{rng.randrange(10**9)}"
    return out


def test_labelled_pairs_recall_and_no_low_jaccard_deletions() -> None:
    """Constructed edits with exact Jaccard: recall >= 0.99 at J >= 0.85, nothing below 0.7."""
    rng = random.Random(20261130)
    policy = NearDedupPolicy()
    rows, truth = [], {}
    for p in range(1200):
        words = _words(rng, 400)  # one edit removes up to 5 of 396 shingles
        variant = _edited(rng, words, rng.randrange(0, 14))
        a, b = " ".join(words) + " end", " ".join(variant)  # the original is longer: kept
        rows += [(f"s/{p:04d}a", a), (f"s/{p:04d}b", b)]
        truth[f"s/{p:04d}b"] = (f"s/{p:04d}a", _shingle_jaccard(a, b, policy))
    out, _ = _cluster(rows, policy)
    high = [rid for rid, (_, j) in truth.items() if j >= 0.85]
    found = [rid for rid in high if out[rid]["verdict"] == NEAR]
    assert len(high) > 600 and len(truth) - len(high) > 300
    assert len(found) / len(high) >= 0.99
    for rid, row in out.items():
        if row["verdict"] == NEAR:
            base, j = truth[rid]
            assert row["match_id"] == base and row["match_jaccard"] == pytest.approx(j)
            assert j >= 0.8 > 0.7
    assert all(out[rid]["verdict"] == KEEP for rid in out if rid.endswith("a"))


# --- the layer: workers, reruns, incremental signatures, integrity ------------------------------


def _build(ws: Workspace, key: str) -> LayerResult:
    for layer in ("raw_snapshot", "canonical_records"):
        BUILDERS[layer](ws, key)
    return BUILDERS["dedup_clusters"](ws, key)


def test_one_and_two_workers_and_reruns_give_the_same_dedup_table(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digests = []
    for workers in (1, 2, 2):
        use_demo_copy(demo_home, tmp_path / f"w{len(digests)}", workers, monkeypatch)
        with open_workspace() as ws:
            result = _build(ws, "p1")
            assert result.counts["near_duplicates"] == 1
            assert result.run_stats["signatures_hashed"] == result.counts["records"]
            digests.append((result.digest, result.digests["clusters"]))
    assert digests[0] == digests[1] == digests[2]


def _signature_stats(result: LayerResult) -> dict[str, int]:
    return {k: v for k, v in result.run_stats.items() if k.startswith("signatures_")}


def test_a_new_source_object_rehashes_only_its_records(demo_home: Path) -> None:
    with open_workspace() as ws:
        first = _build(ws, "p1")
        assert _signature_stats(first) == {
            "signatures_hashed": first.counts["records"],
            "signatures_reused": 0,
        }
        rng = random.Random(3)
        rows = [{"id": f"new{n}", "text": " ".join(_words(rng, 80))} for n in range(7)]
        new = demo_home / "demo-sources" / "essays" / "essays-00002.jsonl"
        new.write_text("".join(json.dumps(r) + "\n" for r in rows))
        second = _build(ws, "p2")
    assert second.counts["records"] == first.counts["records"] + 7
    assert _signature_stats(second) == {
        "signatures_hashed": 7,
        "signatures_reused": first.counts["records"],
    }
    # Banding and verification still cover the whole snapshot: the old near pair is found again.
    assert second.counts["near_duplicates"] == first.counts["near_duplicates"] == 1


def test_a_corrupt_cached_signature_file_is_named_not_used(demo_home: Path) -> None:
    with open_workspace() as ws:
        first = _build(ws, "p1")
        index = json.loads(ws.cas.get_bytes(first.digest))
        victim = index["outputs"]["signatures"][0]
        path = ws.cas.path(victim["signatures"]["digest"])
        data = bytearray(path.read_bytes())
        data[-1] ^= 0x01
        path.write_bytes(bytes(data))
        # a build that reads the signatures (not the layer memo, which reads nothing and leaves
        # corrupt bytes to the validation check's verify) names the file instead of using it
        with pytest.raises(CasError, match=f"MinHash signatures of chunk {victim['chunk']}"):
            DIRECT_BUILDERS["dedup_clusters"](ws, "p1")


def test_unchanged_signature_files_are_not_hashed_again(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild trusts the signature files unchanged on disk since they last hashed right
    (a child's old chunks); a changed file is hashed and named (the test above)."""
    with open_workspace() as ws:
        first = _build(ws, "p1")
        index = json.loads(ws.cas.get_bytes(first.digest))
        signatures = {s["signatures"]["digest"] for s in index["outputs"]["signatures"]}
        hashed = hashed_digests(monkeypatch)
        again = DIRECT_BUILDERS["dedup_clusters"](ws, "p1")
    assert again.digest == first.digest
    assert signatures and not signatures & set(hashed)


# --- real corpora (../shared/corpora; skipped when absent) --------------------------------------

CORPORA = CORPORA
needs_corpora = pytest.mark.skipif(not CORPORA.is_dir(), reason="../shared/corpora is absent")


def _real_dedup(tmp_path: Path, name: str, content: str) -> tuple[Workspace, list[dict], dict]:
    config = tmp_path / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: real\nstorage: {{home: {tmp_path / 'home'}}}\n"
        f"sources:\n  - {{id: {name}, kind: objects, path: {CORPORA / name}, content: {content}}}\n"
    )
    ws = open_workspace(config)
    result = _build(ws, "p1")
    index = json.loads(ws.cas.get_bytes(result.digest))
    parted = PartedTable.read(ws.cas, index["outputs"]["clusters"], "clusters")
    table = parted.table(VerifiedFiles(ws.cas), "clusters").to_pylist()
    return ws, table, result.counts


def _near_figures(ws: Workspace, table: list[dict]) -> tuple[int, int, list[np.ndarray]]:
    """The corpora's reference figures over exact-distinct records: pairs at J >= 0.8 (exact
    Jaccard) inside our near-duplicate components, and the number of such components."""
    canonical = CanonicalIndex.load(ws.cas, ws.catalog.layer_output("p1", "canonical_records"))
    records = canonical.table(["record_id", "text"]).to_pydict()
    text = dict(zip(records["record_id"], records["text"], strict=True))
    members: dict[str, list[str]] = {}
    for row in table:
        if row["verdict"] in (KEEP, NEAR):
            members.setdefault(row["leakage_id"], []).append(row["record_id"])
    pairs = clusters = 0
    for ids in members.values():
        if len(ids) > 1:
            clusters += 1
            prints = fingerprints([text[i] for i in ids])
            pairs += sum(
                jaccard_sorted(prints[a], prints[b]) >= 0.8
                for a in range(len(ids))
                for b in range(a + 1, len(ids))
            )
    everyone = fingerprints([text[r["record_id"]] for r in table if r["verdict"] in (KEEP, NEAR)])
    return pairs, clusters, everyone


def _components_by_brute_force(prints: list[np.ndarray], tau: float) -> int:
    """Components (size >= 2) of the exact J >= tau graph over all pairs; J >= tau needs the
    smaller set to be at least tau times the larger, which prunes most pairs."""
    order = sorted(range(len(prints)), key=lambda i: len(prints[i]))
    parent = list(range(len(prints)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, i in enumerate(order):
        for j in order[a + 1 :]:
            if len(prints[i]) < tau * len(prints[j]):
                break
            if jaccard_sorted(prints[i], prints[j]) >= tau:
                parent[find(i)] = find(j)
    roots = [find(i) for i in range(len(prints))]
    return sum(1 for root in set(roots) if roots.count(root) > 1)


def _text_identical_duplicates(ws: Workspace) -> int:
    canonical = CanonicalIndex.load(ws.cas, ws.catalog.layer_output("p1", "canonical_records"))
    digests = canonical.table(["text_digest"]).column("text_digest").to_pylist()
    return len(digests) - len(set(digests))


@needs_corpora
def test_real_licenses_match_the_corpora_readme(tmp_path: Path) -> None:
    ws, table, counts = _real_dedup(tmp_path, "licenses", "prose")
    # Reference: 530 exact duplicate documents. One row is quarantined (NUL bytes) and PII
    # redaction makes one more pair identical: 531 by canonical text.
    assert _text_identical_duplicates(ws) == 531
    # The dedup key also folds case and whitespace in prose: 18 more copies.
    assert counts["exact_duplicates"] == 548
    pairs, clusters, everyone = _near_figures(ws, table)
    assert abs(pairs - 5524) <= 0.2 * 5524  # reference: 5,524 pairs at J >= 0.8
    # Reference: 26 clusters, from datasketch's LSH with 9 x 13 bands, which finds a pair at
    # J = 0.8 with probability 0.40. Exact Jaccard over all pairs gives our count.
    assert clusters == _components_by_brute_force(everyone, 0.8)
    assert all(r["match_jaccard"] >= 0.8 for r in table if r["verdict"] == NEAR)
    ws.close()


@needs_corpora
def test_real_python_stdlib_matches_the_corpora_readme(tmp_path: Path) -> None:
    ws, table, counts = _real_dedup(tmp_path, "python-stdlib", "code")
    assert _text_identical_duplicates(ws) == 2182  # reference: 2,182
    assert counts["exact_duplicates"] >= 2182  # code keys fold CRLF and trailing blanks only
    pairs, clusters, _ = _near_figures(ws, table)
    assert abs(pairs - 1723) <= 0.2 * 1723  # reference: 1,723 pairs
    assert abs(clusters - 450) <= 0.2 * 450  # reference: 450 clusters
    near = [r for r in table if r["verdict"] == NEAR]
    assert near and all(r["match_jaccard"] >= 0.8 for r in near)
    ws.close()


@needs_corpora
def test_real_python_docs_lose_nothing(tmp_path: Path) -> None:
    ws, table, counts = _real_dedup(tmp_path, "python-docs", "prose")
    assert counts["records"] == 497 and counts["kept"] == 497
    assert {r["verdict"] for r in table} == {KEEP}
    ws.close()


@pytest.mark.parametrize("built_demo", ["sqlite"], indirect=True)
def test_a_removed_duplicate_stays_in_deletion_lineage_through_its_representative(
    built_workspace: Workspace, built_demo: BuiltDemo
) -> None:
    ws = built_workspace
    found = hits(ws.cas, ws.catalog, "record", "essays/e0020")  # the demo's near copy
    (representative,) = hits(ws.cas, ws.catalog, "record", "essays/e0123")
    assert [s["snapshotId"] for s in found] == [built_demo.snapshot_id]
    assert found[0]["members"] == []  # not trained on as itself...
    (alias,) = found[0]["carried_by"]  # ...but through the record that stood for it
    assert (alias["verdict"], alias["representative_id"]) == (NEAR, "essays/e0123")
    assert 0.8 <= alias["match_jaccard"] < 1
    # Its spans and runs are the representative's (none in blocks if it is not a train record).
    assert (found[0]["spans"], found[0]["blocks"]) == (
        representative["spans"],
        representative["blocks"],
    )


def test_unspaced_scripts_use_character_shingles() -> None:
    rng = random.Random(9)
    han = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(300))
    edited = list(han)
    for at in (50, 150, 250):
        edited[at] = "\u3042"
    rows = [("s/zh", han + "\u3002"), ("s/zh2", "".join(edited)), ("s/other", han[::-1])]
    v2 = NearDedupPolicy(signature="minhash.v2")  # character shingles (v3 segments words)
    out, _ = _cluster(rows, v2)
    # A text without spaces has one "word": word 5-grams would see nothing in common.
    assert out["s/zh2"]["verdict"] == NEAR and out["s/zh2"]["match_id"] == "s/zh"
    assert out["s/zh2"]["match_jaccard"] == pytest.approx(
        _shingle_jaccard(han + "\u3002", "".join(edited), v2)
    )
    assert out["s/other"]["verdict"] == KEEP


def test_near_dedup_can_be_switched_off(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_demo_copy(demo_home, tmp_path / "off", 1, monkeypatch)
    config = tmp_path / "off" / "corpus.yaml"
    off = "policies:\n  dedup: {near: {enabled: false}}\n"
    config.write_text(config.read_text().replace("policies:\n", off))
    with open_workspace() as ws:
        result = _build(ws, "p1")
    assert (result.counts["exact_duplicates"], result.counts["near_duplicates"]) == (4, 0)
    assert result.run_stats == {} and "s_curve" not in result.details


def test_prose_and_code_are_never_compared() -> None:
    rng = random.Random(4)
    text = " ".join(_words(rng, 200))
    rows = [("a/1", text), ("b/1", text + " x"), ("b/2", text + " y")]
    table = _records(rows)
    texts = [t for _, t in rows]
    stage = near_stage(NearDedupPolicy(), texts, {"a": "prose", "b": "code"})
    out, report, _ = cluster(table, {"a": 0, "b": 1}, near=stage)
    verdicts = {r["record_id"]: r["verdict"] for r in out.to_pylist()}
    # a/1 is prose, b/* are code: only the two code records are each other's near duplicates.
    assert verdicts == {"a/1": KEEP, "b/1": KEEP, "b/2": NEAR}
    assert report is not None and sorted(report.classes) == ["document/code", "document/prose"]


def test_validation_names_brokendedup_invariants(tmp_path: Path) -> None:
    rows = [  # record, verdict, representative, match, jaccard, leakage group
        ("a", KEEP, "a", "", None, "g1"),
        ("c", KEEP, "c", "", None, "g1"),  # linked to a through b, but in another split
        ("b", NEAR, "a", "a", 0.7, "g1"),  # below the 0.8 threshold
        ("d", EXACT, "x", "x", 1.0, "g2"),  # stands behind a record that is no member
    ]
    names = ["record_id", "verdict", "representative_id", "match_id", "match_jaccard"]
    clusters = pa.table({n: [r[i] for r in rows] for i, n in enumerate([*names, "leakage_id"])})
    clusters = clusters.append_column("group_id", clusters["record_id"]).append_column(
        "is_representative", pa.array([r[1] == KEEP for r in rows])
    )
    edges = pa.table(
        {
            "record_a": ["b", "b", "d"],
            "record_b": ["a", "c", "x"],
            "kind": ["near", "near", "exact"],
            "jaccard": [0.7, 0.85, 1.0],
        }
    )
    members = pa.table({"record_id": ["a", "c"], "split": ["train", "test"]})
    findings, leaks = dedup_invariants(clusters, edges, 0.8, members)
    assert leaks == 1 and "leakage group 'g1' spans splits test (1), train (1)" in findings
    assert any(
        f.startswith("near duplicate 'b': direct match 'a' at Jaccard 0.7") for f in findings
    )
    assert "removed record 'd' stands behind 'x', which is no member" in findings
    assert len(findings) == 3


def test_leaked_components_come_in_the_order_of_their_first_row() -> None:
    """Components through a shared group (a null group id is one group), through an edge, and a
    component of one record: each leaking one named once, ordered by its first clusters row."""
    rows = [  # record, group, split (None: excluded from the members), leakage id
        ("r1", "g1", "train", "L1"),
        ("r4", None, "train", "L4"),
        ("r3", "g3", "train", "L3"),
        ("r2", "g1", "test", "L2"),
        ("r5", None, "test", "L5"),
        ("r6", "g6", "test", "L6"),
        ("r7", "g7", "train", "L7"),
    ]
    clusters = pa.table(
        {
            "record_id": [r[0] for r in rows],
            "verdict": [KEEP] * len(rows),
            "representative_id": [r[0] for r in rows],
            "match_id": [""] * len(rows),
            "match_jaccard": pa.array([None] * len(rows), pa.float64()),
            "leakage_id": [r[3] for r in rows],
            "group_id": pa.array([r[1] for r in rows], pa.string()),
            "is_representative": [True] * len(rows),
        }
    )
    edges = pa.table({"record_a": ["r3"], "record_b": ["r6"], "kind": ["near"], "jaccard": [0.9]})
    members = pa.table({"record_id": [r[0] for r in rows], "split": [r[2] for r in rows]})
    findings, leaks = dedup_invariants(clusters, edges, 0.8, members)
    assert leaks == 3
    assert findings == [
        "leakage group 'L1' spans splits test (1), train (1)",
        "leakage group 'L4' spans splits test (1), train (1)",
        "leakage group 'L3' spans splits test (1), train (1)",
    ]
