"""Canonicalisation throughput per core on the shared corpora, against a json.loads + NFC loop.

Both variants read the same decompressed lines held in memory (decompression is not timed), in
the same run, median of ``--repeats``, timed in CPU seconds of this process (``process_time``:
a shared machine's other load does not count against us, as wall time would):

- baseline ``json.loads + NFC``: parse each line and NFC-normalise its text (the least any
  canonicaliser must do);
- ours: ``parse_line`` + ``canonical_record`` (adapter, normalisation, PII redaction, quality,
  text and dedup digests) + per batch of kept rows the benchmark-containment stage against
  ``--items`` benchmark items drawn from python-docs and ``finish_records`` (script, record
  digest): the layer's row path, less the Arrow columns and the Parquet write.

Prints MB of input JSONL per CPU-second for both, the ratio, records kept, and peak RSS.
One-time per-process set-up (the script and character-class tables, ~0.5 s) falls in the
first repeat of the first corpus, so the medians leave it out.
Usage: uv run python bench/canonical_bench.py [--corpora ../shared/corpora] [--repeats 3]
"""

import argparse
import json
import resource
import statistics
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path

import zstandard

from corpus_assets.core.records.canonicalize import (
    Excluded,
    Stages,
    canonical_record,
    contaminated,
    finish_records,
    parse_line,
)
from corpus_assets.core.records.contamination import BenchmarkIndex, TokenPolicy
from corpus_assets.core.records.kept import BATCH_ROWS
from corpus_assets.core.records.quality import QualityPolicy
from corpus_assets.core.runtime.config import ObjectsSource

CORPORA = {
    "fortunes": {},
    "chat-dialogs": {"adapter": "chat-messages.v1", "messages_field": "meta.messages"},
    "licenses": {},
    "python-stdlib": {"content": "code"},
    "python-docs": {},
}


def lines_of(folder: Path) -> list[bytes]:
    lines: list[bytes] = []
    for path in sorted(folder.glob("*.jsonl.zst")):
        lines += zstandard.decompress(path.read_bytes()).splitlines()
    return lines


def baseline(lines: list[bytes]) -> int:
    kept = 0
    for raw in lines:
        text = json.loads(raw)["text"]
        kept += bool(unicodedata.normalize("NFC", text))
    return kept


def ours(source: ObjectsSource, lines: list[bytes], index: BenchmarkIndex) -> int:
    """The layer's row path: ``canonical_record`` per row, then per batch of ``BATCH_ROWS``
    (as ``KeptRecords`` does) the containment screen and ``finish_records`` (scripts and
    record digests of the batch at once)."""
    stages = Stages("bench", QualityPolicy(), index)
    records: list[dict] = []
    kept = 0
    for n, raw in enumerate(lines, start=1):
        try:
            records.append(canonical_record(source, "bench", n, parse_line(raw), stages))
        except Excluded:
            continue
        if len(records) >= BATCH_ROWS:
            kept += _finish(index, records)
            records = []
    return kept + _finish(index, records)


def _finish(index: BenchmarkIndex, records: list[dict]) -> int:
    hits = contaminated(index, [r["text"] for r in records])
    records = [r for n, r in enumerate(records) if n not in hits]
    finish_records(records)
    return len(records)


def median_seconds(fn: Callable[[], int], repeats: int) -> tuple[float, int]:
    times, result = [], 0
    for _ in range(repeats):
        started = time.process_time()
        result = fn()
        times.append(time.process_time() - started)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--corpora", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "corpora"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--items", type=int, default=200)
    args = parser.parse_args()
    if not args.corpora.is_dir():
        raise SystemExit(f"no corpora at {args.corpora}")
    docs = [json.loads(x)["text"] for x in lines_of(args.corpora / "python-docs")]
    items = [(f"docs/{n}", " ".join(t.split()[:60])) for n, t in enumerate(docs[: args.items])]
    index = BenchmarkIndex.build(items, TokenPolicy())
    print(
        f"{'corpus':<14} {'MB':>6} {'baseline MB/cpu-s':>18} {'ours MB/cpu-s':>14} {'ratio':>6}"
        f" {'kept':>7}"
    )
    total_mb = total_base = total_ours = 0.0
    for name, fields in CORPORA.items():
        lines = lines_of(args.corpora / name)
        mb = sum(len(x) + 1 for x in lines) / 1e6
        source = ObjectsSource(id=name.replace("-", "_"), kind="objects", path=".", **fields)
        base, _ = median_seconds(lambda lines=lines: baseline(lines), args.repeats)
        mine, kept = median_seconds(
            lambda lines=lines, source=source: ours(source, lines, index), args.repeats
        )
        total_mb, total_base, total_ours = total_mb + mb, total_base + base, total_ours + mine
        rates = f"{mb / base:>18.1f} {mb / mine:>14.1f} {mine / base:>6.1f}"
        print(f"{name:<14} {mb:>6.1f} {rates} {kept:>7}")
    rates = f"{total_mb / total_base:>18.1f} {total_mb / total_ours:>14.1f}"
    print(f"{'all':<14} {total_mb:>6.1f} {rates} {total_ours / total_base:>6.1f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MB (corpora held in memory); {len(index)} benchmark items")


if __name__ == "__main__":
    main()
