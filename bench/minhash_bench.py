"""MinHash signature throughput: ``signatures`` against datasketch ``MinHash.bulk``, same run.

Documents are ~1 KB pieces of python-docs text (cut at the last space before 1,024 characters).
Shingling is done once, outside the timing, and both sides hash the same shingles: ours is timed
as ``signatures`` end to end (shingling included, so it is the conservative side) and also as
sha1 + permutation only; datasketch as ``MinHash.bulk(shingles, num_perm, seed, scheme="legacy")``
(the scheme ``minhash.v1`` reproduces bit for bit). Median of ``--repeats``; prints docs/s, MB/s
of text, the ratio and peak RSS.
Usage: .venv/bin/python bench/minhash_bench.py [--corpora ../shared/corpora] [--docs 5000]
"""

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import numpy as np
import zstandard
from datasketch import MinHash

from corpus_assets.core import minhash as mh
from corpus_assets.core.minhash import SignatureSpec, shingles, signatures


def load_pieces(corpora: Path, n: int, size: int = 1024) -> list[str]:
    pieces: list[str] = []
    for shard in sorted((corpora / "python-docs").glob("*.jsonl.zst")):
        with zstandard.open(shard, "rt", encoding="utf-8") as fh:
            for line in fh:
                text = json.loads(line)["text"]
                while len(text) > size // 2 and len(pieces) < n:
                    cut = text.rfind(" ", 0, size)
                    cut = size if cut <= 0 else cut
                    pieces.append(text[:cut])
                    text = text[cut:]
                if len(pieces) >= n:
                    return pieces
    return pieces


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpora", type=Path, default=Path("../shared/corpora"))
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    spec = SignatureSpec()
    docs = load_pieces(args.corpora, args.docs)
    mb = sum(len(d.encode()) for d in docs) / 1e6
    sh = [shingles(d, spec) for d in docs]
    n_sh = sum(map(len, sh))
    print(f"{len(docs)} docs, {mb:.2f} MB, {n_sh} shingles ({n_sh / len(docs):.0f}/doc)")

    ours = signatures(docs, spec)
    ref = MinHash.bulk(sh, num_perm=spec.num_perm, seed=spec.seed, scheme="legacy")
    assert np.array_equal(ours, np.array([m.hashvalues for m in ref], dtype=np.uint32))

    rows = [
        ("ours signatures (incl. shingling)", lambda: signatures(docs, spec)),
        ("ours sha1+permute (shingles given)", lambda: mh._signatures_of_shingles(sh, spec)),
        (
            "datasketch MinHash.bulk (shingles given)",
            lambda: MinHash.bulk(sh, num_perm=spec.num_perm, seed=spec.seed, scheme="legacy"),
        ),
    ]
    t_shingle = median_time(lambda: [shingles(d, spec) for d in docs], args.repeats)
    results = {}
    for name, fn in rows:
        t = median_time(fn, args.repeats)
        results[name] = t
        print(f"{name:42s} {len(docs) / t:10.0f} docs/s {mb / t:8.2f} MB/s  ({t:.3f} s)")
    print(
        f"{'shingling alone':42s} {len(docs) / t_shingle:10.0f} docs/s {mb / t_shingle:8.2f} MB/s"
    )
    ds = results["datasketch MinHash.bulk (shingles given)"]
    print(f"ratio ours end-to-end / datasketch: {ds / results[rows[0][0]]:.2f}x")
    print(f"ratio ours sha1+permute / datasketch: {ds / results[rows[1][0]]:.2f}x")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
