"""Split assignment at scale: a first build and a child with 1 % new records, against a sort.

Generates N members in components of 1-4 records (record ids, component names, sha256 content
keys as Arrow strings), then times, in the same run, median of ``--repeats``:

- baseline ``arrow sort``: ``Table.sort_by("record_id")`` of the members (the least an
  assignment that returns its rows in record order can do);
- ``first build``: ``splits.assign.assign`` with no parent (every component hashed);
- ``child +1 %``: the same members plus 1 % new ones, the first build as parent (inheritance
  by join, only new components hashed), then the residual check on the leakage graph.

Peak RSS (``ru_maxrss``) is printed with the size of the member arrays: the assignment joins
and hashes in DuckDB (capped, spilling), never a Python object per record.

Usage: uv run python bench/splits_bench.py [--records 10000000] [--repeats 3]
"""

import argparse
import resource
import statistics
import time

import numpy as np
import pyarrow as pa

from corpus_assets.core.runtime.config import SplitPolicy
from corpus_assets.core.training_view.splits.assign import assign
from corpus_assets.core.training_view.splits.bridges import LeakageGraph
from corpus_assets.core.training_view.splits.residual import resolve_residual
from corpus_assets.core.training_view.splits.schema import SPLIT_TABLE


def members_table(n: int, seed: int, prefix: str) -> pa.Table:
    """n members, component sizes 1-4, hex content keys; built with numpy, not Python lists."""
    rng = np.random.default_rng(seed)
    component = np.cumsum(rng.integers(0, 2, n) * (rng.integers(0, 4, n) == 0)) + 1
    ids = np.char.add(f"{prefix}/".encode(), np.arange(n).astype("S12"))
    keys = np.char.add(b"sha256:", _hex(rng, n))
    names = np.char.add(f"{prefix}-c".encode(), component.astype("S12"))
    return pa.table(
        {
            "record_id": pa.array(ids).cast(pa.string()),
            "component": pa.array(names).cast(pa.string()),
            "content_key": pa.array(keys).cast(pa.string()),
            "event_time": pa.nulls(n, pa.string()),
        }
    )


def _hex(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random 64-digit hex strings (as fixed-width bytes), vectorised."""
    raw = np.frombuffer(rng.bytes(32 * n), np.uint8).reshape(n, 32)
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    out = np.empty((n, 64), np.uint8)
    out[:, 0::2], out[:, 1::2] = digits[raw >> 4], digits[raw & 15]
    return out.view("S64").ravel()


def graph_of(members: pa.Table) -> LeakageGraph:
    n = len(members)
    clusters = pa.table(
        {
            "record_id": members["record_id"],
            "group_id": members["component"],
            "leakage_id": members["component"],
            "verdict": pa.repeat(pa.scalar("keep"), n),
            "representative_id": members["record_id"],
            "is_representative": pa.repeat(pa.scalar(True), n),
        }
    )
    edges = pa.table({"record_a": pa.array([], pa.string()), "record_b": pa.array([], pa.string())})
    return LeakageGraph(clusters, edges)


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    policy = SplitPolicy(salt="bench")
    old = members_table(args.records, 1, "old")
    new = members_table(args.records // 100, 2, "new")
    child = pa.concat_tables([old, new])
    graph = graph_of(child)
    print(f"members: {args.records:,} + {len(new):,} new; arrays {child.nbytes / 2**20:.0f} MiB")
    floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS after generating the inputs: {floor:.0f} MiB")

    base, _ = timed(lambda: old.sort_by("record_id"), args.repeats)
    first_s, first = timed(lambda: assign(old, SPLIT_TABLE.empty_table(), policy), args.repeats)
    parent = first.table
    child_s, result = timed(
        lambda: resolve_residual(assign(child, parent, policy, graph=graph), graph), args.repeats
    )
    assert result.moves.num_rows == 0 and not result.conflicts, "pure additions moved records"
    assert result.table.num_rows == len(child)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{'arrow sort (baseline)':<28}{base:8.2f} s   1.00x")
    print(f"{'first build':<28}{first_s:8.2f} s  {first_s / base:5.2f}x")
    print(f"{'child +1 % (with residual)':<28}{child_s:8.2f} s  {child_s / base:5.2f}x")
    print(f"peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
