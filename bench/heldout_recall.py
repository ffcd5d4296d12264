"""Recall of the held-out near-pair search on the shared corpora, against an exhaustive scan.

Builds the five shared corpora (``../shared/corpora``) in a fresh home through the CLI (CPU of
the whole build from ``wait4``), then, in this process, on the records the rule searches (the
snapshot's members and the removed duplicates behind them, in their representative's split):

- the splits **before** the held-out rule (published splits with every ``split.heldout_near``
  move undone: what the old path published);
- the **new step**: ``splits.heldout.HeldoutScan.pairs`` over those splits (CPU-s, peak RSS);
- the **named baseline, an exhaustive scan**: every record's shingle fingerprints (the
  project's own), a sparse records x shingles matrix, and the exact intersection of every
  held-out record with every record (blocks of rows, scipy), so every pair with J >= its
  threshold is known (two empty texts count as J = 1, as in ``jaccard_sorted``).

Recall of cross-split-capable pairs (one side held out, J >= threshold): **new** = pairs the
search found; **old path** = pairs dedup already joined (same leakage component, so never in
two splits). Also printed: pairs that straddled splits before the rule and after (the
published snapshot: must be 0). Exits non-zero unless the new recall is 1.000 and nothing
straddles after.

Usage: .venv/bin/python bench/heldout_recall.py [--tmp DIR] [--workers 2] [--reuse]
"""

import argparse
import json
import os
import re
import resource
import shutil
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy.sparse import csr_matrix

sys.path.insert(0, str(Path(__file__).parent))
from race import CLI, env_for, run_measured
from race_corpus import SOURCES

from corpus_assets.core.dedup.fingerprint_store import TextLookup
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import read_layer_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.training_view import view_queries
from corpus_assets.core.training_view.splits import TRAIN, HeldoutScan, searched_records
from corpus_assets.core.training_view.splits.heldout_tasks import fingerprint_rows
from corpus_assets.core.training_view.splits.schema import HELDOUT

CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"


def write_config(root: Path, workers: int) -> Path:
    lines = ["version: 1", "purpose: heldout-bench", "alias: bench", "sources:"]
    for name, (source_id, content) in SOURCES.items():
        lines.append(
            f"  - {{id: {source_id}, kind: objects, path: {CORPORA / name}, "
            f"include: ['*.jsonl.zst'], content: {content}}}"
        )
    lines += [f"execution: {{workers: {workers}}}", f"storage: {{home: {root / 'home'}}}"]
    root.mkdir(parents=True, exist_ok=True)
    config = root / "corpus.yaml"
    config.write_text("\n".join(lines) + "\n")
    return config


def old_splits(ws, key: str) -> pa.Table:
    """record_id, split as published, with every held-out move undone."""
    _, index = read_layer_index(ws, key, "splits")
    table = get_table(ws.cas, index.output("splits"), "splits").select(["record_id", "split"])
    moves = get_table(ws.cas, index.output("split_moves"), "moves")
    moved = moves.filter(pc.equal(moves["reason"], HELDOUT))
    undo = dict(zip(moved["record_id"].to_pylist(), moved["from"].to_pylist(), strict=True))
    ids, published = table["record_id"].to_pylist(), table["split"].to_pylist()
    splits = [undo.get(r, s) for r, s in zip(ids, published, strict=True)]
    print(f"held-out moves in the snapshot: {len(undo)}")
    return pa.table({"record_id": table["record_id"], "split": pa.array(splits)})


def member_positions(
    scan: HeldoutScan, con: duckdb.DuckDBPyConnection, members: str
) -> tuple[np.ndarray, pa.Array, np.ndarray]:
    """The searched members' global rows (ascending), record ids and splits, in one order:
    the search keeps the ids and splits in ``con`` (``ho_members``), one member per row."""
    rows = scan._positions(con, members).rows
    named = con.sql(
        "SELECT record_id, split FROM ho_members "
        "QUALIFY row_number() OVER (PARTITION BY row ORDER BY record_id, split) = 1 ORDER BY row"
    ).to_arrow_table()
    assert named.num_rows == len(rows), (named.num_rows, len(rows))
    return rows, named["record_id"].combine_chunks(), np.asarray(named["split"].to_pylist())


def exhaustive(prints: list[np.ndarray], heldout: np.ndarray, taus: np.ndarray) -> set:
    """Every (i, j) member-index pair, i < j, one of them held out, at J >= its threshold."""
    sizes = np.array([len(p) for p in prints], dtype=np.int64)
    vocab, inverse = np.unique(np.concatenate(prints), return_inverse=True)
    indptr = np.r_[0, np.cumsum(sizes)]
    ones = np.ones(len(inverse), dtype=np.int32)
    x = csr_matrix((ones, inverse, indptr), shape=(len(prints), len(vocab)))
    xt = x.T.tocsr()
    found: set[tuple[int, int]] = set()
    for start in range(0, len(heldout), 128):
        rows = heldout[start : start + 128]
        inter = (x[rows] @ xt).tocoo()
        i, j, n = rows[inter.row], inter.col, inter.data.astype(np.int64)
        jac = n / (sizes[i] + sizes[j] - n)
        hit = (jac >= np.maximum(taus[i], taus[j])) & (i != j)
        low, high = np.minimum(i, j)[hit].tolist(), np.maximum(i, j)[hit].tolist()
        found.update(zip(low, high, strict=True))
    empty = np.flatnonzero(sizes == 0)
    for h in np.intersect1d(heldout, empty).tolist():
        found.update((min(h, e), max(h, e)) for e in empty.tolist() if e != h)
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tmp", type=Path, default=Path("/tmp/heldout-bench"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--reuse", action="store_true", help="the last run's build, if any")
    args = parser.parse_args()
    config = args.tmp / "corpus.yaml"
    saved = args.tmp / "build.json"
    if args.reuse and saved.is_file():
        build = json.loads(saved.read_text())
    else:
        shutil.rmtree(args.tmp, ignore_errors=True)
        config = write_config(args.tmp, args.workers)
        build = run_measured([*CLI, "--config", str(config), "build"], env_for(args.tmp))
        saved.write_text(json.dumps(build))
    key = re.search(r"^partition (\S+):", build["out"], re.M).group(1)
    state = re.search(r"state (\S+)", build["out"]).group(1)
    print(f"build: {build['wall']:.1f} s wall, {build['cpu']:.1f} CPU-s, state {state}")
    os.environ.update(CORPUS_HOME=str(args.tmp / "home"), CORPUS_CONFIG=str(config))
    with open_workspace() as ws, view_queries.spilling(ws.home, 1) as con:
        _, canonical = CanonicalIndex.read(ws, key)
        _, dedup = read_layer_index(ws, key, "dedup_clusters")
        parted = PartedTable.read(ws.cas, dedup.output("clusters"), "clusters")
        clusters = parted.relation(VerifiedFiles(ws.cas), "clusters")
        con.register("old", old_splits(ws, key))
        members = searched_records(clusters, "old")
        scan = HeldoutScan.open(ws, canonical.chunks(), dedup)
        cpu, rss = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        pairs, stats = scan.pairs(con, members)
        step_cpu = time.process_time() - cpu
        step_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"new step: {step_cpu:.1f} CPU-s, peak RSS {step_rss:.0f} MB (was {rss / 1024:.0f})")
        print(f"  search counts: {stats}")
        rows, ids, splits = member_positions(scan, con, members)
        leak = dict(
            con.sql(
                f"SELECT record_id, leakage_id FROM {clusters} WHERE verdict <> 'excluded'"
            ).fetchall()
        )
        cpu = time.process_time()
        prints = fingerprint_rows(TextLookup(ws, canonical.chunks()), scan.spec, rows)
        heldout = np.flatnonzero(splits != TRAIN)
        truth = exhaustive(prints, heldout, scan.thresholds[rows])
        base_cpu = time.process_time() - cpu
        published = _after(con, ws, key, clusters)
    id_list = ids.to_pylist()
    by_id = {rid: n for n, rid in enumerate(id_list)}
    new = {
        (min(by_id[a], by_id[b]), max(by_id[a], by_id[b]))
        for a, b in zip(pairs["record_a"].to_pylist(), pairs["record_b"].to_pylist(), strict=True)
    }
    old = {(i, j) for i, j in truth if leak[id_list[i]] == leak[id_list[j]]}
    straddled = [(i, j) for i, j in truth if splits[i] != splits[j]]
    after = sum(published[id_list[i]] != published[id_list[j]] for i, j in truth)
    n = len(truth)
    print(f"records searched {len(rows)} (members and removed copies), held out {len(heldout)}")
    print(f"pairs at J >= threshold with a held-out side (exhaustive): {n}")
    print(f"recall new search: {len(new & truth) / n if n else 1:.3f} ({len(new & truth)}/{n})")
    print(
        f"recall old path (same leakage component): {len(old) / n if n else 1:.4f} ({len(old)}/{n})"
    )
    print(f"pairs in two splits before the held-out rule: {len(straddled)}; after: {after}")
    print(f"baseline exhaustive scan: {base_cpu:.1f} CPU-s; new step {step_cpu:.1f} CPU-s")
    print(f"new step / whole build CPU: {step_cpu / build['cpu']:.3f}")
    if (n and len(new & truth) != n) or after:
        sys.exit("held-out recall below 1.000 or a pair still straddles")


def _after(con, ws, key: str, clusters: str) -> dict[str, str]:
    """record id -> split in the published snapshot (a removed copy: its representative's)."""
    _, index = read_layer_index(ws, key, "splits")
    table = get_table(ws.cas, index.output("splits"), "splits").select(["record_id", "split"])
    con.register("published", table)
    rows = con.sql(f"SELECT record_id, split FROM ({searched_records(clusters, 'published')})")
    return dict(rows.fetchall())


if __name__ == "__main__":
    main()
