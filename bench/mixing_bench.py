"""Mixing 10M candidate records: `plan_mixture` + `mix` + `report`, against named baselines.

Plan arrays (seeded, generated outside the timing, a batch at a time): N train records over four
sources with shares 50/30/15/5 %. Per source, as ``mixing.source_members`` hands them to ``mix``:
record ids ``s<j>/<i:010d>`` (sorted by record_id), content digests in the layer's
``sha256:<64 hex>`` form as an Arrow string array (uniform random 256-bit values, which is what
sha256 outputs look like, without hashing N texts), and token counts (int64, lognormal, median
~400, at least 1). No record text exists anywhere.

Timed per policy, median of ``--repeats`` in one child process: ``plan_mixture`` + ``mix`` (digest
parsing, selection, stream order, the samples table built with Arrow ``take``) + ``report``:

- ``natural``: documents, every record once;
- ``temperature``: alpha 0.5, unit tokens, budget = the population's tokens;
- ``unimax``: documents, budget = N, ``max_epochs`` 4 (the 5 % source is capped at 4 passes).

Baselines, measured in the same run:

- ``v2``: the previous implementation (git 87aa490; sha256 per record with ``hashlib``, a Python
  sort with a key lambda per pass, the stream as a Python list of tuples) on a
  ``--baseline-records`` subset (the first records of each source, same shares), with ours timed
  on the same subset; the
  per-record cost is extrapolated linearly to N (which flatters it: its sorts are n log n);
- ordering only: Arrow ``Table.sort_by([key, record_id, repeat])`` of the natural stream at N
  against ours (``stream_order``: one in-place numpy sort of the keys' top bits packed with the
  entry index, plus an Arrow sort of the entries whose top bits tie). Both orders must agree.

Each policy runs in a fresh child process (it builds its own plan arrays), so one policy's freed
but retained heap does not inflate another's peak. Memory, per policy, in MiB: the plan arrays'
Arrow/numpy buffer sizes (``plan MB``), the child's RSS once they exist (``RSS+plan``), its peak
RSS over the first (checked) run (``VmHWM`` after a reset through ``/proc/self/clear_refs``;
``ru_maxrss`` when the kernel refuses), that peak above ``RSS+plan`` (``above``), and the child's
``ru_maxrss`` after all runs (``maxrss``: freed memory the allocators keep counts there).
Exits non-zero on a wrong result (sample counts, realised amounts, positions, the order against
Arrow's) or when ``--target-seconds`` is missed at N >= 10M.

Usage: .venv/bin/python bench/mixing_bench.py [--records 10000000] [--repeats 3]
"""

import argparse
import hashlib
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.runtime.config import MixingPolicy
from corpus_assets.core.training_view.mixing.plan import Population, plan_mixture
from corpus_assets.core.training_view.mixing.select import (
    Members,
    digest_bits,
    mix,
    report,
    stream_of,
    stream_order,
)

SHARES = (0.50, 0.30, 0.15, 0.05)
BATCH = 1 << 20
HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
PREFIX = np.frombuffer(b"sha256:", dtype=np.uint8)
WIDTH = len(PREFIX) + 64


def digests(count: int, rng: np.random.Generator) -> pa.Array:
    """``sha256:<hex>`` strings of random 256-bit values, written into one preallocated buffer."""
    data = np.empty((count, WIDTH), dtype=np.uint8)
    data[:, : len(PREFIX)] = PREFIX
    for start in range(0, count, BATCH):
        raw = rng.integers(0, 256, size=(min(BATCH, count - start), 32), dtype=np.uint8)
        block = data[start : start + len(raw), len(PREFIX) :]
        block[:, 0::2], block[:, 1::2] = HEX[raw >> 4], HEX[raw & 15]
    wide = WIDTH * count >= 1 << 31
    offsets = np.arange(0, WIDTH * (count + 1), WIDTH, dtype=np.int64 if wide else np.int32)
    kind = pa.large_string() if wide else pa.string()
    return pa.Array.from_buffers(kind, count, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def plan_arrays(records: int, seed: int) -> dict[str, Members]:
    rng = np.random.default_rng(seed)
    sizes = [int(records * share) for share in SHARES]
    sizes[0] += records - sum(sizes)
    members = {}
    for j, size in enumerate(sizes):
        numbers = pc.utf8_lpad(pc.cast(pa.array(np.arange(size)), pa.string()), 10, "0")
        ids = pc.binary_join_element_wise(f"s{j}/", numbers, "")
        tokens = np.maximum(rng.lognormal(6.0, 0.8, size), 1).astype(np.int64)
        members[f"s{j}"] = Members(ids, digests(size, rng), tokens)
    return members


def subset(members: dict[str, Members], records: int, total: int) -> dict[str, Members]:
    """The first records of each source, keeping the shares."""
    out = {}
    for name, own in members.items():
        keep = max(1, len(own.tokens) * records // total)
        out[name] = Members(own.record_id[:keep], own.record_digest[:keep], own.tokens[:keep])
    return out


def policies(members: dict[str, Members]) -> dict[str, MixingPolicy]:
    records = sum(len(m.tokens) for m in members.values())
    tokens = sum(int(m.tokens.sum()) for m in members.values())
    return {
        "natural": MixingPolicy(seed="bench"),
        "temperature": MixingPolicy(
            seed="bench", policy="temperature", alpha="0.5", unit="tokens", budget=tokens
        ),
        "unimax": MixingPolicy(seed="bench", policy="unimax", budget=records, max_epochs=4),
    }


def populations(members: dict[str, Members]) -> list[Population]:
    return [Population(s, len(m.tokens), int(m.tokens.sum())) for s, m in members.items()]


def ours(policy: MixingPolicy, members: dict[str, Members]) -> tuple[pa.Table, list[dict], list]:
    plans = plan_mixture(policy, populations(members))
    weighted = any(p.target != p.natural for p in plans if p.amount)
    table, picks = mix(policy.seed, policy.unit, plans, members, weighted)
    return table, report(plans, members, picks, policy.max_weight), plans


def v2_mix(policy: MixingPolicy, members: dict[str, Members]) -> int:
    """The previous implementation (git 87aa490 ``mixing_select.select_source`` + ``mix``)."""
    plans = plan_mixture(policy, populations(members))
    entries = []
    for plan in plans:
        own, left, repeat = members[plan.source], plan.amount, 0
        ids, digest_texts = own.record_id.to_pylist(), own.record_digest.to_pylist()
        while left > 0 and ids:
            head, tail = f"{policy.seed}\x00{plan.source}\x00".encode(), f"\x00{repeat}".encode()
            keys = [hashlib.sha256(head + d.encode() + tail).digest() for d in digest_texts]
            ranked = sorted(range(len(ids)), key=lambda i: (keys[i], ids[i]))
            if policy.unit == "documents":
                take = min(left, len(ranked))
            else:
                reach = np.cumsum(own.tokens[ranked])
                take = min(int(np.searchsorted(reach, left)) + 1, len(ranked))
            left -= take if policy.unit == "documents" else int(own.tokens[ranked[:take]].sum())
            entries.extend((keys[i], ids[i], repeat, plan.source, "w") for i in ranked[:take])
            repeat += 1
    entries.sort()
    table = pa.Table.from_pydict(
        {
            "position": list(range(len(entries))),
            "record_id": [e[1] for e in entries],
            "source_id": [e[3] for e in entries],
            "repeat": [e[2] for e in entries],
            "weight": [e[4] for e in entries],
        }
    )
    return table.num_rows


def check(name: str, result: tuple, policy: MixingPolicy, members: dict[str, Members]) -> None:
    """Exit non-zero unless the table realises the plan: per source, the planned documents
    exactly, or the planned tokens overshot by less than the source's longest document."""
    table, rows, plans = result
    problems = []
    sources, counts = table.column("source_id").value_counts().flatten()
    if dict(zip(sources.to_pylist(), counts.to_pylist(), strict=True)) != {
        r["source"]: r["selected_docs"] for r in rows if r["selected_docs"]
    }:
        problems.append("per-source sample counts differ from the report")
    if not pc.all(pc.equal(table.column("position"), pa.array(np.arange(table.num_rows)))).as_py():
        problems.append("positions are not 0..n-1")
    for plan, row in zip(plans, rows, strict=True):
        if policy.unit == "tokens":
            got, slack = row["selected_tokens"], int(members[plan.source].tokens.max())
        else:
            got, slack = row["selected_docs"], 1
        if not plan.amount <= got < plan.amount + slack:
            problems.append(f"{plan.source}: planned {plan.amount} {policy.unit}, got {got}")
    if problems:
        sys.exit(f"{name}: WRONG RESULT: {'; '.join(problems)}")


def status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def plan_bytes(members: dict[str, Members]) -> int:
    return sum(
        m.record_id.nbytes + m.record_digest.nbytes + m.tokens.nbytes for m in members.values()
    )


def ordering_baseline(members: dict[str, Members], repeats: int) -> tuple[float, float]:
    """Seconds of ours (``stream_order``) and Arrow ``sort_by`` ordering the natural stream."""
    policy = policies(members)["natural"]
    plans = plan_mixture(policy, populations(members))
    table, picks = mix(policy.seed, policy.unit, plans, members, False)
    del table
    bits = {p.source: digest_bits(members[p.source].record_digest) for p in plans}
    stream = stream_of(policy.seed, plans, picks, bits)
    ids = pa.concat_arrays([members[p.source].record_id for p in plans])
    keyed = pa.table({"key": stream.key, "record_id": ids.take(stream.row), "r": stream.repeat})
    by = [("key", "ascending"), ("record_id", "ascending"), ("r", "ascending")]
    ours_s = median_seconds(lambda: stream_order(stream, ids), repeats)
    arrow_s = median_seconds(lambda: keyed.sort_by(by), repeats)
    order = stream_order(stream, ids)
    if not ids.take(stream.row[order]).equals(
        keyed.sort_by(by).column("record_id").combine_chunks()
    ):
        sys.exit("ordering: WRONG RESULT: stream_order differs from Arrow sort_by")
    return ours_s, arrow_s


def child(args: argparse.Namespace) -> None:
    """One policy in this (fresh) process: plan arrays, a checked run, then the timed runs."""
    members = plan_arrays(args.records, args.seed)
    loaded_kb = status_kb("VmRSS")
    exact = reset_peak()
    policy = policies(members)[args.child]
    result = ours(policy, members)
    check(args.child, result, policy, members)
    samples = result[0].num_rows
    del result
    first_kb = status_kb("VmHWM") if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = median_seconds(lambda: ours(policy, members), args.repeats)
    result = {
        "samples": samples,
        "seconds": seconds,
        "loaded_kb": loaded_kb,
        "first_kb": first_kb,
        "exact": exact,
        "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "plan_bytes": plan_bytes(members),
    }
    print(json.dumps(result))


def measure(name: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", name, "--records", str(args.records)]
    command += ["--repeats", str(args.repeats), "--seed", str(args.seed)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.exit(f"{name}: child failed: {done.stderr.strip() or done.stdout.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--baseline-records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--target-seconds", type=float, default=10.0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    members = plan_arrays(args.records, args.seed)
    small = subset(members, args.baseline_records, args.records)
    small_n = sum(len(m.tokens) for m in small.values())
    print(
        f"{'policy':<12} {'samples':>11} {'ours s':>7} {'rec/s':>10} {'plan MB':>8} "
        f"{'RSS+plan':>8} {'peak MB':>8} {'above':>6} {'maxrss':>7} | "
        f"{'v2 s@' + format(small_n, ','):>13} {'ours s':>7} {'v2 -> N s':>9} {'speedup':>7}"
    )
    failed = False
    for name in policies(members):
        got = measure(name, args)
        small_policy = policies(small)[name]
        v2_s = median_seconds(lambda p=small_policy: v2_mix(p, small), args.repeats)
        ours_small = median_seconds(lambda p=small_policy: ours(p, small), args.repeats)
        v2_at_n, seconds = v2_s * args.records / small_n, got["seconds"]
        mb = {k: got[k] / 1024 for k in ("loaded_kb", "first_kb", "maxrss_kb")}
        print(
            f"{name:<12} {got['samples']:>11,} {seconds:>7.2f} {args.records / seconds:>10,.0f} "
            f"{got['plan_bytes'] / 2**20:>8,.0f} {mb['loaded_kb']:>8,.0f} {mb['first_kb']:>8,.0f} "
            f"{mb['first_kb'] - mb['loaded_kb']:>6,.0f} {mb['maxrss_kb']:>7,.0f} | {v2_s:>13.2f} "
            f"{ours_small:>7.3f} {v2_at_n:>9.1f} {v2_at_n / seconds:>6.1f}x"
            + ("" if got["exact"] else "  (peak: ru_maxrss, includes generating the arrays)")
        )
        failed |= seconds > args.target_seconds and args.records >= 10_000_000
    ours_s, arrow_s = ordering_baseline(members, args.repeats)
    print(
        f"\nordering the natural stream ({args.records:,}): ours stream_order {ours_s:.2f} s, "
        f"Arrow sort_by(key, record_id, repeat) {arrow_s:.2f} s ({arrow_s / ours_s:.1f}x)"
    )
    if failed:
        sys.exit(f"FAIL: a policy took more than {args.target_seconds} s at {args.records:,}")


if __name__ == "__main__":
    main()
