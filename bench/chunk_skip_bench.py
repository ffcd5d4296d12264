"""How much a finished chunk costs on resume, against the floor of one ``stat`` per chunk.

A SUCCESS chunk with the same input digest and its output present must be skipped in well
under a millisecond. This builds N finished tasks in a real catalog (SQLite by
default, or ``--catalog-url``), then times, in the same run, median of ``--repeats``:

- baseline ``stat-only``: ``os.stat`` of each output object (the least a skip can do);
- ``run_chunk`` skip with the layer's successes preloaded in one query (what layers do);
- ``run_chunk`` skip without preloading (one catalog query per chunk).

Usage: uv run python bench/chunk_skip_bench.py [--chunks 10000] [--repeats 5]
"""

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.tasks import ChunkTask, preload, run_chunk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--catalog-url")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="chunk-skip-"))
    cas = ContentStore(root / "cas")
    catalog = Catalog(args.catalog_url or f"sqlite:///{root / 'catalog.sqlite'}")
    tasks = [ChunkTask("bench", f"chunk/{n}", f"sha256:{n:064x}", "v1") for n in range(args.chunks)]
    started = time.perf_counter()
    for n, task in enumerate(tasks):
        run_chunk(catalog, cas, task, lambda n=n: cas.put_bytes(f"output {n}".encode()))
    print(f"built {args.chunks} chunk tasks in {time.perf_counter() - started:.1f} s")
    outputs = [cas.path(digest) for digest, _size in preload(catalog, "bench", "v1").values()]

    def stat_only() -> None:
        for path in outputs:
            os.stat(path)

    def preloaded() -> None:
        done = preload(catalog, "bench", "v1")
        for task in tasks:
            assert run_chunk(catalog, cas, task, _never, done=done).skipped

    def per_query() -> None:
        for task in tasks[: max(1, len(tasks) // 10)]:
            assert run_chunk(catalog, cas, task, _never).skipped

    results = {}
    for name, fn, count in (
        ("stat-only (baseline)", stat_only, len(outputs)),
        ("run_chunk, preloaded", preloaded, len(tasks)),
        ("run_chunk, query per chunk", per_query, max(1, len(tasks) // 10)),
    ):
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) / count)
        results[name] = statistics.median(times)
    base = results["stat-only (baseline)"]
    print(f"{'variant':<28} {'median us/chunk':>16} {'x baseline':>11}")
    for name, seconds in results.items():
        print(f"{name:<28} {seconds * 1e6:>16.2f} {seconds / base:>11.1f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MB; catalog {catalog.url.split('@')[-1]}")


def _never() -> str:
    raise AssertionError("a finished chunk must not run again")


if __name__ == "__main__":
    main()
