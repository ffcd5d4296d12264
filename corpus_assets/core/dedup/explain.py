"""Why dedup kept or removed one record of a snapshot (``corpus-assets dedup``, record lineage).

A query, not part of the layer: it lives outside ``dedup/dedup_clusters.py`` so that changing how an
answer is read never changes the code identity of the layer that wrote the table. The splits
table and each part of the clusters table (one table stored whole, or one part per canonical
chunk) are sorted by record id, so the record's row (in every part) and its group's splits are
found by row-group bisection; its cluster and leakage group (columns the table is not sorted by)
by one streamed scan of the few columns they need, in record order whatever the parts.
Nothing holds a whole table.
"""

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.dedup.order import RECORD_ORDER
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import Manifest
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.storage.table_lookup import scan, sorted_rows

CLUSTER_COLUMNS = ["record_id", "source_id", "verdict", "match_id", "match_jaccard"]


def explain(
    cas: ContentStore,
    manifest: Manifest,
    record_id: str,
    files: VerifiedFiles | None = None,
) -> dict[str, Any]:
    """Why a record of a snapshot was kept or removed: its row, every record standing behind
    the same representative, and its leakage group with each kept member's split. ``KeyError``
    naming the record and snapshot when the dedup table has no row for it."""
    files = files or VerifiedFiles(cas)
    layers = manifest.layers
    dedup = load_index(cas, layers["dedup_clusters"], "dedup_clusters")
    table = PartedTable.read(cas, dedup.output("clusters"), "dedup clusters")
    clusters = table.paths(files, "dedup clusters")
    row = record_row(clusters, record_id)
    if row is None:
        raise KeyError(f"record {record_id!r} is not in snapshot {manifest.snapshot_id}")
    representative, leakage = row["representative_id"], row["leakage_id"]
    near = related_rows(clusters, representative, leakage)
    cluster = near.filter(pc.equal(near.column("representative_id"), representative or ""))
    group = near.filter(pc.equal(near.column("leakage_id"), leakage))
    splits_index = load_index(cas, layers["splits"], "splits")
    splits = files.path(splits_index.output("splits")["digest"], "splits table")
    ids = group.column("record_id").to_pylist()
    found = sorted_rows(splits, "record_id", ids, ["split"]).to_pylist()
    split_of = {r["record_id"]: r["split"] for r in found}
    return {
        "record": row,
        "cluster": cluster.select(CLUSTER_COLUMNS).to_pylist() if representative else [],
        "leakage_group": {
            "id": leakage,
            "records": [
                {**r, "split": split_of.get(r["record_id"])}
                for r in group.select(["record_id", "verdict"]).to_pylist()
            ],
        },
    }


def record_row(parts: list[str], record_id: str) -> dict[str, Any] | None:
    """The record's clusters row, found by bisection in every part (each is sorted by record
    id, their concatenation need not be): of a record id on two rows, the first by object and
    line, as in a table stored whole. None when no part holds it."""
    found = [sorted_rows(path, "record_id", [record_id], dedup_columns(path)) for path in parts]
    rows = in_record_order(pa.concat_tables(found, promote_options="default")) if found else None
    return rows.slice(0, 1).to_pylist()[0] if rows is not None and rows.num_rows else None


def related_rows(parts: list[str], representative: str | None, leakage: str) -> pa.Table:
    """The rows standing behind ``representative`` or in leakage group ``leakage``, by one
    streamed scan of every part (neither column is a sort key), in record order."""

    def related(batch: pa.RecordBatch) -> pa.Array:
        same_group = pc.equal(batch.column("leakage_id"), leakage)
        if not representative:  # an excluded row stands behind no representative
            return same_group
        return pc.or_kleene(pc.equal(batch.column("representative_id"), representative), same_group)

    wanted = [*CLUSTER_COLUMNS, "representative_id", "leakage_id", *RECORD_ORDER]
    found = []
    for path in parts:
        present = set(dedup_columns(path))  # an older table may lack object and line
        found.append(scan(path, [c for c in wanted if c in present], related))
    return in_record_order(pa.concat_tables(found, promote_options="default"))


def in_record_order(rows: pa.Table) -> pa.Table:
    """``rows`` stably sorted by record id, object and line (those it has; nulls last): the
    order of a clusters table stored whole, which chunk parts keep only each on its own."""
    keys = [(name, "ascending") for name in RECORD_ORDER if name in rows.column_names]
    return rows.take(pc.sort_indices(rows, keys))


def dedup_columns(path: str) -> list[str]:
    """Every column of the clusters table at ``path`` (older tables have fewer)."""
    return list(pq.read_schema(path).names)
