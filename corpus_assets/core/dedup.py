"""dedup_clusters: exact dedup on dedup-normalised text with a stable representative.

The dedup key is its own hash (not the record digest): NFC text with CRLF/CR turned into LF and
trailing whitespace removed per line, so code indentation still counts. Within a cluster the
representative is the first record in a stated total order - (config source order, record_id) -
never the order in which chunks happened to finish. Every removed record keeps its own row
pointing at its representative, so source lineage survives dedup.
"""

import hashlib
import unicodedata

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.layers import LayerResult, publish_table_layer, read_index
from corpus_assets.core.records import load_records
from corpus_assets.core.workspace import Workspace

CODE = "dedup_clusters.exact.v1"
CLUSTER_COLUMNS = pa.schema(
    [
        ("record_id", pa.string()),
        ("source_id", pa.string()),
        ("dedup_key", pa.string()),
        ("representative_id", pa.string()),
        ("is_representative", pa.bool_()),
    ]
)


def dedup_key(text: str) -> str:
    normalised = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    normalised = "\n".join(line.rstrip() for line in normalised.split("\n")).strip("\n")
    return "sha256:" + hashlib.sha256(normalised.encode("utf-8")).hexdigest()


def cluster(records: pa.Table, source_order: dict[str, int]) -> pa.Table:
    """One row per record, sorted by record_id, naming its cluster's representative."""
    ids = records.column("record_id").to_pylist()
    sources = records.column("source_id").to_pylist()
    keys = [dedup_key(t) for t in records.column("text").to_pylist()]
    order = sorted(range(len(ids)), key=lambda i: (source_order[sources[i]], ids[i]))
    representative: dict[str, str] = {}
    for i in order:
        representative.setdefault(keys[i], ids[i])
    rows = sorted(range(len(ids)), key=lambda i: ids[i])
    reps = [representative[keys[i]] for i in rows]
    return pa.Table.from_pydict(
        {
            "record_id": [ids[i] for i in rows],
            "source_id": [sources[i] for i in rows],
            "dedup_key": [keys[i] for i in rows],
            "representative_id": reps,
            "is_representative": [ids[i] == rep for i, rep in zip(rows, reps, strict=True)],
        },
        schema=CLUSTER_COLUMNS,
    )


def build_dedup_clusters(ws: Workspace, partition_key: str) -> LayerResult:
    canonical_ref, canonical = read_index(ws, partition_key, "canonical_records")
    records = load_records(ws, canonical)
    order = {s.id: n for n, s in enumerate(ws.config.sources)}
    table = cluster(records, order)
    kept = sum(table.column("is_representative").to_pylist())
    clusters = len(set(table.column("dedup_key").to_pylist()))
    counts = {
        "records": table.num_rows,
        "kept": kept,
        "removed": table.num_rows - kept,
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
