"""Contamination stage throughput against the floor of tokenising the records (same run).

Registers ``--items`` benchmark items synthesised from corpora the records do not come from
(python-stdlib code passages, chat-dialogs turns, a few hundred whole fortunes so some records
do match, half of them short enough to be checked whole), then screens the real records of
fortunes + licenses + python-docs with ``BenchmarkIndex.match_many`` over chunks of ``--chunk``
records, the layer's call. One process, so MB per CPU-second is per core (wall MB/s too);
medians of ``--repeats``; the ratio ``x floor`` is of CPU time, the floor being the reference
tokenisation alone (NFKC, casefold, ``\\w+`` runs), which any screen of these records pays.

Exits non-zero when the index disagrees with its reference definition (``reference_match``) on
``--verify`` sampled records, or a registered fortune is not found in its own record.

Usage: .venv/bin/python bench/contamination.py [--items 3000] [--repeats 3]
"""

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from corpus_assets.core.records.contamination import BenchmarkIndex, Match, TokenPolicy
from corpus_assets.core.records.contamination.rules import (
    UNCHECKED,
    normalise,
    plan,
    reference_match,
    tokens,
)

DEFAULT_CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"


def read_texts(folder: Path) -> list[str]:
    texts = []
    for shard in sorted(folder.glob("*.jsonl.zst")):
        raw = subprocess.run(["zstd", "-dc", str(shard)], check=True, capture_output=True).stdout
        texts.extend(json.loads(line)["text"] for line in raw.decode("utf-8").splitlines())
    if not texts:
        sys.exit(f"no *.jsonl.zst shards in {folder}")
    return texts


def passages(texts: list[str], n: int, rng: random.Random, prefix: str) -> list[tuple[str, str]]:
    """``n`` passages of 5-60 whitespace words (so some are below 13 tokens)."""
    out = []
    for k in range(n):
        words = rng.choice(texts).split()
        size = rng.randint(5, 60)
        at = rng.randrange(max(1, len(words) - size))
        out.append((f"{prefix}/{k:05d}", " ".join(words[at : at + size])))
    return out


def timed(
    fn: Callable[[], list[Match | None]], repeats: int
) -> tuple[float, float, list[Match | None]]:
    """Median wall and CPU seconds (CPU time is the per-core figure on a shared machine)."""
    walls, cpus, result = [], [], []
    for _ in range(repeats):
        started, cpu = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", type=Path, default=DEFAULT_CORPORA)
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--fortune-items", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=4096, help="records per match_many call")
    parser.add_argument("--verify", type=int, default=300, help="records checked by reference")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    rng = random.Random(args.seed)
    fortunes = read_texts(args.corpora / "fortunes")
    records = fortunes + read_texts(args.corpora / "licenses")
    records += read_texts(args.corpora / "python-docs")
    rest = args.items - args.fortune_items
    items = passages(read_texts(args.corpora / "python-stdlib"), rest // 2, rng, "code")
    items += passages(read_texts(args.corpora / "chat-dialogs"), rest - rest // 2, rng, "chat")
    chosen = rng.sample(range(len(fortunes)), args.fortune_items)
    items += [(f"fortune/{k:05d}", fortunes[p]) for k, p in enumerate(chosen)]
    names = {item_id: item_id.split("/")[0] for item_id, _ in items}
    megabytes = sum(len(t.encode("utf-8")) for t in records) / 1e6
    print(f"records: fortunes + licenses + python-docs, {len(records):,}, {megabytes:.1f} MB")

    seconds, cpu, _ = timed(lambda: [None for _ in map(tokens, records)], args.repeats)
    rows = [("tokenise (floor)", seconds, cpu)]
    found: dict[str, list[Match | None]] = {}
    for name, policy in (("v2", TokenPolicy()),):
        started = time.perf_counter()
        index = BenchmarkIndex.build(items, policy, names)
        build = time.perf_counter() - started

        def screen(index: BenchmarkIndex = index) -> list[Match | None]:
            out: list[Match | None] = []
            for lo in range(0, len(records), args.chunk):
                out.extend(index.match_many(records[lo : lo + args.chunk]))
            return out

        seconds, cpu, found[name] = timed(screen, args.repeats)
        report = index.report({})
        short = sum(r["short_items"] for r in report)
        whole = sum(r["checked_whole"] for r in report)
        unchecked = sum(r["unchecked"] for r in report)
        flagged = sum(m is not None for m in found[name])
        print(
            f"{name}: {len(index)} items ({short} short: {whole} whole, {unchecked} unchecked), "
            f"index built in {build:.2f} s, {index.nbytes / 1e6:.1f} MB; {flagged:,} flagged"
        )
        rows.append((name, seconds, cpu))

    failures = check(found["v2"], records, items, chosen, rng, args.verify)
    base = rows[0][2]
    head = f"{'wall s':>7} {'CPU s':>7} {'MB/s wall':>10} {'MB/CPU-s':>9} {'x floor':>7}"
    print(f"{'variant':<16} {head}")
    for name, seconds, cpu in rows:
        print(
            f"{name:<16} {seconds:>7.3f} {cpu:>7.3f} {megabytes / seconds:>10.1f} "
            f"{megabytes / cpu:>9.1f} {cpu / base:>7.2f}"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MB (the corpora's texts held in memory included)")
    if failures:
        print("\n".join(failures[:20]), file=sys.stderr)
        sys.exit(1)


def check(
    found: list[Match | None],
    records: list[str],
    items: list[tuple[str, str]],
    chosen: list[int],
    rng: random.Random,
    verify: int,
) -> list[str]:
    """The index against its reference on sampled records and every registered fortune."""
    failures = []
    policy = TokenPolicy()
    positions = rng.sample(range(len(records)), verify) + chosen[: verify // 4]
    for p in positions:
        got = found[p]
        expected = reference_match(items, records[p], policy)
        if (got and (got.item_id, got.containment_ppm)) != (
            expected and (expected.item_id, expected.containment_ppm)
        ):
            failures.append(f"record {p}: index {got} != reference {expected}")
    for p in chosen:
        if found[p] is None and plan(normalise(records[p]), policy)[1] != UNCHECKED:
            failures.append(f"fortune record {p} not flagged by its own item")
    print(f"reference check of {len(positions)} records: {'ok' if not failures else 'FAILED'}")
    return failures


if __name__ == "__main__":
    main()
