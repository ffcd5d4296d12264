"""The child's splits layer with a parent search state, on a race root whose parent was built by
code that stored none: the parent's state is computed first (a full search over its published
splits, untimed), then the child's splits layer runs and its CPU is measured. Usage:

    .venv/bin/python bench/heldout_state_bench.py DEST/corpus.yaml race-p1 [--full]

``--full`` runs the layer without the state (the from-scratch search) for comparison; both
print the layer's digests, which must be equal.
"""

import argparse
import json
import time

import duckdb
import pyarrow.compute as pc

from corpus_assets.core.governance import states
from corpus_assets.core.ingest.freeze import freeze
from corpus_assets.core.pipeline import BUILDERS
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_json
from corpus_assets.core.storage.cas_queries import VerifiedFiles, cas_parquet
from corpus_assets.core.training_view.splits import HeldoutScan, searched_records
from corpus_assets.core.training_view.splits import build as splits
from corpus_assets.core.training_view.splits.heldout_state import PriorSearch, row_map


def parent_state(ws: Workspace, partition: str) -> PriorSearch:
    """The parent's search over its published splits, as the child's prior."""
    parent = freeze(ws, partition)[1].parents[0]
    manifest = get_json(ws.cas, states.get(ws.catalog, parent).manifest_digest, "manifest")
    layers = manifest["layers"]
    chunks = CanonicalIndex.load(ws.cas, layers["canonical_records"]).chunks()
    dedup = load_index(ws.cas, layers["dedup_clusters"], "dedup_clusters")
    index = load_index(ws.cas, layers["splits"], "splits")
    scan = HeldoutScan.open(ws, chunks, dedup)
    assert scan is not None
    with duckdb.connect() as con:
        table = cas_parquet(ws.cas, index.output("splits"), "splits")
        con.execute(f"CREATE TABLE final AS SELECT record_id, split FROM {table}")
        parted = PartedTable.read(ws.cas, dedup.output("clusters"), "clusters")
        clusters = parted.relation(VerifiedFiles(ws.cas), "clusters")
        _, _, state = scan.searched(con, searched_records(clusters, "final"))
    child = CanonicalIndex.read(ws, partition)[1].chunks()
    partners = state["partners"].combine_chunks()
    return PriorSearch(
        row_map(chunks, child),
        state["status"].to_numpy(),
        pc.list_parent_indices(partners).to_numpy().astype("int64"),
        pc.list_flatten(partners).to_numpy(),
        pc.list_flatten(state["jaccards"].combine_chunks()).to_numpy(),
    )


def _vm_hwm_kb() -> int:
    """The process's peak resident set (it includes the untimed parent search)."""
    with open("/proc/self/status") as fh:
        return next((int(line.split()[1]) for line in fh if line.startswith("VmHWM:")), 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("partition")
    parser.add_argument("--full", action="store_true")
    args = parser.parse_args()
    with open_workspace(args.config) as ws:
        if not args.full:
            prior = parent_state(ws, args.partition)
            splits.prior_search = lambda *_: (prior, "bench")  # type: ignore[assignment]
        wall, cpu = time.perf_counter(), time.process_time()
        result = BUILDERS["splits"](ws, args.partition)  # as bench/race.py --child runs it
        search = result.details["heldout_search"]
        print(
            json.dumps(
                {
                    "wall": time.perf_counter() - wall,
                    "cpu": time.process_time() - cpu,
                    "peak_mb": _vm_hwm_kb() / 1024,
                    "state": search.get("state"),
                    "reused": search.get("reused"),
                    "candidates": search.get("candidates"),
                    "digests": result.digests,
                }
            )
        )


if __name__ == "__main__":
    main()
