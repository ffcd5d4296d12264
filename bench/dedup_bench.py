"""Near-dedup banding + clustering: ``near_dedup`` against datasketch ``MinHashLSH``, same run.

Synthetic corpus (seeded): N MinHash-shaped signatures (128 uint32 components) written as
per-chunk ``.npy`` files of 65,536 rows, plus one exact fingerprint set per document (150 sorted
unique uint64 values, one ``.npy`` of shape (N, 150)). Planted structure, in random positions:

- near-duplicate families of 2-50 documents (non-root members are ~10% of all rows): each member
  is its family root's signature with r = 5-15% of the components replaced, and its set keeps
  ``k`` of the root's fingerprints (plus fresh ones) so that the exact Jaccard is ~1 - r/128;
- one hot template bucket of 0.5% of the rows (5,000 at 1M) with identical signatures and sets,
  which exercises the ``bucket_heads`` cap;
- near misses (2% of rows): a copy of a fresh root with 25-40% replaced (Jaccard 0.6-0.75): LSH
  candidates that verification must reject.

The signatures are generated directly, not as the MinHash of the sets (synthetic; the two agree
only in the planted similarity). Each family root precedes its members in the total order
(``order = arange``), so every planted member can be dropped. Each size (N/4, N/2, N and the
baseline's size) gets a fresh corpus with the same statistics, generated outside the timing.

Every measurement runs in a fresh child process (median of ``--repeats``): ours is
``near_dedup(band-major chunk files, order, LshParams(), fingerprints from the mmap'd sets,
jaccard)``
end to end (banding, pair generation, verification scan, the deletion scan); the baseline is
datasketch ``MinHashLSH(threshold=0.8, num_perm=128, params=(16, 8))`` building
``LeanMinHash(hashvalues=row, scheme="legacy")`` objects, inserting them all and querying each
(no verification, no clustering: it does less work than ours). The parent samples each child's
``RssAnon``/``RssFile`` every 10 ms; the child reports its own ``VmHWM`` (peak RSS, which counts
the touched pages of the memory-mapped files) and its RSS after imports. Exits non-zero on a wrong
result (a drop that is not a planted near duplicate, a drop whose direct match is not kept or is
below threshold, recall under ``--min-recall``, or uncapped banding disagreeing with datasketch's
candidate pairs at the baseline size).

Usage: .venv/bin/python bench/dedup_bench.py [--docs 1000000] [--baseline-docs 100000] [--quick]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from corpus_assets.core.dedup.near_dedup import LshParams, candidate_pairs, near_dedup
from corpus_assets.core.dedup.signature_cache import BandMajorFile, band_major_npy

REPO_ROOT = Path(__file__).resolve().parents[1]
NUM_PERM = 128
SET_SIZE = 150
CHUNK_ROWS = 65_536
DUP_FRACTION = 0.10
HOT_FRACTION = 0.005
NEAR_MISS_FRACTION = 0.02
TARGET_DOCS_PER_S = 150_000


def jaccard_impl():
    """(callable, description): ``jaccard.jaccard_sorted`` when it exists, else a local one."""
    try:
        from corpus_assets.core.dedup.jaccard import jaccard_sorted
    except ImportError:
        pass
    else:
        return jaccard_sorted, "corpus_assets.core.dedup.jaccard.jaccard_sorted"

    def jaccard_local(a: np.ndarray, b: np.ndarray) -> float:
        if not len(a) and not len(b):
            return 1.0
        inter = len(np.intersect1d(a, b, assume_unique=True))
        return inter / (len(a) + len(b) - inter)

    return jaccard_local, "local np.intersect1d (jaccard.jaccard_sorted not available)"


# --- corpus -------------------------------------------------------------------------------------


def _exact_mask(rng: np.random.Generator, rows: int, width: int, counts: np.ndarray) -> np.ndarray:
    """Boolean (rows, width) with exactly ``counts[i]`` random True cells in row i."""
    ranks = rng.random((rows, width)).argsort(axis=1).argsort(axis=1)
    return ranks < counts[:, None]


def _family_sizes(rng: np.random.Generator, members: int) -> list[int]:
    """Family sizes in 2..50, P(s) ~ s**-1.5, until their non-root members reach ``members``."""
    support = np.arange(2, 51)
    weights = support**-1.5
    sizes: list[int] = []
    total = 0
    while total < members:
        for s in rng.choice(support, size=1024, p=weights / weights.sum()).tolist():
            s = min(s, members - total + 1)
            sizes.append(s)
            total += s - 1
            if total >= members:
                break
    return sizes


def generate(root: Path, n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    sig = rng.integers(0, 2**32, size=(n, NUM_PERM), dtype=np.uint32)
    fps = rng.integers(0, 2**64, size=(n, SET_SIZE), dtype=np.uint64)
    hot = max(2, round(n * HOT_FRACTION))
    families = _family_sizes(rng, round(n * DUP_FRACTION))
    near_misses = round(n * NEAR_MISS_FRACTION)
    kinds = [0] + [1] * len(families) + [2] * near_misses  # 0 hot, 1 family, 2 near miss
    sizes = np.array([hot, *families] + [2] * near_misses, dtype=np.int64)
    group = np.repeat(np.arange(len(sizes)), sizes)
    pos = rng.permutation(n)[: len(group)]
    pos = pos[np.lexsort((pos, group))]  # group-major, ascending position: the root comes first
    starts = np.cumsum(sizes) - sizes
    is_root = np.zeros(len(group), dtype=bool)
    is_root[starts] = True
    members, roots = pos[~is_root], pos[starts][group[~is_root]]
    kind = np.asarray(kinds)[group[~is_root]]
    p = np.where(
        kind == 1, rng.uniform(0.05, 0.15, len(members)), rng.uniform(0.25, 0.40, len(members))
    )
    p[kind == 0] = 0.0
    replaced = np.rint(p * NUM_PERM).astype(np.int64)
    target = 1.0 - replaced / NUM_PERM  # Jaccard the set should have (k / (2 * SET_SIZE - k))
    keep = np.rint(2 * SET_SIZE * target / (1.0 + target)).astype(np.int64)
    m = len(members)
    new = sig[roots]
    mask = _exact_mask(rng, m, NUM_PERM, replaced)
    new[mask] = rng.integers(0, 2**32, size=int(mask.sum()), dtype=np.uint32)
    sig[members] = new
    new_fp = fps[roots]
    mask = _exact_mask(rng, m, SET_SIZE, SET_SIZE - keep)
    new_fp[mask] = rng.integers(0, 2**64, size=int(mask.sum()), dtype=np.uint64)
    fps[members] = new_fp
    del new, new_fp, mask
    fps.sort(axis=1)
    if not (fps[:, 1:] > fps[:, :-1]).all():
        raise SystemExit("fingerprint collision inside a set; change --seed")
    planted = np.zeros(n, dtype=bool)
    planted[members[kind != 2]] = True
    near_miss = np.zeros(n, dtype=bool)
    near_miss[members[kind == 2]] = True
    for i, lo in enumerate(range(0, n, CHUNK_ROWS)):
        (root / f"sig_{i:05d}.npy").write_bytes(band_major_npy(sig[lo : lo + CHUNK_ROWS]))
    np.save(root / "fps.npy", fps)
    np.save(root / "planted.npy", planted)
    np.save(root / "near_miss.npy", near_miss)
    meta = {
        "docs": n,
        "families": len(families),
        "family_members": int((kind == 1).sum()),
        "hot_bucket": hot,
        "near_misses": near_misses,
        "planted": int(planted.sum()),
    }
    (root / "meta.json").write_text(json.dumps(meta))
    return meta


@dataclass(frozen=True)
class _Prefix:
    """The first ``records`` records of a band-major signature file."""

    block: BandMajorFile
    records: int

    def band(self, band: int, rows: int) -> np.ndarray:
        return self.block.band(band, rows)[:, : self.records]


def load_prefix(root: Path, k: int) -> tuple[list[_Prefix], np.ndarray]:
    """Band-major signature chunks (the layer's cache format, read a band at a time) covering
    the first ``k`` rows, and the mmap'd sets."""
    chunks = []
    for i, lo in enumerate(range(0, k, CHUNK_ROWS)):
        block = BandMajorFile.open(root / f"sig_{i:05d}.npy")
        chunks.append(_Prefix(block, min(k - lo, block.records)))
    return chunks, np.load(root / "fps.npy", mmap_mode="r")


# --- children -----------------------------------------------------------------------------------


def _status_kb(pid: int | str = "self") -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def child_ours(root: Path, k: int, profile: bool) -> dict:
    jaccard, _ = jaccard_impl()
    chunks, fps = load_prefix(root, k)
    order = np.arange(k, dtype=np.int64)

    def prints(ranks: np.ndarray) -> list[np.ndarray]:
        return list(fps[order[ranks]])

    params = LshParams()
    # --per-record-thresholds: what the layer passes under minhash.v3 (a threshold per record,
    # all word mode here), to compare the verification loop with and without it.
    taus = np.full(k, params.threshold) if os.environ.get("DEDUP_BENCH_TAUS") else None
    rss_start = _status_kb()["VmRSS"]
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        t0 = time.perf_counter()
        res = prof.runcall(near_dedup, chunks, order, params, prints, jaccard, None, taus)
        seconds = time.perf_counter() - t0
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(15)
    else:
        t0 = time.perf_counter()
        res = near_dedup(chunks, order, params, prints, jaccard, None, taus)
        seconds = time.perf_counter() - t0
    hwm = _status_kb()["VmHWM"]

    planted = np.load(root / "planted.npy")[:k]
    dropped = ~res.kept
    bad_drops = int((dropped & ~planted).sum())
    direct = res.match[dropped]
    bad_matches = int(
        (~res.kept[direct]).sum() + (res.match_jaccard[dropped] < params.threshold).sum()
    )
    rechecked = [
        jaccard(fps[x], fps[y]) for x, y in zip(np.flatnonzero(dropped), direct, strict=True)
    ]
    bad_matches += int((np.abs(np.asarray(rechecked) - res.match_jaccard[dropped]) > 1e-12).sum())
    return {
        "seconds": seconds,
        "peak_kb": hwm,
        "start_kb": rss_start,
        "candidate_pairs": res.candidate_pairs,
        "verified_pairs": res.verified_pairs,
        "skipped_same_group": res.skipped_same_group,
        "fingerprinted": res.fingerprinted,
        "edges": len(res.edges),
        "found": int(dropped.sum()),
        "found_planted": int((dropped & planted).sum()),
        "planted": int(planted.sum()),
        "bad_drops": bad_drops,
        "bad_matches": bad_matches,
        "capped_buckets": sum(b.capped_buckets for b in res.bands),
        "largest_bucket": max((b.largest for b in res.bands), default=0),
        "pairs_skipped_by_cap": sum(b.pairs_skipped_by_cap for b in res.bands),
    }


def child_datasketch(root: Path, k: int) -> dict:
    from datasketch import LeanMinHash, MinHashLSH

    chunks, _ = load_prefix(root, k)
    params = LshParams()
    rss_start = _status_kb()["VmRSS"]
    t0 = time.perf_counter()
    lsh = MinHashLSH(
        threshold=params.threshold, num_perm=NUM_PERM, params=(params.bands, params.rows)
    )
    rows = np.concatenate([c.block.band(0, NUM_PERM)[:, : c.records].T for c in chunks])
    sketches = [LeanMinHash(seed=1, hashvalues=row, scheme="legacy") for row in rows]
    for key, sketch in enumerate(sketches):
        lsh.insert(key, sketch)
    hits = 0
    for sketch in sketches:
        hits += len(lsh.query(sketch)) - 1  # the query's own key is always returned
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "peak_kb": _status_kb()["VmHWM"],
        "start_kb": rss_start,
        "candidate_pairs": hits // 2,
    }


def run_child(root: Path, kind: str, k: int, profile: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--dir", str(root), "--docs", str(k)]
    if profile:
        cmd.append("--profile")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True)
    peak_anon = peak_file = 0
    while proc.poll() is None:
        st = _status_kb(proc.pid)
        peak_anon = max(peak_anon, st.get("RssAnon", 0))
        peak_file = max(peak_file, st.get("RssFile", 0))
        time.sleep(0.01)
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"child {kind} {k} failed with {proc.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    result.update(anon_kb=peak_anon, file_kb=peak_file)
    return result


def measure(root: Path, kind: str, k: int, repeats: int) -> dict:
    runs = [run_child(root, kind, k) for _ in range(repeats)]
    med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    med["docs"] = k
    med["docs_per_s"] = k / med["seconds"]
    med["runs"] = runs
    return med


# --- parent -------------------------------------------------------------------------------------


def mb(kb: float) -> str:
    return f"{kb / 1024:7.0f} MB"


def row(name: str, m: dict) -> str:
    return (
        f"{name:34s} {m['docs']:>9,d} {m['docs_per_s']:>10,.0f} {m['seconds']:8.2f} s"
        f"  peak {mb(m['peak_kb'])} (anon {mb(m['anon_kb'])}, file {mb(m['file_kb'])},"
        f" after imports {mb(m['start_kb'])})"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--baseline-docs", type=int, default=100_000)
    ap.add_argument("--sizes", type=str, default=None, help="comma list; default N/4,N/2 (+N)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--min-recall", type=float, default=0.99)
    ap.add_argument("--quick", action="store_true", help="50k docs, baseline at 10k")
    ap.add_argument("--tmp", type=Path, default=None, help="scratch folder (about 1.8 GB per 1M)")
    ap.add_argument("--profile", action="store_true", help="cProfile one ours run at N (stderr)")
    ap.add_argument(
        "--per-record-thresholds",
        action="store_true",
        help="pass near_dedup one threshold per record, as the layer does under minhash.v3",
    )
    ap.add_argument("--child", choices=["ours", "datasketch"], help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.per_record_thresholds:
        os.environ["DEDUP_BENCH_TAUS"] = "1"  # inherited by the child processes

    if args.child:
        if args.child == "ours":
            result = child_ours(args.dir, args.docs, args.profile)
        else:
            result = child_datasketch(args.dir, args.docs)
        print(json.dumps(result))
        return

    if args.quick:
        args.docs, args.baseline_docs = 50_000, 10_000
    n = args.docs
    base_k = min(args.baseline_docs, n)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else [n // 4, n // 2]
    sizes = sorted({*sizes, n, base_k})
    params = LshParams()
    _, jaccard_name = jaccard_impl()
    print(
        f"synthetic corpora (a fresh one per size, same statistics, seed {args.seed}):"
        f" {NUM_PERM} uint32 perms in band-major .npy chunks of {CHUNK_ROWS:,} rows,"
        f" {SET_SIZE} uint64 fingerprints/doc (one mmap'd .npy)"
    )
    print(
        f"  planted: families of 2-50 whose non-root members are {DUP_FRACTION:.0%} of rows"
        f" (5-15% of components replaced, J 0.85-0.95), one hot bucket of {HOT_FRACTION:.1%}"
        f" of rows (identical), {NEAR_MISS_FRACTION:.0%} near misses (J 0.6-0.75)"
    )
    print("  signatures are synthetic: generated directly, not the MinHash of the sets")
    print(
        f"  LSH {params.bands}x{params.rows}, threshold {params.threshold}, bucket_heads"
        f" {params.bucket_heads}; jaccard: {jaccard_name}; order = arange; median of"
        f" {args.repeats}, each run in a fresh process; baseline = datasketch MinHashLSH"
        f" params=({params.bands}, {params.rows}) insert + query, no verification"
    )
    print()
    print(f"{'variant':34s} {'docs':>9s} {'docs/s':>10s} {'median':>10s}")

    scratch = Path(tempfile.mkdtemp(prefix="dedup_bench_", dir=args.tmp))
    results: dict[int, dict] = {}
    failures = []
    try:
        for k in sizes:
            root = scratch / str(k)
            root.mkdir()
            t0 = time.perf_counter()
            meta = generate(root, k, args.seed)
            print(
                f"corpus {k:,}: {meta['families']:,} families, {meta['family_members']:,}"
                f" members, hot bucket {meta['hot_bucket']:,}, {meta['near_misses']:,} near"
                f" misses, {meta['planted']:,} planted ({time.perf_counter() - t0:.1f} s)"
            )
            if k == base_k:
                # Uncapped banding must give exactly datasketch's candidate pairs.
                chunks, _ = load_prefix(root, k)
                wide = LshParams(bucket_heads=k)
                n_uncapped = len(candidate_pairs(chunks, np.arange(k), wide)[0])
                del chunks
                base = measure(root, "datasketch", k, args.repeats)
                print(row("datasketch MinHashLSH ins+query", base))
            results[k] = measure(root, "ours", k, args.repeats)
            print(row("ours near_dedup", results[k]))
            if k == base_k:
                ours = results[k]
                print(
                    f"ratio ours/datasketch at {k:,} docs: "
                    f"{ours['docs_per_s'] / base['docs_per_s']:.1f}x docs/s, "
                    f"{ours['peak_kb'] / base['peak_kb']:.2f}x peak RSS, "
                    f"{ours['anon_kb'] / base['anon_kb']:.2f}x peak anon RSS"
                )
                print(
                    f"candidate pairs at {k:,}: datasketch {base['candidate_pairs']:,.0f}"
                    f" (all pairs), ours uncapped {n_uncapped:,},"
                    f" ours with cap {ours['candidate_pairs']:,.0f}"
                )
                if n_uncapped != base["candidate_pairs"]:
                    failures.append(
                        f"uncapped pairs {n_uncapped} != datasketch {base['candidate_pairs']}"
                    )
            if args.profile and k == n:
                run_child(root, "ours", k, profile=True)
            shutil.rmtree(root)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print()
    print(
        f"{'docs':>9s} {'candidates':>11s} {'verified':>9s} {'same-group':>10s}"
        f" {'fetched':>8s} {'found':>8s} {'planted':>8s} {'recall':>7s} {'capped':>6s}"
        f" {'largest':>7s} {'skipped by cap':>14s}"
    )
    for k in sorted(results):
        m = results[k]
        recall = m["found_planted"] / max(m["planted"], 1)
        print(
            f"{k:>9,d} {m['candidate_pairs']:>11,.0f} {m['verified_pairs']:>9,.0f}"
            f" {m['skipped_same_group']:>10,.0f} {m['fingerprinted']:>8,.0f}"
            f" {m['found']:>8,.0f} {m['planted']:>8,.0f} {recall:>7.5f}"
            f" {m['capped_buckets']:>6,.0f} {m['largest_bucket']:>7,.0f}"
            f" {m['pairs_skipped_by_cap']:>14,.0f}"
        )
        for r in m["runs"]:
            if r["bad_drops"] or r["bad_matches"]:
                failures.append(f"{k}: {r['bad_drops']} bad drops, {r['bad_matches']} bad matches")
        if recall < args.min_recall:
            failures.append(f"{k}: recall {recall:.4f} < {args.min_recall}")

    print()
    print("peak RSS of ours by size (VmHWM; anon = heap, file = touched pages of the mmap'd sets):")
    for k in sizes:
        m = results[k]
        print(
            f"  {k:>9,d} docs: peak {mb(m['peak_kb'])}, anon {mb(m['anon_kb'])},"
            f" file {mb(m['file_kb'])}"
        )
    full = results[n]
    verdict = "PASS" if full["docs_per_s"] >= TARGET_DOCS_PER_S else "MISS"
    print(
        f"target >= {TARGET_DOCS_PER_S:,} docs/s at {n:,} docs:"
        f" {full['docs_per_s']:,.0f} docs/s, {verdict}"
    )
    if failures:
        print("WRONG RESULT:\n  " + "\n  ".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
