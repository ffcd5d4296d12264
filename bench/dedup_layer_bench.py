"""The whole dedup_clusters layer at three corpus sizes: wall time and peak RSS, each in a child.

Synthetic English-like corpora (seeded): documents of ~170 words (~1 KB) drawn from a Zipf-like
5,000-word vocabulary, written as zstd JSONL objects of 20,000 documents; 5% are exact copies,
10% are near copies (1-3 words changed, Jaccard ~0.9-0.97). For each size the raw and canonical
layers are built first (not measured), then ``dedup_clusters`` runs in a fresh child process
whose ``VmHWM`` is its peak RSS, twice: cold (every signature hashed) and warm (a second
partition over the same objects: signatures reused from the per-chunk cache, banding and
verification redone). The named baseline is the child's RSS right after imports (the floor any
layer pays); the figure to watch is peak minus that floor, per document, as the corpus grows.

Usage: .venv/bin/python bench/dedup_layer_bench.py [--sizes 20000,80000,320000] [--workers 2]
"""

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zstandard

OBJECT_DOCS = 20_000


def _vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(5000)]


def write_corpus(root: Path, docs: int, seed: int = 7) -> None:
    rng = random.Random(seed)
    vocab = _vocabulary(rng)
    weights = [1 / (rank + 1) for rank in range(len(vocab))]
    texts: list[str] = []
    for _ in range(docs):
        roll = rng.random()
        if texts and roll < 0.05:
            texts.append(rng.choice(texts))
        elif texts and roll < 0.15:
            words = rng.choice(texts).split(" ")
            for _ in range(rng.randint(1, 3)):
                words[rng.randrange(len(words))] = rng.choice(vocab)
            texts.append(" ".join(words))
        else:
            texts.append(" ".join(rng.choices(vocab, weights, k=170)))
    root.mkdir(parents=True, exist_ok=True)
    compressor = zstandard.ZstdCompressor(level=3)
    for part, start in enumerate(range(0, docs, OBJECT_DOCS)):
        lines = "".join(
            json.dumps({"id": f"d{n}", "text": texts[n]}) + "\n"
            for n in range(start, min(start + OBJECT_DOCS, docs))
        )
        (root / f"part-{part:05d}.jsonl.zst").write_bytes(compressor.compress(lines.encode()))


def _status_kb() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def child(config: str, partition: str, prepare: bool) -> None:
    from corpus_assets.core.pipeline import BUILDERS
    from corpus_assets.core.runtime.workspace import open_workspace

    with open_workspace(config) as ws:
        if prepare:
            for layer in ("raw_snapshot", "canonical_records"):
                BUILDERS[layer](ws, partition)
            print(json.dumps({}))
            return
        floor = _status_kb()["VmRSS"]
        start = time.perf_counter()
        result = BUILDERS["dedup_clusters"](ws, partition)
        seconds = time.perf_counter() - start
        print(
            json.dumps(
                {
                    "seconds": seconds,
                    "peak_kb": _status_kb()["VmHWM"],
                    "floor_kb": floor,
                    "counts": result.counts,
                    "run": result.run_stats,
                }
            )
        )


def run_child(config: Path, partition: str, prepare: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", str(config), "--partition", partition]
    if prepare:
        cmd.append("--prepare")
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="20000,80000,320000")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--child", default=None)
    parser.add_argument("--partition", default="p1")
    parser.add_argument("--prepare", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.partition, args.prepare)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"dedup_clusters layer, synthetic ~1 KB documents, workers={args.workers}")
    print(f"{'docs':>9} {'MB':>6} {'run':>5} {'seconds':>8} {'docs/s':>8} {'peak MB':>8}", end="")
    print(f" {'floor MB':>8} {'above floor':>11} {'B/doc':>6} {'hashed':>8} {'near':>6}")
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for docs in sizes:
            root = Path(tmp) / f"n{docs}"
            write_corpus(root / "src", docs)
            megabytes = sum(p.stat().st_size for p in (root / "src").iterdir()) / 1e6
            config = root / "corpus.yaml"
            config.write_text(
                f"version: 1\npurpose: bench\nstorage: {{home: {root / 'home'}}}\n"
                f"sources:\n  - {{id: synth, kind: objects, path: {root / 'src'}}}\n"
                f"execution: {{workers: {args.workers}}}\n"
            )
            for partition, label in (("p1", "cold"), ("p2", "warm")):
                run_child(config, partition, prepare=True)
                m = run_child(config, partition)
                above = (m["peak_kb"] - m["floor_kb"]) / 1024
                print(
                    f"{docs:>9,d} {megabytes:>6.1f} {label:>5} {m['seconds']:>8.2f}"
                    f" {docs / m['seconds']:>8,.0f} {m['peak_kb'] / 1024:>8.0f}"
                    f" {m['floor_kb'] / 1024:>8.0f} {above:>11.0f}"
                    f" {above * 1048576 / docs:>6.0f} {m['run'].get('signatures_hashed', 0):>8,d}"
                    f" {m['counts']['near_duplicates']:>6,d}"
                )
    print("(MB = compressed source size; peak = VmHWM of the child running only dedup_clusters)")


if __name__ == "__main__":
    main()
