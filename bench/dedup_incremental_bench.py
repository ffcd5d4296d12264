"""The dedup_clusters layer of a child snapshot (+1% documents): incremental vs full, CPU time.

The parent is the shared corpora at about ``--mb`` MB (``race_corpus.write_corpus``), built
through every layer, approved and activated. The child's sources add about 1% more documents
(half of them near copies of old documents with one word changed, half new texts: copy 1 of
the shared corpora's ciphered lines) as one more object per source. The child's raw and
canonical layers are built once and its dedup once (not measured: the new chunk's signatures
are hashed there, so both modes below reuse every signature); then its ``dedup_clusters`` runs
in a fresh child process, alternately incremental (the parent's verified pairs reused) and full
(the named baseline: the same code with the parent lookup switched off in this harness),
``--repeat`` times each. Printed: median CPU seconds of each (user + system of
the process and its workers) and the ratio; both runs must publish the same index digest.

Usage: .venv/bin/python bench/dedup_incremental_bench.py [--mb 120] [--repeat 3] [--tmp DIR]
"""

import argparse
import io
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zstandard

sys.path.insert(0, str(Path(__file__).parent))
from race import env_for, write_config
from race_corpus import SOURCES, cipher, copy_line, shared_lines, write_corpus

SHARED = Path(__file__).resolve().parents[2] / "shared" / "corpora"


def _cpu() -> float:
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def child(config: str, mode: str) -> None:
    """One layer run; ``full`` switches the parent lookup off (the baseline)."""
    from corpus_assets.core.dedup import dedup_clusters, pair_cache
    from corpus_assets.core.pipeline import DIRECT_BUILDERS
    from corpus_assets.core.runtime.workspace import open_workspace

    if mode == "full":
        dedup_clusters.parent_mode = lambda *_: pair_cache.Mode(pair_cache.FULL, "bench baseline")
    with open_workspace(config) as ws:
        start, wall = _cpu(), time.perf_counter()
        result = DIRECT_BUILDERS["dedup_clusters"](ws, "p2")
        cpu, wall = _cpu() - start, time.perf_counter() - wall
    print(json.dumps({"cpu": cpu, "wall": wall, "digest": result.digest, "run": result.run_stats}))


def _run(env: dict[str, str], *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False, env=env
    )
    if done.returncode:
        sys.exit(f"child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _prepare(config: str, parent: bool) -> None:
    from corpus_assets.core.pipeline import BUILDERS, build_all
    from corpus_assets.core.publication.publish import activate, approve
    from corpus_assets.core.runtime.workspace import open_workspace

    with open_workspace(config) as ws:
        if parent:
            sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
            approve(ws, sid, by="bench")
            activate(ws, sid, actor="bench")
        else:
            for layer in ("raw_snapshot", "canonical_records"):
                BUILDERS[layer](ws, "p2")
    print(json.dumps({}))


def append_one_percent(sources: list[dict], seed: int = 32) -> int:
    """One more object per source: ~1% of its lines, half edited copies, half new texts."""
    rng, added = random.Random(seed), 0
    folders = {source_id: name for name, (source_id, _) in SOURCES.items()}
    for source in sources:
        lines = list(shared_lines(SHARED / folders[source["id"]]))
        out = io.BytesIO()
        for n, line in enumerate(rng.sample(lines, max(1, len(lines) // 100))):
            k = n % 2  # copy 1's cipher: a text no old document shares shingles with
            row = json.loads(copy_line(line, k, cipher(k)))
            if not k:  # a near copy of an old document: one word changed
                words = row["text"].split(" ")
                words[rng.randrange(len(words))] = "incrementally"
                row["text"] = " ".join(words)
            row["id"] = f"{row['id']}-new{n}"
            out.write((json.dumps(row, ensure_ascii=False) + "\n").encode())
            added += 1
        (Path(source["path"]) / "zz-new.jsonl.zst").write_bytes(zstandard.compress(out.getvalue()))
    return added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=120)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--child", default=None)
    parser.add_argument("--mode", default="incremental")
    parser.add_argument("--prepare", choices=["parent", "child"], default=None)
    args = parser.parse_args()
    if args.child and args.prepare:
        _prepare(args.child, args.prepare == "parent")
        return
    if args.child:
        child(args.child, args.mode)
        return
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        root = Path(tmp)
        corpus = write_corpus(SHARED, root / "src", args.mb)
        config = write_config(root, corpus["sources"], workers=2)
        env = env_for(root)
        _run(env, "--child", str(config), "--prepare", "parent")
        added = append_one_percent(corpus["sources"])
        _run(env, "--child", str(config), "--prepare", "child")
        _run(env, "--child", str(config), "--mode", "full")  # warm-up: the new chunk's signatures
        runs: dict[str, list[dict]] = {"incremental": [], "full": []}
        for _ in range(args.repeat):
            for mode in runs:
                runs[mode].append(_run(env, "--child", str(config), "--mode", mode))
        report(corpus, added, runs)


def report(corpus: dict, added: int, runs: dict[str, list[dict]]) -> None:
    digests = {r["digest"] for rs in runs.values() for r in rs}
    cpu = {m: statistics.median(r["cpu"] for r in rs) for m, rs in runs.items()}
    wall = {m: statistics.median(r["wall"] for r in rs) for m, rs in runs.items()}
    print(f"corpus {corpus['jsonl_bytes'] / 1e6:.0f} MB JSONL, child adds {added:,} documents")
    for mode, rs in runs.items():
        print(f"{mode:>12}: cpu {cpu[mode]:7.2f} s  wall {wall[mode]:7.2f} s  run {rs[-1]['run']}")
    print(f"incremental / full CPU: {cpu['incremental'] / cpu['full']:.2f} (median of {len(rs)})")
    print(f"same index digest in every run: {len(digests) == 1}")


if __name__ == "__main__":
    main()
