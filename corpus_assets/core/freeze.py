"""The freeze: the consistent boundary a partition names, and the raw_snapshot layer built on it.

Order matters (seed 001): read the tombstone watermark and benchmark fence first, then pin every
source object by the sha256 of the bytes actually copied into the CAS. The spec is written once per
partition key; re-materializing reuses it, so every later layer sees exactly the same inputs.
"""

from typing import Any

from corpus_assets.core import gate
from corpus_assets.core.artifacts import JSON, Ref, get_json, make_ref, put_json
from corpus_assets.core.layers import LayerResult, publish_index
from corpus_assets.core.sources import fingerprint, list_objects
from corpus_assets.core.workspace import Workspace

FREEZE_SCHEMA = "corpus.freeze.v1"
CODE = "raw_snapshot.v1"


def freeze(ws: Workspace, partition_key: str) -> tuple[Ref, dict[str, Any]]:
    """Return the partition's freeze spec, creating it on first use."""
    existing = ws.catalog.freeze_digest(partition_key)
    if existing is None:
        spec = _take_freeze(ws, partition_key)
        ref = put_json(ws.cas, spec)
        existing = ws.catalog.record_freeze(partition_key, ref["digest"], spec["fingerprint"])
    return make_ref(existing, JSON, ws.cas.size(existing)), get_json(
        ws.cas, existing, "freeze spec"
    )


def _take_freeze(ws: Workspace, partition_key: str) -> dict[str, Any]:
    config = ws.config
    fence = gate.read_gate(ws.catalog, config.alias)
    print_fp = fingerprint(ws.loaded)
    sources = []
    for source in config.sources:
        pinned = []
        for listed in list_objects(ws.loaded, source):
            digest, size = ws.cas.put_file(listed.path)
            pinned.append({"name": listed.name, "sha256": digest, "size": size})
        sources.append({"id": source.id, "kind": source.kind, "objects": pinned})
    return {
        "schema": FREEZE_SCHEMA,
        "partition": partition_key,
        "alias": config.alias,
        "purpose": config.purpose,
        "tombstoneWatermark": str(fence.tombstone_watermark),
        "benchmarkFence": str(fence.benchmark_fence),
        "parents": [fence.active_snapshot] if fence.active_snapshot else [],
        "fingerprint": print_fp,
        "sources": sources,
        "config": {
            "sources": [s.model_dump(mode="json") for s in config.sources],
            "policies": {
                name: config.policy_digest(name) for name in type(config.policies).model_fields
            },
        },
    }


def build_raw_snapshot(ws: Workspace, partition_key: str) -> LayerResult:
    """Pin the freeze and publish an index of the CAS copies later layers may read."""
    freeze_ref, spec = freeze(ws, partition_key)
    objects = []
    for source in spec["sources"]:
        for pinned in source["objects"]:
            ws.cas.verify(pinned["sha256"], f"raw object {source['id']}/{pinned['name']}")
            objects.append(
                {
                    "source": source["id"],
                    "name": pinned["name"],
                    "object": make_ref(pinned["sha256"], "application/x-ndjson", pinned["size"]),
                }
            )
    counts = {"objects": len(objects), "bytes": sum(o["object"]["size"] for o in objects)}
    ref = publish_index(
        ws, partition_key, "raw_snapshot", CODE, None, [], {"objects": objects}, counts
    )
    return LayerResult(
        layer="raw_snapshot",
        digest=ref["digest"],
        counts=counts,
        preview=[
            {
                "source": o["source"],
                "name": o["name"],
                "sha256": o["object"]["digest"],
                "bytes": o["object"]["size"],
            }
            for o in objects[:10]
        ],
        digests={"freeze": freeze_ref["digest"]},
    )
