"""Record lineage lookups at scale: row-group bisection and streamed scans against whole tables.

Synthetic per-record tables (no pipeline) in the pinned Parquet format (64Ki-row groups, no
statistics), in a real ``ContentStore`` under ``--dir``: a dedup clusters table and a splits
table of ``--records`` rows sorted by record id (2% removed near duplicates, groups of 4), and a
mixed-samples table of 1.5x as many rows in position order. Each measurement runs in a fresh
child process (its peak RSS is the lookup's alone), median of ``--repeats``:

- ``explain`` (``dedup.explain``: the record's row by bisection, its cluster and leakage group by
  one streamed scan, its group's splits by bisection), against the **baseline**: what it did
  before (both tables read whole, filtered, and a dict of every record's split);
- the same ``explain`` with its tables already verified (a stat-trusted second query: the lookup
  without the streamed re-hash every first read pays);
- a record's samples (a streamed scan of the samples' record_id column) against reading the
  samples table whole and filtering.

Usage: .venv/bin/python bench/record_lineage.py [--records 2000000] [--repeats 3]
       [--dir /tmp/record-lineage-bench]
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.dedup.clusters import CLUSTER_COLUMNS
from corpus_assets.core.dedup.explain import explain
from corpus_assets.core.runtime.layer_index import LayerIndex, load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.storage.artifacts import get_table, put_json
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.storage.parquet_sink import put_table_batches
from corpus_assets.core.storage.table_lookup import matching_rows
from corpus_assets.core.training_view.mixing import MIX_COLUMNS
from corpus_assets.core.training_view.splits import SPLIT_COLUMNS

BATCH = 1 << 16


def _named(prefix: str, numbers: pa.Array, width: int) -> pa.Array:
    return pc.binary_join_element_wise(
        prefix, pc.utf8_lpad(numbers.cast(pa.string()), width, "0"), ""
    )


def _cluster_batch(lo: int, hi: int) -> pa.RecordBatch:
    """Rows [lo, hi) of the clusters table: every 50th record a near duplicate of the one
    before it, groups of 4 records (each its leakage group)."""
    j = pa.array(range(lo, hi), pa.int64())
    n = hi - lo
    ids = _named("r", j, 9)
    previous = _named("r", pc.max_element_wise(pc.subtract(j, 1), 0), 9)
    removed = pc.equal(pc.remainder(j, 50), 7)
    groups = _named("g", pc.divide(j, 4), 9)
    columns = {
        "record_id": ids,
        "source_id": pa.array(["s"] * n),
        "object": _named("o", pc.divide(j, 1000), 7),
        "line": pc.add(pc.remainder(j, 1000), 1),
        "group_id": groups,
        "dedup_key": pc.binary_join_element_wise("k", ids, ""),
        "verdict": pc.if_else(removed, "near_duplicate", "keep"),
        "representative_id": pc.if_else(removed, previous, ids),
        "is_representative": pc.invert(removed),
        "match_id": pc.if_else(removed, previous, ""),
        "match_jaccard": pc.if_else(removed, 0.9, pa.nulls(n, pa.float64())),
        "leakage_id": groups,
        "excluded": pa.array([""] * n),
    }
    return pa.RecordBatch.from_arrays(
        [columns[f.name].cast(f.type) for f in CLUSTER_COLUMNS], schema=CLUSTER_COLUMNS
    )


def _split_batch(lo: int, hi: int) -> pa.RecordBatch:
    clusters = _cluster_batch(lo, hi)
    names = pa.array(["train", "validation", "test"])
    split = pc.take(names, pc.remainder(pa.array(range(lo, hi)), 3))
    columns = [clusters.column(n) for n in ("record_id", "group_id", "leakage_id")] + [split]
    return pa.RecordBatch.from_arrays(columns, schema=SPLIT_COLUMNS)


def _sample_batch(lo: int, hi: int, records: int) -> pa.RecordBatch:
    j = pa.array(range(lo, hi), pa.int64())
    ids = _named("r", pc.remainder(pc.multiply(j, 7919), records), 9)
    columns = [
        j,
        ids,
        pa.array(["s"] * (hi - lo)),
        pc.divide(j, records),
        pa.array(["1"] * (hi - lo)),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=MIX_COLUMNS)


def _build(cas: ContentStore, records: int, tmp: Path) -> dict:
    """The tables in the CAS and a manifest-like document naming their layer indexes."""
    spans = [(lo, min(lo + BATCH, records)) for lo in range(0, records, BATCH)]
    clusters = put_table_batches(cas, CLUSTER_COLUMNS, (_cluster_batch(*s) for s in spans), tmp)
    splits = put_table_batches(cas, SPLIT_COLUMNS, (_split_batch(*s) for s in spans), tmp)
    n = records * 3 // 2
    sample_spans = [(lo, min(lo + BATCH, n)) for lo in range(0, n, BATCH)]
    samples = put_table_batches(
        cas, MIX_COLUMNS, (_sample_batch(lo, hi, records) for lo, hi in sample_spans), tmp
    )

    def index(layer: str, name: str, ref: dict) -> dict:
        doc = LayerIndex(
            layer=layer, code="bench", policy=None, inputs=[], outputs={name: ref}, counts={}
        )
        return put_json(cas, doc.document())

    layers = {
        "dedup_clusters": index("dedup_clusters", "clusters", clusters),
        "splits": index("splits", "splits", splits),
        "mixed_samples": index("mixed_samples", "samples", samples),
    }
    return {"snapshotId": "sha256:" + "0" * 64, "layers": layers}


def _as_read(manifest: dict) -> Any:
    """The two fields ``explain`` reads of a manifest (this bench builds no whole one)."""
    return SimpleNamespace(layers=manifest["layers"], snapshot_id=manifest["snapshotId"])


def _old_explain(cas: ContentStore, manifest: dict, record_id: str) -> dict:
    """The baseline: ``explain`` as it was (whole tables, a dict of every split)."""
    layers = manifest["layers"]
    dedup = load_index(cas, layers["dedup_clusters"], "dedup_clusters")
    parted = PartedTable.read(cas, dedup.output("clusters"), "dedup clusters")
    table = parted.table(VerifiedFiles(cas), "dedup clusters")
    row = table.filter(pc.equal(table.column("record_id"), record_id)).to_pylist()[0]
    splits_index = load_index(cas, layers["splits"], "splits")
    splits = get_table(cas, splits_index.output("splits"), "splits table")
    split_of = dict(
        zip(splits.column("record_id").to_pylist(), splits.column("split").to_pylist(), strict=True)
    )
    cluster = table.filter(pc.equal(table.column("representative_id"), row["representative_id"]))
    group = table.filter(pc.equal(table.column("leakage_id"), row["leakage_id"]))
    columns = ["record_id", "source_id", "verdict", "match_id", "match_jaccard"]
    return {
        "record": row,
        "cluster": cluster.select(columns).to_pylist(),
        "leakage_group": {
            "id": row["leakage_id"],
            "records": [
                {**r, "split": split_of.get(r["record_id"])}
                for r in group.select(["record_id", "verdict"]).to_pylist()
            ],
        },
    }


def _child(root: Path, what: str, record_id: str) -> None:
    """One measurement in this process: prints seconds, peak RSS and the answer's size."""
    cas = ContentStore(root / "cas")
    manifest = json.loads((root / "manifest.json").read_text())
    start = time.perf_counter()
    if what == "floor":  # the imports and the manifest alone
        answer: dict = {}
    elif what == "baseline":
        answer = _old_explain(cas, manifest, record_id)
    elif what == "explain":
        answer = explain(cas, _as_read(manifest), record_id)
    elif what == "explain-trusted":
        files = VerifiedFiles(cas, verified=cas.iter_digests())
        answer = explain(cas, _as_read(manifest), record_id, files)
    else:
        samples = load_index(cas, manifest["layers"]["mixed_samples"], "mixed_samples")
        ref = samples.output("samples")
        if what == "samples-baseline":
            table = get_table(cas, ref, "mixed samples")
            rows = table.filter(pc.equal(table.column("record_id"), record_id))
        else:
            path = VerifiedFiles(cas).path(ref["digest"], "mixed samples")
            rows = matching_rows(path, "record_id", [record_id], ["position", "repeat"])
        answer = {"rows": rows.num_rows}
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_mb": peak, "answer": answer}, default=str))


def _measure(root: Path, what: str, record_id: str, repeats: int) -> tuple[float, float, dict]:
    runs = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, __file__, "--child", what, record_id, "--dir", str(root)],
            check=True,
            capture_output=True,
            text=True,
        )
        runs.append(json.loads(out.stdout))
    seconds = statistics.median(r["seconds"] for r in runs)
    peak = statistics.median(r["peak_mb"] for r in runs)
    return seconds, peak, runs[0]["answer"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/record-lineage-bench")
    parser.add_argument("--child", nargs=2)
    args = parser.parse_args()
    root = Path(args.dir)
    if args.child:
        _child(root, *args.child)
        return
    root.mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    cas = ContentStore(root / "cas")
    start = time.perf_counter()
    manifest = _build(cas, args.records, root / "tmp")
    (root / "manifest.json").write_text(json.dumps(manifest))
    print(f"{args.records:,} records: tables built in {time.perf_counter() - start:.1f} s")
    record = f"r{args.records * 3 // 4 + 7:09d}"  # a removed near duplicate, late in the table
    rows = {}
    floor = _measure(root, "floor", record, args.repeats)[1]
    for what in ("baseline", "explain", "explain-trusted", "samples-baseline", "samples"):
        rows[what] = _measure(root, what, record, args.repeats)
    if rows["baseline"][2] != json.loads(json.dumps(rows["explain"][2], default=str)):
        sys.exit("explain's answer differs from the baseline's")
    if rows["samples"][2] != rows["samples-baseline"][2]:
        sys.exit("the samples scan's answer differs from the baseline's")
    base_s, base_mb, _ = rows["baseline"]
    print(f"\nrecord {record}, median of {args.repeats} fresh processes each")
    print(f"peak RSS of a child that only imports and reads the manifest: {floor:.0f} MB\n")
    print("| lookup | median s | peak RSS MB | time vs baseline | peak above floor vs baseline |")
    print("|---|---:|---:|---:|---:|")
    for what, (seconds, peak, _) in rows.items():
        ref_s, ref_mb = (
            (rows["samples-baseline"][:2]) if what.startswith("samples") else (base_s, base_mb)
        )
        ratio, peak_ratio = seconds / ref_s, (peak - floor) / max(ref_mb - floor, 1)
        print(f"| {what} | {seconds:.3f} | {peak:.0f} | {ratio:.2f}x | {peak_ratio:.2f}x |")


if __name__ == "__main__":
    main()
