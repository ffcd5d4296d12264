"""Time registering N benchmark items (default 8,000) on SQLite and PostgreSQL.

For each backend, in fresh catalogs (with ``--aliases`` gate rows to fence), median of
``--repeats``:

- baseline ``per-row``: the earlier registration, one ``INSERT ... RETURNING`` per item
  in one transaction (kept here as the named baseline);
- ``register``: ``governance.benchmarks.register``, one executemany per 1,000 rows after one
  batched look-up of what is already active;
- ``again``: the same file registered a second time (idempotent: reads only, writes nothing);
- ``cli read``: what ``benchmark add`` does before the catalog: read the JSONL and put each text
  in a fresh CAS (every text an fsynced file and folder), one put at a time (the baseline, as
  before) and ``PUT_THREADS`` at a time.

Exits non-zero if a registration leaves other than N active items or the second one writes.
Peak RSS is the process's ``ru_maxrss``.

Usage: .venv/bin/python bench/registry_bench.py [--items 8000] [--repeats 3] [--aliases 3]
"""

import argparse
import json
import resource
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import insert

from corpus_assets.core.records import benchmark_file, benchmarks, gate
from corpus_assets.core.records.benchmark_file import read_items
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, benchmark_items
from corpus_assets_tests.conftest import PG_URL
from corpus_assets_tests.conftest import _admin as admin  # the tests' own database admin


def per_row(catalog: Catalog, name: str, items: list[benchmarks.BenchmarkItem]) -> int:
    """The baseline: registration as it was, one INSERT ... RETURNING per item."""
    with catalog.begin() as conn:
        gate.lock_registrations(conn)
        seq = 0
        for item in sorted(set(items), key=lambda i: i.item_id):
            seq = conn.execute(
                insert(benchmark_items)
                .values(
                    benchmark=name,
                    item_id=item.item_id,
                    text_digest=item.text_digest,
                    dedup_key=item.dedup_key,
                    at=time.time(),
                )
                .returning(benchmark_items.c.seq)
            ).scalar_one()
        gate.fence_every_alias(conn, "benchmark_fence", seq)
    return seq


@contextmanager
def fresh_catalog(backend: str, tmp: Path, aliases: int) -> Iterator[Catalog]:
    if backend == "sqlite":
        url = f"sqlite:///{tmp / f'{uuid.uuid4().hex}.sqlite'}"
    else:
        name = f"registry_bench_{uuid.uuid4().hex[:10]}"
        admin(f'CREATE DATABASE "{name}"')
        url = f"{PG_URL}/{name}"
    catalog = Catalog(url)
    try:
        for n in range(aliases):
            gate.read_alias_gate(catalog, f"alias{n}")
        yield catalog
    finally:
        catalog.dispose()
        if backend == "postgresql":
            admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def write_file(path: Path, n: int) -> None:
    with path.open("w") as out:
        for i in range(n):
            text = f"Question {i}: what is {i} times {i + 7}, and why does it matter here?"
            out.write(json.dumps({"id": f"q{i}", "text": text}) + "\n")


def bench_backend(backend: str, items: list, args: argparse.Namespace, tmp: Path) -> dict:
    times: dict[str, list[float]] = {"per-row": [], "register": [], "again": []}
    for _ in range(args.repeats):
        with fresh_catalog(backend, tmp, args.aliases) as catalog:
            times["per-row"].append(timed(lambda c=catalog: per_row(c, "quiz", items)))
        with fresh_catalog(backend, tmp, args.aliases) as catalog:
            times["register"].append(timed(lambda c=catalog: benchmarks.register(c, "quiz", items)))
            change = None

            def again(c: Catalog = catalog) -> None:
                nonlocal change
                change = benchmarks.register(c, "quiz", items)

            times["again"].append(timed(again))
            with catalog.begin() as conn:
                active = len(benchmarks.active_items(conn, None))
            if active != len(items) or change is None or change.written:
                raise SystemExit(f"{backend}: {active} active, second registration {change}")
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--aliases", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        source = tmp / "quiz.jsonl"
        write_file(source, args.items)
        reads: dict[int, list[float]] = {1: [], benchmark_file.PUT_THREADS: []}
        for n in range(args.repeats):
            for threads, runs in reads.items():
                cas = ContentStore(tmp / f"cas{n}-{threads}")
                benchmark_file.PUT_THREADS = threads
                runs.append(timed(lambda c=cas: read_items(c, "quiz", source, "text")))
        items = read_items(ContentStore(tmp / "cas0-1"), "quiz", source, "text")
        print(f"{args.items} items, {args.aliases} aliases, median of {args.repeats}")
        one, many = (statistics.median(runs) for runs in reads.values())
        print(
            f"cli read (JSONL + CAS put of every text, fresh CAS): one put at a time (baseline) "
            f"{one:.2f} s, {max(reads)} at a time {many:.2f} s ({one / many:.1f}x)"
        )
        print("| backend | per-row (baseline) s | register s | speed-up | again (idempotent) s |")
        print("|---|---:|---:|---:|---:|")
        for backend in ("sqlite", "postgresql"):
            t = bench_backend(backend, items, args, tmp)
            print(
                f"| {backend} | {t['per-row']:.2f} | {t['register']:.2f} | "
                f"{t['per-row'] / t['register']:.1f}x | {t['again']:.2f} |"
            )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MB")


if __name__ == "__main__":
    main()
