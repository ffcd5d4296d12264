"""Dedup of one in-memory table end to end: the clusters table, the near-dedup report and the
edges. The layer streams the same tables from a :class:`PartitionDb` over the chunk files; this
front serves tests and small callers."""

import tempfile
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa

from corpus_assets.core.dedup.clusters import (
    CLUSTER_COLUMNS,
    cluster_batches,
    decide,
    join_clusters,
    write_decisions,
)
from corpus_assets.core.dedup.edges import edge_table
from corpus_assets.core.dedup.near_stage import NearStage
from corpus_assets.core.dedup.partition_db import PartitionDb
from corpus_assets.core.dedup.report import NearReport


class Clustered(NamedTuple):
    table: pa.Table  # one row per record, sorted by record_id, object, line
    report: NearReport | None
    edges: pa.Table  # every exact and verified near edge (EDGE_COLUMNS), sorted


def cluster(
    records: pa.Table,
    source_order: dict[str, int],
    revoked: dict[int, str] | None = None,
    near: NearStage | None = None,
) -> Clustered:
    """The dedup table, the near-dedup report and the edges that justify the leakage groups.

    ``records`` needs record_id, source_id, object, line, group_id, kind, dedup_key and length
    (or text) columns, in the row order the signatures of ``near`` were computed in. The layer
    streams the same tables from a :class:`PartitionDb` over the chunk files instead.
    """
    with tempfile.TemporaryDirectory() as tmp:
        with PartitionDb.from_table(records) as db:
            decided = decide(db, source_order, revoked, near)
            edges = edge_table(db, decided.edges)
            path = join_clusters(db, write_decisions(decided, Path(tmp)), Path(tmp))
        table = pa.Table.from_batches(list(cluster_batches(path)), CLUSTER_COLUMNS)
        return Clustered(table.combine_chunks(), decided.report, edges)
