"""MinHash signature throughput on ~1 KB English documents: datasketch against ours, same run.

Documents: paragraphs of the shared python-docs and licenses corpora packed into ~1 KB pieces
(cut at a space), or synthetic English when ``--corpora`` is absent. Rows (medians of
``--repeats``, docs/s and MB/s of UTF-8 text):

- baseline ``datasketch MinHash.bulk`` with its default scheme (affine32 + sha1_hash32), with
  the shingles given (shingling not timed), and end to end (our ``shingles`` + bulk);
- ours ``signatures`` end to end from ``str`` for ``minhash.v2``, and v2
  ``sketch`` (signatures + sorted fingerprints); ``minhash.v3`` ``signatures_and_modes`` (what
  the v3 signature cache computes; on spaced text it must cost what v2 does).

Before timing, v2 is checked bit for bit against datasketch (affine32 with our v2 hash) on a
sample; a mismatch exits non-zero. Prints the ratios, whether v2 meets
the 12 MB/s target, and the peak RSS.
Usage: .venv/bin/python bench/minhash_bench.py [--corpora ../shared/corpora] [--docs 5000]
"""

import argparse
import json
import random
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from datasketch import MinHash

from corpus_assets.core.dedup.minhash import (
    SignatureSpec,
    shingles,
    signatures,
    signatures_and_modes,
    sketch,
)
from corpus_assets.core.dedup.minhash.shingling import shingle_units
from corpus_assets.core.dedup.minhash.unit_hash import fingerprint64_units

TARGET_MBPS = 12.0
_SYNTH_TEXT = (
    "the of and to in is that for it as with was on be by this are or from at which an not have "
    "data file value return error function module license copyright software permission notice "
    "python object method class string list dictionary argument default option system program "
    "without warranty any person obtaining copy distribute modify merge publish sublicense"
)


def _pack(paragraphs, pieces: list[str], n: int, size: int) -> None:
    """Pack paragraphs into pieces of ~``size`` characters, cutting at a space."""
    buf = ""
    for para in paragraphs:
        buf = f"{buf}\n\n{para}" if buf else para
        while len(buf) >= size and len(pieces) < n:
            cut = buf.rfind(" ", size // 2, size)
            cut = size if cut <= 0 else cut
            pieces.append(buf[:cut])
            buf = buf[cut:].lstrip()
        if len(pieces) >= n:
            return


def load_pieces(corpora: Path, n: int, size: int = 1024) -> tuple[list[str], str]:
    """~``size``-character English pieces: shared corpora if present, else synthetic."""
    shards = [
        shard
        for name in ("python-docs", "licenses")
        for shard in sorted((corpora / name).glob("*.jsonl.zst"))
    ]
    pieces: list[str] = []
    if shards:
        import zstandard

        # Interleave the two corpora so a small --docs still mixes both.
        texts: list[list[str]] = []
        for shard in shards:
            with zstandard.open(shard, "rt", encoding="utf-8") as fh:
                texts.append([json.loads(line)["text"] for line in fh])
        paragraphs = (
            para.strip()
            for group in zip(*texts, strict=False)
            for text in group
            for para in text.split("\n\n")
            if para.strip()
        )
        _pack(paragraphs, pieces, n, size)
        return pieces, f"{corpora}/{{python-docs,licenses}}"
    rng = random.Random(0)
    words = _SYNTH_TEXT.split()
    sentences = (
        " ".join(rng.choice(words) for _ in range(rng.randrange(6, 25))).capitalize() + "."
        for _ in range(40 * n)
    )
    _pack(sentences, pieces, n, size)
    return pieces, "synthetic English (no corpora)"


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check(docs: list[str], v2: SignatureSpec) -> None:
    """Bit-for-bit against datasketch on a sample; exits non-zero on a mismatch."""
    sample = docs[:: max(1, len(docs) // 200)]
    ours2 = signatures(sample, v2)

    def hv(units: tuple[str, ...]) -> int:
        return fingerprint64_units(units) >> 32

    ref2 = MinHash.bulk(
        [shingle_units(d, v2) for d in sample],
        num_perm=v2.num_perm,
        seed=v2.seed,
        scheme="affine32",
        hashfunc=hv,
    )
    ok2 = np.array_equal(ours2, np.array([m.hashvalues for m in ref2], dtype=np.uint32))
    print(f"check vs datasketch on {len(sample)} docs: v2 {ok2}")
    if not ok2:
        sys.exit(1)


def interleaved(docs: list[str], v2: SignatureSpec, v3: SignatureSpec, pairs: int = 21) -> float:
    """Median over back-to-back (v2, v3) runs of v3's time over v2's: a loaded machine drifts
    between the rows above, not within a pair."""
    ratios = []
    for _ in range(pairs):
        t0 = time.perf_counter()
        signatures(docs, v2)
        t1 = time.perf_counter()
        signatures_and_modes(docs, v3)
        ratios.append((time.perf_counter() - t1) / (t1 - t0))
    return statistics.median(ratios)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpora", type=Path, default=Path("../shared/corpora"))
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    v2 = SignatureSpec(version="minhash.v2")
    v3 = SignatureSpec(version="minhash.v3")
    docs, origin = load_pieces(args.corpora, args.docs)
    mb = sum(len(d.encode()) for d in docs) / 1e6
    sh = [shingles(d, v2) for d in docs]
    n_sh = sum(map(len, sh))
    print(f"{len(docs)} docs from {origin}: {mb:.2f} MB, {mb * 1e6 / len(docs):.0f} B/doc,")
    print(f"  {n_sh / len(docs):.0f} shingles/doc, num_perm {v2.num_perm}, {args.repeats} repeats")
    check(docs, v2)

    rows = [
        ("baseline: MinHash.bulk (shingles given)", lambda: MinHash.bulk(sh, num_perm=128, seed=1)),
        (
            "baseline: shingles + MinHash.bulk",
            lambda: MinHash.bulk([shingles(d, v2) for d in docs], num_perm=128, seed=1),
        ),
        ("ours minhash.v2 signatures", lambda: signatures(docs, v2)),
        ("ours minhash.v2 sketch (+fingerprints)", lambda: sketch(docs, v2)),
        ("ours minhash.v3 signatures + modes", lambda: signatures_and_modes(docs, v3)),
    ]
    results = {}
    for name, fn in rows:
        t = median_time(fn, args.repeats)
        results[name] = t
        print(f"{name:40s} {len(docs) / t:9.0f} docs/s {mb / t:8.2f} MB/s  ({t:.3f} s)")
    v2_t = results["ours minhash.v2 signatures"]
    for name in (rows[0][0], rows[1][0]):
        print(f"ratio v2 signatures vs {name}: {results[name] / v2_t:.2f}x")
    print(f"v3/v2 time on this spaced text, interleaved pairs: {interleaved(docs, v2, v3):.3f}")
    verdict = "PASS" if mb / v2_t >= TARGET_MBPS else "FAIL"
    print(f"v2 signatures {mb / v2_t:.2f} MB/s vs target {TARGET_MBPS:.0f} MB/s: {verdict}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
