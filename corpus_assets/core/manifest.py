"""manifest: the ``training.dataset.snapshot.v1`` contract a training run names by digest.

snapshotId = sha256 of the RFC 8785 payload with ``snapshotId`` and ``signature`` removed, so the
manifest can carry its own id without referring to itself. It enumerates facts, not queries: the
freeze (pinned object digests, watermarks), every layer index, the policy digests and the members
table (stable record id, source object, line, record digest, split) in the CAS.
"""

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core import states
from corpus_assets.core.artifacts import get_table, put_json, put_table
from corpus_assets.core.digests import json_digest
from corpus_assets.core.freeze import freeze
from corpus_assets.core.layers import LAYERS, LayerResult, read_index
from corpus_assets.core.records import load_records, record_schema_digest
from corpus_assets.core.workspace import Workspace

MANIFEST_SCHEMA = "training.dataset.snapshot.v1"
SELF_EXCLUDED = ("snapshotId", "signature")
MEMBER_COLUMNS = ["record_id", "source_id", "object", "line", "record_digest", "group_id", "split"]


def snapshot_id(manifest: dict[str, Any]) -> str:
    return json_digest({k: v for k, v in manifest.items() if k not in SELF_EXCLUDED})


def members_table(ws: Workspace, canonical: dict[str, Any], splits: dict[str, Any]) -> pa.Table:
    split_table = get_table(ws.cas, splits["outputs"]["splits"], "splits table")
    records = load_records(ws, canonical).drop_columns(["text", "group_id"])
    records = records.filter(
        pc.is_in(records.column("record_id"), value_set=split_table.column("record_id"))
    )
    joined = records.join(split_table, "record_id", join_type="inner")
    return joined.select(MEMBER_COLUMNS).sort_by("record_id")


def build_manifest(ws: Workspace, partition_key: str) -> LayerResult:
    freeze_ref, spec = freeze(ws, partition_key)
    indexes = {layer: read_index(ws, partition_key, layer) for layer in LAYERS[:-1]}
    members = members_table(ws, indexes["canonical_records"][1], indexes["splits"][1])
    members_ref = put_table(ws.cas, members)
    config = ws.config
    manifest: dict[str, Any] = {
        "schema": MANIFEST_SCHEMA,
        "partition": partition_key,
        "parents": spec["parents"],
        "purpose": spec["purpose"],
        "alias": spec["alias"],
        "freeze": freeze_ref,
        "sources": [
            {
                "id": s["id"],
                "kind": s["kind"],
                "objects": str(len(s["objects"])),
                "pinned": json_digest(s["objects"]),
            }
            for s in spec["sources"]
        ],
        "tombstoneWatermark": spec["tombstoneWatermark"],
        "benchmarkFence": spec["benchmarkFence"],
        "recordSchema": record_schema_digest(),
        "selectionPolicy": config.policy_digest("dedup"),
        "splitPolicy": config.policy_digest("splits"),
        "mixingPolicy": config.policy_digest("mixing"),
        "packingPolicy": config.policy_digest("packing"),
        "transform": {layer: index["code"] for layer, (_, index) in indexes.items()},
        "layers": {layer: ref for layer, (ref, _) in indexes.items()},
        "members": {
            "uri": ws.cas.uri(members_ref["digest"]),
            **members_ref,
            "count": members.num_rows,
        },
        "counts": {
            "records": indexes["canonical_records"][1]["counts"]["records"],
            "quarantined": indexes["canonical_records"][1]["counts"]["quarantined"],
            "duplicates_removed": indexes["dedup_clusters"][1]["counts"]["removed"],
            "members": members.num_rows,
            "train": indexes["splits"][1]["counts"]["train"],
            "validation": indexes["splits"][1]["counts"]["validation"],
            "test": indexes["splits"][1]["counts"]["test"],
            "blocks": indexes["packed_blocks"][1]["counts"]["blocks"],
            "tokens": indexes["packed_blocks"][1]["counts"]["tokens"],
        },
    }
    manifest["snapshotId"] = snapshot_id(manifest)
    manifest_ref = put_json(ws.cas, manifest)
    ws.catalog.set_layer_output(partition_key, "manifest", manifest_ref["digest"], MANIFEST_SCHEMA)
    snapshot = states.register(
        ws.catalog, manifest["snapshotId"], partition_key, manifest_ref["digest"], config.alias
    )
    return LayerResult(
        layer="manifest",
        digest=manifest_ref["digest"],
        counts=dict(manifest["counts"]),
        preview=members.slice(0, 10).to_pylist(),
        digests={
            "snapshotId": manifest["snapshotId"],
            "members": members_ref["digest"],
            "state": snapshot.state,
        },
    )
