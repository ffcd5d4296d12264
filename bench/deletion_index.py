"""Deletion lineage at scale: the per-snapshot deletion index against scanning the tables.

Synthetic snapshots (the index inputs made directly, no pipeline): snapshot ``i`` holds the
members ``r{j}`` for j in [i * step, i * step + N) with step = N / snapshots (a sliding window,
so the probed record, object and group are in every snapshot), 100 records an object, 1,000 a
group, one packed span each, and a dedup clusters table of N rows with 2% removed duplicates.
Members, clusters and the index shards live in a real ``ContentStore`` under ``--dir``.

Measured: the index build (``index_rows`` + ``put_index``) per snapshot; then, in a fresh child
process (so its peak RSS is the lookup's alone), the lookup a tombstone makes in every snapshot
(directory read, member + carried keys, the hit records' span keys, every shard read verified)
for a record, an object and a group, median of ``--repeats``. The baseline is ``scan_hits``'s
per-snapshot work (members and clusters tables read, verified and filtered) on ``--scan``
snapshots, extrapolated linearly to all of them. The catalog queries ``hits`` also makes (state,
memo row, permits: one each per snapshot) are not in either figure.

Usage: .venv/bin/python bench/deletion_index.py [--snapshots 100] [--members 1000000]
       [--scan 3] [--repeats 5] [--dir /tmp/deletion-bench]
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.governance import deletion_index as di
from corpus_assets.core.storage.artifacts import get_json, get_table, put_table
from corpus_assets.core.storage.cas import ContentStore

PROBES = [("record", "r00999999"), ("object", "o0009999"), ("group", "g000999")]


def _tables(first: int, n: int) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Members, clusters and spans of one snapshot holding records [first, first + n)."""
    j = pa.array(range(first, first + n), pa.int64())
    ids = pc.binary_join_element_wise("r", pc.utf8_lpad(j.cast(pa.string()), 8, "0"), "")
    objects = pc.binary_join_element_wise(
        "o", pc.utf8_lpad(pc.divide(j, 100).cast(pa.string()), 7, "0"), ""
    )
    groups = pc.binary_join_element_wise(
        "g", pc.utf8_lpad(pc.divide(j, 1000).cast(pa.string()), 6, "0"), ""
    )
    members = pa.table({"record_id": ids, "object": objects, "group_id": groups})
    removed = pc.equal(pc.remainder(j, 50), 7)
    verdict = pc.if_else(removed, "near_duplicate", "keep")
    clusters = members.append_column("verdict", verdict)
    clusters = clusters.append_column(
        "representative_id", pc.if_else(removed, ids, pa.nulls(n, pa.string()))
    )
    clusters = clusters.append_column("match_id", clusters.column("representative_id"))
    clusters = clusters.append_column(
        "match_jaccard", pc.if_else(removed, 0.9, pa.nulls(n, pa.float64()))
    )
    spans = pa.table(
        {
            "block": pc.divide(j, 8),
            "start": pa.array([0] * n, pa.int32()),
            "end": pa.array([100] * n, pa.int32()),
            "record_id": ids,
            "record_offset": pa.array([0] * n, pa.int64()),
            "shard": pa.array([0] * n, pa.int32()),
        }
    )
    return members, clusters, spans


def build(cas: ContentStore, snapshots: int, n: int) -> tuple[list[dict], list[float]]:
    """Per snapshot: its inputs in the CAS and its index directory; the build seconds."""
    made, seconds = [], []
    for i in range(snapshots):
        members, clusters, spans = _tables(i * (n // snapshots), n)
        refs = {"members": put_table(cas, members), "clusters": put_table(cas, clusters)}
        start = time.perf_counter()
        rows = di.index_rows(members, clusters, spans, ["sha256:" + "ab" * 32])
        directory = di.put_index(cas, f"sha256:{i:064x}", rows, di.SPANS)
        seconds.append(time.perf_counter() - start)
        made.append({"directory": directory, **{k: r["digest"] for k, r in refs.items()}})
        print(f"  snapshot {i}: {rows.num_rows} index rows in {seconds[-1]:.2f} s", flush=True)
    return made, seconds


def lookup(cas: ContentStore, made: list[dict], kind: str, target: str) -> tuple[float, int]:
    """Seconds for one tombstone's lookups in every snapshot, and the spans found."""
    start, spans = time.perf_counter(), 0
    for snap in made:
        index = di.DeletionIndex(cas, get_json(cas, snap["directory"], "deletion index"))
        rows = index.rows([di.member_key(kind, target), di.carried_key(kind, target)])
        ids = rows.column("record_id").to_pylist()
        spans += index.rows([di.span_key(i) for i in ids]).num_rows
    return time.perf_counter() - start, spans


def scan(cas: ContentStore, snap: dict, kind: str, target: str) -> float:
    """Seconds for ``scan_hits``'s per-snapshot table reads and filters."""
    start = time.perf_counter()
    members = get_table(cas, {"digest": snap["members"]}, "members")
    members.filter(pc.equal(members.column(di.COLUMN[kind]), target))
    clusters = get_table(cas, {"digest": snap["clusters"]}, "clusters")
    clusters.filter(pc.equal(clusters.column(di.COLUMN[kind]), target))
    return time.perf_counter() - start


def child(root: Path, repeats: int, scans: int) -> None:
    """The lookup phase: prints its figures as JSON."""
    cas = ContentStore(root / "cas")
    made = json.loads((root / "made.json").read_text())
    out = {}
    for kind, target in PROBES:
        runs = [lookup(cas, made, kind, target) for _ in range(repeats)]
        per_scan = [scan(cas, made[i], kind, target) for i in range(scans)]
        out[kind] = {
            "lookup_s": statistics.median(s for s, _ in runs),
            "spans": runs[0][1],
            "scan_s_per_snapshot": statistics.median(per_scan),
        }
    out["peak_rss_mb"] = _vm_hwm_mb()  # ru_maxrss would carry the parent's over exec
    print(json.dumps(out))


def _vm_hwm_mb() -> float:
    """This process's peak RSS (``VmHWM``, reset by exec), in MB."""
    status = Path("/proc/self/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--snapshots", type=int, default=100)
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--scan", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/deletion-bench"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.dir, args.repeats, args.scan)
    cas = ContentStore(args.dir / "cas")
    made, seconds = build(cas, args.snapshots, args.members)
    (args.dir / "made.json").write_text(json.dumps(made))
    build_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    command = [sys.executable, __file__, "--child", "--dir", str(args.dir)]
    command += ["--repeats", str(args.repeats), "--scan", str(args.scan)]
    figures = json.loads(subprocess.run(command, check=True, capture_output=True).stdout)
    print(
        f"build: median {statistics.median(seconds):.2f} s a snapshot, peak RSS {build_rss:.0f} MB"
    )
    for kind, _ in PROBES:
        f = figures[kind]
        scan_all = f["scan_s_per_snapshot"] * args.snapshots
        print(
            f"{kind}: index lookup {f['lookup_s'] * 1000:.0f} ms over {args.snapshots} snapshots "
            f"({f['spans']} spans); scan {f['scan_s_per_snapshot']:.2f} s a snapshot on "
            f"{args.scan}, ~{scan_all:.0f} s extrapolated to {args.snapshots}"
        )
    print(f"lookup process peak RSS {figures['peak_rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
