"""dedup_clusters: exact dedup on dedup-normalised text with a stable representative.

The dedup key is its own hash (not the record digest), computed at canonicalisation from the
dedup-normalised text: prose collapses whitespace and case, code keeps its indentation. Within a
cluster the representative is the first record in a stated total order - (config source order,
record_id) - never the order in which chunks happened to finish. Every removed record keeps its
own row pointing at its representative, so source lineage survives dedup. Records revoked by a
tombstone at or below the freeze's watermark are excluded here, before representatives are chosen.
"""

import hashlib

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.freeze import freeze
from corpus_assets.core.layers import LayerResult, publish_table_layer, read_index
from corpus_assets.core.lineage import tombstone_matches
from corpus_assets.core.normalize import dedup_normalize
from corpus_assets.core.records import load_records
from corpus_assets.core.workspace import Workspace

CODE = "dedup_clusters.exact.v1"
CLUSTER_COLUMNS = pa.schema(
    [
        ("record_id", pa.string()),
        ("source_id", pa.string()),
        ("object", pa.string()),
        ("line", pa.int64()),
        ("group_id", pa.string()),
        ("dedup_key", pa.string()),
        ("representative_id", pa.string()),
        ("is_representative", pa.bool_()),
        ("excluded", pa.string()),
    ]
)


def dedup_key(text: str, kind: str = "prose") -> str:
    """sha256 of the dedup-normalised text (prose and code normalise differently)."""
    return "sha256:" + hashlib.sha256(dedup_normalize(text, kind).encode("utf-8")).hexdigest()


def cluster(
    records: pa.Table, source_order: dict[str, int], revoked: dict[int, str] | None = None
) -> pa.Table:
    """One row per canonical record, sorted by (record_id, object, line), naming its cluster's
    representative.

    Order is (config source order, record_id, object, line). A record id seen again later in
    that order is excluded as a duplicate id (record ids must be unique in a snapshot), and
    ``revoked`` rows (tombstoned: row index -> reason) take no part either, so a revoked
    representative hands its cluster to the next record. Excluded rows keep their row with an
    empty representative and the reason in ``excluded``.
    """
    excluded = dict(revoked or {})
    columns = {
        c: records.column(c).to_pylist()
        for c in ("record_id", "source_id", "object", "line", "group_id")
    }
    ids, objects, lines = columns["record_id"], columns["object"], columns["line"]
    keys = records.column("dedup_key").to_pylist()  # computed per record kind at canonicalisation
    order = sorted(
        range(len(ids)),
        key=lambda i: (source_order[columns["source_id"][i]], ids[i], objects[i], lines[i]),
    )
    first_of: dict[str, int] = {}
    for i in order:
        first = first_of.setdefault(ids[i], i)
        if first != i:
            excluded.setdefault(
                i, f"duplicate record_id (first at {objects[first]} line {lines[first]})"
            )
    representative: dict[str, int] = {}
    for i in order:
        if i not in excluded:
            representative.setdefault(keys[i], i)
    rows = sorted(range(len(ids)), key=lambda i: (ids[i], objects[i], lines[i]))
    reps = [None if i in excluded else representative[keys[i]] for i in rows]
    return pa.Table.from_pydict(
        {
            **{c: [values[i] for i in rows] for c, values in columns.items()},
            "dedup_key": [keys[i] for i in rows],
            "representative_id": ["" if r is None else ids[r] for r in reps],
            "is_representative": [r == i for i, r in zip(rows, reps, strict=True)],
            "excluded": [excluded.get(i, "") for i in rows],
        },
        schema=CLUSTER_COLUMNS,
    )


def build_dedup_clusters(ws: Workspace, partition_key: str) -> LayerResult:
    canonical_ref, canonical = read_index(ws, partition_key, "canonical_records")
    records = load_records(
        ws, canonical, ["record_id", "source_id", "object", "line", "group_id", "dedup_key"]
    )
    order = {s.id: n for n, s in enumerate(ws.config.sources)}
    _, spec = freeze(ws, partition_key)
    revoked = tombstone_matches(ws.catalog, int(spec["tombstoneWatermark"]), records)
    table = cluster(records, order, revoked)
    kept = sum(table.column("is_representative").to_pylist())
    clusters = len(set(table.column("dedup_key").to_pylist()))
    excluded = sum(1 for e in table.column("excluded").to_pylist() if e)
    counts = {
        "records": table.num_rows,
        "kept": kept,
        "removed": table.num_rows - kept - excluded,
        "tombstoned": len(revoked),
        "duplicate_ids": excluded - len(revoked),
        "clusters": clusters,
    }
    removed = table.filter(pc.invert(table.column("is_representative")))
    return publish_table_layer(
        ws,
        partition_key,
        layer="dedup_clusters",
        code=CODE,
        policy="dedup",
        inputs=[canonical_ref],
        name="clusters",
        table=table,
        counts=counts,
        preview=removed.select(["record_id", "representative_id"]).slice(0, 10).to_pylist(),
    )
