"""Benchmark decontamination throughput against the floor of NFC + word split.

Builds a ``BenchmarkIndex`` from N benchmark items sampled from the shared corpora (half
20-60-word passages of python-docs, half whole fortunes: short English, Chinese and Russian texts,
so both word and character n-grams are in play), then times over a real corpus (licenses +
fortunes), in the same run, median of ``--repeats``:

- baseline: ``unicodedata.normalize("NFC", text).split()`` per record, the least any n-gram
  method does;
- ``match_many`` over chunks of ``--chunk`` records (what a layer would call);
- ``match`` per record.

Exits non-zero on a wrong result: ``match`` and ``match_many`` disagree, a sampled fortune is
not found in its own record, or a brute-force containment check over ``--verify`` random records
disagrees with the index.

Usage: .venv/bin/python bench/contamination_bench.py [--items 1000] [--repeats 3]
"""

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path

from corpus_assets.core.records.contamination import (
    ContaminationPolicy,
    Match,
    char_ngrams,
    containment_ppm,
    normalise,
    word_ngrams,
)
from corpus_assets.core.records.contamination_index import BenchmarkIndex

DEFAULT_CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"


def read_texts(folder: Path) -> list[str]:
    texts = []
    for shard in sorted(folder.glob("*.jsonl.zst")):
        raw = subprocess.run(["zstd", "-dc", str(shard)], check=True, capture_output=True).stdout
        texts.extend(json.loads(line)["text"] for line in raw.decode("utf-8").splitlines())
    if not texts:
        sys.exit(f"no *.jsonl.zst shards in {folder}")
    return texts


def sample_items(
    docs: list[str], fortunes: list[str], n: int, rng: random.Random
) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """Benchmark items, and for each sampled fortune the index of its source record."""
    items = []
    for k in range(n // 2):
        words = rng.choice(docs).split()
        size = rng.randint(20, 60)
        at = rng.randrange(max(1, len(words) - size))
        items.append((f"docs/{k:05d}", " ".join(words[at : at + size])))
    sources = {}
    for k, position in enumerate(rng.sample(range(len(fortunes)), n - n // 2)):
        items.append((f"fortunes/{k:05d}", fortunes[position]))
        sources[f"fortunes/{k:05d}"] = position
    return items, sources


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def brute_force(
    grams: list[tuple[str, str, set[str]]], text: str, policy: ContaminationPolicy
) -> Match | None:
    record = normalise(text)
    sets = {
        "word": word_ngrams(record, policy.ngram_words),
        "char": char_ngrams(record, policy.ngram_chars),
    }
    best = None
    for item_id, mode, item_grams in grams:  # sorted by id: the first of equals wins
        ppm = containment_ppm(item_grams, sets[mode])
        if ppm >= policy.threshold_ppm and (best is None or ppm > best.containment_ppm):
            best = Match(item_id, ppm)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", type=Path, default=DEFAULT_CORPORA)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=10_000, help="records per match_many call")
    parser.add_argument("--verify", type=int, default=200, help="records checked by brute force")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    docs = read_texts(args.corpora / "python-docs")
    fortunes = read_texts(args.corpora / "fortunes")
    licenses = read_texts(args.corpora / "licenses")
    corpus = licenses + fortunes
    megabytes = sum(len(t.encode("utf-8")) for t in corpus) / 1e6
    policy = ContaminationPolicy()

    items, sources = sample_items(docs, fortunes, args.items, rng)
    started = time.perf_counter()
    index = BenchmarkIndex.build(items, policy)
    build = time.perf_counter() - started
    modes = [index.mode(item_id) for item_id, _ in items]
    print(
        f"index: {len(index)} items ({modes.count('word')} word, {modes.count('char')} char, "
        f"{len(index.unchecked)} unchecked: shorter than {policy.ngram_chars} chars) built in "
        f"{build:.2f} s, {index.nbytes / 1e6:.1f} MB; digest {index.digest[:19]}..."
    )
    print(f"corpus: licenses + fortunes, {len(corpus)} records, {megabytes:.1f} MB UTF-8")

    def baseline() -> None:
        for text in corpus:
            unicodedata.normalize("NFC", text).split()

    def many() -> list[Match | None]:
        out: list[Match | None] = []
        for lo in range(0, len(corpus), args.chunk):
            out.extend(index.match_many(corpus[lo : lo + args.chunk]))
        return out

    def single() -> list[Match | None]:
        return [index.match(text) for text in corpus]

    base, _ = timed(baseline, args.repeats)
    batched, found = timed(many, args.repeats)
    each, found_single = timed(single, args.repeats)
    assert isinstance(found, list) and isinstance(found_single, list)

    failures = []
    if found != found_single:
        failures.append("match and match_many disagree")
    offset = len(licenses)
    for item_id, position in sources.items():
        if index.mode(item_id) != "unchecked" and found[offset + position] is None:
            failures.append(f"{item_id} not found in its own record")
    grams = []
    for item_id, text in sorted(items):
        norm = normalise(text)
        mode = index.mode(item_id)
        if mode == "word":
            grams.append((item_id, mode, word_ngrams(norm, policy.ngram_words)))
        elif mode == "char":
            grams.append((item_id, mode, char_ngrams(norm, policy.ngram_chars)))
    checked = rng.sample(range(len(corpus)), min(args.verify, len(corpus)))
    checked += [offset + p for p in list(sources.values())[: args.verify // 4]]
    for position in checked:
        if brute_force(grams, corpus[position], policy) != found[position]:
            failures.append(f"record {position}: index and brute force disagree")

    matched = [m for m in found if m is not None]
    print(f"{'variant':<30} {'median s':>9} {'MB/s':>8} {'x baseline':>11}")
    for name, seconds in (
        ("NFC + split (baseline)", base),
        (f"match_many ({args.chunk} per call)", batched),
        ("match (per record)", each),
    ):
        print(f"{name:<30} {seconds:>9.3f} {megabytes / seconds:>8.1f} {seconds / base:>11.1f}")
    print(
        f"matches: {len(matched)} records ({sum(m.item_id.startswith('docs/') for m in matched)} "
        f"on python-docs passages, {len({m.item_id for m in matched})} distinct items); "
        f"brute-force check of {len(checked)} records: "
        f"{'ok' if not any('brute' in f for f in failures) else 'FAILED'}"
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MB (corpus texts held in memory included)")
    if failures:
        print("\n".join(failures[:20]), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
