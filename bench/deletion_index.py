"""Deletion lineage at scale: ``tombstone hits`` over many 1M-member snapshots, against a scan.

Synthetic snapshots in a real ``ContentStore`` and SQLite catalog under ``--home`` (no pipeline:
the tables the index reads, put directly). Snapshot ``i`` holds a sliding window of records
``j`` in [i * step, i * step + N / 0.98) with N = ``--members`` and step = N / 100, so the probed
record, object and group are in every snapshot (up to 100): 100 records an object, 1,000 a
group, 2% of them removed near duplicates (carried by the record before), one packed span a
member in ten packed shards. ``--layout scattered`` (the default) names record ``j`` by a
bijective hash of ``j``, so an object's or group's records lie all over the record-id order, as
ids a source declares do; ``contiguous`` names them in ``j`` order. The base columns are made
once and each snapshot is a slice of them; the home (``--home``/<layout>-<members>) records
what it holds, and a rerun generates only what is missing and builds only the indexes the
catalog does not remember (all of them again after a change to ``deletion_build``).

Measured, each phase in a fresh child process (its peak RSS is ``VmHWM``, the phase's alone):

- build: ``deletion_index.build`` of snapshot 0 (verified reads, DuckDB join + sort, shards
  put); with ``--baseline-tree DIR`` (a checkout of the code before, e.g. ``git archive``) the
  same call of that tree's code, the named baseline for the build's time and memory. Then the
  index of every snapshot not yet remembered (``deletion_index.ensure``, as the manifest build).
- lookup: ``deletion_reach.tombstone_hits`` (what ``corpus-assets tombstone hits SEQ`` prints) for a
  record, an object and a group tombstone, median of ``--repeats`` after the first call (also
  shown), every CAS read verified.
- baseline: ``deletion_reach.scan_hits`` (every snapshot's members, dedup and spans tables read and
  filtered) on a catalog of the first ``--scan`` snapshots, extrapolated linearly to all; the
  index's answer for those snapshots is compared with the scan's ("same on 5").

Usage: .venv/bin/python bench/deletion_index.py [--snapshots 100] [--members 1000000]
       [--layout scattered|contiguous] [--scan 5] [--repeats 5] [--home /tmp/deletion-bench]
       [--baseline-tree DIR]
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from corpus_assets.core.governance import deletion_index, deletion_reach, states
from corpus_assets.core.governance.tombstones import add_tombstone
from corpus_assets.core.runtime.layer_index import LayerIndex
from corpus_assets.core.storage.artifacts import put_json, put_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.digests import json_digest

KEPT = 0.98  # 1 record in 50 is a removed duplicate, not a member
SPREAD = 100  # windows move by members / SPREAD: up to that many snapshots share the probes
SHARDS = [f"sha256:{n:064x}" for n in range(10)]  # the packed shards the spans name


def _names(prefix: str, values: np.ndarray, width: int) -> pa.Array:
    return pc.binary_join_element_wise(
        prefix, pc.utf8_lpad(pa.array(values).cast(pa.string()), width, "0"), ""
    )


def _record_ids(j: np.ndarray, layout: str) -> pa.Array:
    """Record ``j``'s id: ``j`` itself, or a bijective hash of it (odd multiplier mod 2**32)."""
    if layout == "contiguous":
        return _names("r", j, 10)
    return _names("r", (j.astype(np.uint64) * 2654435761) % (1 << 32), 10)


def _base(total: int, layout: str) -> pa.Table:
    """Every record any snapshot holds, in ``j`` order, with its dedup verdict."""
    j = np.arange(total, dtype=np.int64)
    ids = _record_ids(j, layout)
    removed = pa.array(j % 50 == 7)
    before = pa.concat_arrays([ids.slice(0, 1), ids.slice(0, total - 1)])  # record j - 1
    return pa.table(
        {
            "record_id": ids,
            "object": _names("o", j // 100, 8),
            "group_id": _names("g", j // 1000, 7),
            "verdict": pc.if_else(removed, "near_duplicate", "keep"),
            "representative_id": pc.if_else(removed, before, pa.nulls(total, pa.string())),
            "match_id": pc.if_else(removed, before, pa.nulls(total, pa.string())),
            "match_jaccard": pc.if_else(removed, 0.9, pa.nulls(total, pa.float64())),
        }
    )


def _snapshot(cas: ContentStore, base: pa.Table, first: int, window: int) -> dict[str, Any]:
    """One snapshot's clusters, members and spans in the CAS; its manifest document."""
    clusters = base.slice(first, window)
    members = clusters.filter(pc.equal(clusters.column("verdict"), "keep"))
    members = members.select(["record_id", "object", "group_id"])
    n = members.num_rows
    position = np.arange(n, dtype=np.int64)
    spans = pa.table(
        {
            "block": pa.array(position // 8),
            "start": pa.array((position % 8 * 128).astype(np.int32)),
            "end": pa.array((position % 8 * 128 + 128).astype(np.int32)),
            "record_id": members.column("record_id"),
            "record_offset": pa.array(np.zeros(n, dtype=np.int64)),
            "sample": pa.array(position),
            "shard": pa.array((position * len(SHARDS) // max(n, 1)).astype(np.int32)),
        }
    )
    layers = {
        "dedup_clusters": _layer(cas, "dedup_clusters", {"clusters": put_table(cas, clusters)}),
        "packed_blocks": _layer(
            cas, "packed_blocks", {"spans": put_table(cas, spans), "shards": _shard_refs()}
        ),
    }
    return _manifest(first, {**put_table(cas, members), "count": n, "uri": "bench"}, layers)


def _manifest(first: int, members: dict[str, Any], layers: dict[str, Any]) -> dict[str, Any]:
    """A manifest document of the model's shape around the tables the index reads (``members``
    and the two layers); every other field a placeholder. Never signed nor verified: the
    index reads it through ``read_manifest``, which checks the shape only."""
    token = {"token": "</s>", "id": 0}
    counts = ("records", "quarantined", "duplicates_removed", "members", "train", "validation")
    return {
        "schema": "bench",
        "buildId": f"bench-{first}",
        "partition": f"b{first}",
        "parents": [],
        "purpose": "bench",
        "alias": "bench",
        "freeze": layers["dedup_clusters"],
        "sources": [{"id": "bench", "kind": "objects"}],
        "tombstoneWatermark": "0",
        "benchmarkFence": "0",
        **dict.fromkeys(("recordSchema", "selectionPolicy", "splitPolicy"), "bench"),
        **dict.fromkeys(("mixingPolicy", "packingPolicy", "transformImage"), "bench"),
        "transform": {},
        "layers": layers,
        "tokenizer": {
            "schema": "bench",
            "kind": "bench",
            "digest": "bench",
            "vocabSize": 1,
            "dtype": "uint16",
            "specialTokens": {"eos": token, "pad": token},
        },
        "mixture": [],
        "members": members,
        "counts": {**dict.fromkeys((*counts, "test", "blocks", "tokens"), 0)},
        "snapshotId": f"bench-{first}",
        "signature": {"payload": "", "payloadType": "bench", "signatures": []},
    }


def _shard_refs() -> list[dict[str, Any]]:
    return [{"digest": d, "media": "application/octet-stream", "size": 0} for d in SHARDS]


def _layer(cas: ContentStore, layer: str, outputs: dict[str, Any]) -> dict[str, Any]:
    index = LayerIndex(
        layer=layer, code="bench", policy=None, inputs=[], outputs=outputs, counts={}
    )
    return put_json(cas, index.document())


def generate(home: Path, snapshots: int, members: int, layout: str, scan: int) -> dict:
    """The home's snapshots (made only where missing) and tombstones; its record."""
    record_path = home / "bench.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    window, step = round(members / KEPT), members // SPREAD
    if len(record.get("manifests", [])) < snapshots:
        cas, catalog = ContentStore(home / "cas"), Catalog(f"sqlite:///{home / 'catalog.db'}")
        have = record.get("manifests", [])
        base = _base((snapshots - 1) * step + window, layout)
        for i in range(len(have), snapshots):
            start = time.perf_counter()
            manifest = put_json(cas, _snapshot(cas, base, i * step, window))["digest"]
            states.register(catalog, json_digest({"bench": manifest}), f"b{i:03d}", manifest, "x")
            have.append(manifest)
            record["manifests"] = have
            record_path.write_text(json.dumps(record))  # a stopped run resumes here
            print(f"  made snapshot {i} in {time.perf_counter() - start:.1f} s", flush=True)
        if "seqs" not in record:
            record["probes"] = _probes(base, (SPREAD - 1) * step, window)
            seqs = {k: add_tombstone(catalog, k, t, "bench") for k, t in record["probes"].items()}
            record["seqs"] = seqs
        record_path.write_text(json.dumps(record))
    _scan_catalog(home, record, scan)
    return record


def _probes(base: pa.Table, low: int, high: int) -> dict[str, str]:
    """A group (and its last member and that member's object) whose records [low, high) -
    what every snapshot holds - all contain."""
    group = max(high // 1000 - 1, 0)
    last = group * 1000 + 999  # j % 50 == 49: a member
    if low > group * 1000:
        print(f"  (the probed group starts at {group * 1000}, not in every snapshot)")
    return {
        "record": base.column("record_id")[last].as_py(),
        "object": base.column("object")[last].as_py(),
        "group": base.column("group_id")[last].as_py(),
    }


def _scan_catalog(home: Path, record: dict, scan: int) -> None:
    """A catalog of the first ``scan`` snapshots alone, for the scan baseline."""
    path = home / "scan.db"
    path.unlink(missing_ok=True)
    catalog = Catalog(f"sqlite:///{path}")
    for i, manifest in enumerate(record["manifests"][:scan]):
        states.register(catalog, json_digest({"bench": manifest}), f"b{i:03d}", manifest, "x")
    catalog.dispose()


def child_build(home: Path, which: str) -> dict:
    """``build`` of snapshot 0 (``first``), or ``ensure`` of every snapshot (``all``)."""
    record = json.loads((home / "bench.json").read_text())
    cas, catalog = ContentStore(home / "cas"), Catalog(f"sqlite:///{home / 'catalog.db'}")
    seconds, size = [], 0
    for manifest in record["manifests"][:1] if which == "first" else record["manifests"]:
        start = time.perf_counter()
        if which == "first":
            size = _index_bytes(cas, deletion_index.build(cas, manifest))
        elif catalog.memo(deletion_index.memo_key(manifest)) is None:
            deletion_index.ensure(cas, catalog, manifest)
        else:
            continue
        seconds.append(time.perf_counter() - start)
        print(f"  built an index in {seconds[-1]:.1f} s", file=sys.stderr, flush=True)
    return {"seconds": seconds, "peak_rss_mb": _vm_hwm_mb(), "index_mb": size / 1e6}


def _index_bytes(cas: ContentStore, directory: str) -> int:
    """The directory's and its shards' bytes (0 for an index of another layout, the baseline)."""
    try:
        fanout = ipc.open_file(pa.BufferReader(cas.get_bytes(directory))).read_all()
    except pa.ArrowInvalid:
        return 0
    return cas.size(directory) + sum(cas.size(d) for d in fanout.column("digest").to_pylist())


def child_lookup(home: Path, repeats: int, scan: bool, first: int) -> dict:
    """Medians of ``tombstone_hits`` (or ``scan_hits`` on the scan catalog) per probe kind, and
    the digest of the answer's entries for the ``first`` snapshots (the scan's, to compare)."""
    record = json.loads((home / "bench.json").read_text())
    cas = ContentStore(home / "cas")
    catalog = Catalog(f"sqlite:///{home / ('scan.db' if scan else 'catalog.db')}")
    out: dict[str, Any] = {}
    for kind, target in record["probes"].items():
        runs, answer = [], None
        for _ in range(repeats + 1):
            start = time.perf_counter()
            if scan:
                answer = deletion_reach.scan_hits(cas, catalog, kind, target)
            else:
                answer = deletion_reach.tombstone_hits(cas, catalog, record["seqs"][kind])[
                    "snapshots"
                ]
            runs.append(time.perf_counter() - start)
        out[kind] = {
            "first_s": runs[0],
            "median_s": statistics.median(runs[1:]),
            "snapshots": len(answer or []),
            "members": sum(len(a["members"]) for a in answer or []),
            "carried": sum(len(a["carried_by"]) for a in answer or []),
            "spans": sum(len(a["spans"]) for a in answer or []),
            "first_digest": hashlib.sha256(
                json.dumps((answer or [])[:first], sort_keys=True).encode()
            ).hexdigest(),
        }
    out["peak_rss_mb"] = _vm_hwm_mb()
    return out


def _vm_hwm_mb() -> float:
    """This process's peak RSS (``VmHWM``, reset by exec), in MB."""
    status = Path("/proc/self/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def _child(args: argparse.Namespace, phase: str, tree: Path | None = None) -> dict:
    """Run ``phase`` in a fresh interpreter (``tree``'s code when given); its JSON figures."""
    command = [sys.executable, __file__, "--child", phase, "--home", str(args.home)]
    command += ["--repeats", str(args.repeats), "--scan", str(args.scan)]
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    ran = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True, env=env)
    return json.loads(ran.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--snapshots", type=int, default=100)
    parser.add_argument("--members", type=int, default=1_000_000)
    parser.add_argument("--layout", choices=["scattered", "contiguous"], default="scattered")
    parser.add_argument("--scan", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--home", type=Path, default=Path("/tmp/deletion-bench"))
    parser.add_argument("--baseline-tree", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        phases = {
            "build-first": lambda: child_build(args.home, "first"),
            "build-all": lambda: child_build(args.home, "all"),
            "lookup": lambda: child_lookup(args.home, args.repeats, False, args.scan),
            "scan": lambda: child_lookup(args.home, args.repeats, True, args.scan),
        }
        print(json.dumps(phases[args.child]()))
        return
    args.home = args.home / f"{args.layout}-{args.members}"
    args.home.mkdir(parents=True, exist_ok=True)
    record = generate(args.home, args.snapshots, args.members, args.layout, args.scan)
    print(f"{args.snapshots} snapshots x {args.members:,} members ({args.layout}), {args.home}")
    report(args, record)


def report(args: argparse.Namespace, record: dict) -> None:
    """Run the phases and print the table."""
    first = _child(args, "build-first")
    print(
        f"build of one index (snapshot 0): {first['seconds'][0]:.1f} s, "
        f"peak RSS {first['peak_rss_mb']:.0f} MB, {first['index_mb']:.0f} MB in the CAS"
    )
    if args.baseline_tree:
        old = _child(args, "build-first", args.baseline_tree)
        print(
            f"  baseline ({args.baseline_tree}): {old['seconds'][0]:.1f} s, "
            f"peak RSS {old['peak_rss_mb']:.0f} MB"
        )
    built = _child(args, "build-all")
    if built["seconds"]:
        print(
            f"  built {len(built['seconds'])} not yet remembered: median "
            f"{statistics.median(built['seconds']):.1f} s, peak RSS {built['peak_rss_mb']:.0f} MB"
        )
    lookup = _child(args, "lookup")
    args.repeats = max(1, min(args.repeats, 2))
    scan = _child(args, "scan")
    ratio = args.snapshots / max(1, min(args.scan, args.snapshots))
    print(
        f"{'tombstone':<8} {'index median':>13} {'first call':>11} {'scan on':>9} "
        f"{'scan, extrapolated':>19} {'ratio':>7}  answer"
    )
    for kind in record["probes"]:
        new, old = lookup[kind], scan[kind]
        print(
            f"{kind:<8} {new['median_s'] * 1000:>10.0f} ms {new['first_s'] * 1000:>8.0f} ms "
            f"{args.scan:>3}: {old['median_s']:>4.1f} s {old['median_s'] * ratio:>17.0f} s "
            f"{old['median_s'] * ratio / new['median_s']:>6.0f}x  "
            f"{'same' if new['first_digest'] == old['first_digest'] else 'DIFFERENT'} on "
            f"{old['snapshots']}; {new['snapshots']} snapshots, "
            f"{new['members']} members, {new['carried']} carried, {new['spans']} spans"
        )
    print(
        f"peak RSS: lookup process {lookup['peak_rss_mb']:.0f} MB, "
        f"scan process {scan['peak_rss_mb']:.0f} MB"
    )


if __name__ == "__main__":
    main()
