"""The freeze: the consistent boundary a partition names, and the raw_snapshot layer built on it.

Order matters (seed 001): read the tombstone watermark and benchmark fence first, then pin every
source (object versions and bytes, CDC high watermarks). The spec is written once per partition
key; re-materializing reuses it, so every later layer sees exactly the same inputs. A freeze whose
sources could not give a consistent boundary (a CDC offset gap) records why in ``incomplete``, and
validation moves its snapshot to INCOMPLETE instead of publishing it.
"""

from typing import Any

from corpus_assets.core.governance import gate
from corpus_assets.core.ingest.pinning import pin_source
from corpus_assets.core.ingest.sources import fingerprint
from corpus_assets.core.runtime.layers import LayerResult, publish_index
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import (
    JSON,
    NDJSON,
    PARQUET,
    Ref,
    get_json,
    make_ref,
    put_json,
)

FREEZE_SCHEMA = "corpus.freeze.v1"
CODE = "raw_snapshot.v2"
MEDIA = {"jsonl": NDJSON, "parquet": PARQUET}


def freeze(ws: Workspace, partition_key: str) -> tuple[Ref, dict[str, Any]]:
    """Return the partition's freeze spec, creating it on first use."""
    existing = ws.catalog.freeze_digest(partition_key)
    if existing is None:
        listing_fingerprint = fingerprint(ws.loaded)
        ref = put_json(ws.cas, _take_freeze(ws, partition_key))
        existing = ws.catalog.record_freeze(partition_key, ref["digest"], listing_fingerprint)
    spec = get_json(ws.cas, existing, "freeze spec")
    return make_ref(existing, JSON, ws.cas.size(existing)), spec


def _take_freeze(ws: Workspace, partition_key: str) -> dict[str, Any]:
    config = ws.config
    fence = gate.read_gate(ws.catalog, config.alias)  # first: the revocation boundary
    pinned = [pin_source(ws, source) for source in config.sources]
    return {
        "schema": FREEZE_SCHEMA,
        "partition": partition_key,
        "alias": config.alias,
        "purpose": config.purpose,
        "tombstoneWatermark": str(fence.tombstone_watermark),
        "benchmarkFence": str(fence.benchmark_fence),
        "parents": [fence.active_snapshot] if fence.active_snapshot else [],
        "sources": [p.spec for p in pinned],
        "incomplete": [reason for p in pinned for reason in p.incomplete],
        "config": {
            "sources": [s.model_dump(mode="json") for s in config.sources],
            "policies": {
                name: config.policy_digest(name) for name in type(config.policies).model_fields
            },
        },
    }


def pinned_objects(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """(source, name, format, ref) of every pinned object, in source then name order."""
    return [
        {
            "source": source["id"],
            "name": entry["name"],
            "format": entry["format"],
            "object": make_ref(entry["sha256"], MEDIA[entry["format"]], entry["size"]),
        }
        for source in spec["sources"]
        for entry in source["objects"]
    ]


def build_raw_snapshot(ws: Workspace, partition_key: str) -> LayerResult:
    """Pin the freeze and publish an index of the CAS copies later layers may read."""
    freeze_ref, spec = freeze(ws, partition_key)
    objects = pinned_objects(spec)
    for item in objects:
        ws.cas.verify(item["object"]["digest"], f"raw object {item['source']}/{item['name']}")
    counts = {
        "objects": len(objects),
        "bytes": sum(o["object"]["size"] for o in objects),
        "unversioned_objects": sum(1 for o in objects if not o["object"]["digest"]),
        "deferred_changes": sum(len(s.get("deferred", [])) for s in spec["sources"]),
        "incomplete": len(spec["incomplete"]),
    }
    ref = publish_index(
        ws, partition_key, "raw_snapshot", CODE, None, [], {"objects": objects}, counts
    )
    return LayerResult(
        layer="raw_snapshot",
        digest=ref["digest"],
        counts=counts,
        preview=source_table(ws, partition_key, spec),
        digests={"freeze": freeze_ref["digest"]},
    )


def source_table(ws: Workspace, partition_key: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Per source: objects, bytes, versions, watermark, and new/unchanged/removed vs the parent
    freeze (the partition frozen just before this one)."""
    previous = ws.catalog.previous_freeze(partition_key)
    before: dict[str, dict[str, str]] = {}
    if previous is not None:
        for source in get_json(ws.cas, previous, "parent freeze spec")["sources"]:
            before[source["id"]] = {o["name"]: o["sha256"] for o in source["objects"]}
    rows = []
    for source in spec["sources"]:
        now = {o["name"]: o["sha256"] for o in source["objects"]}
        old = before.get(source["id"], {})
        rows.append(
            {
                "source": source["id"],
                "kind": source["kind"],
                "objects": len(now),
                "bytes": sum(o["size"] for o in source["objects"]),
                "versioned": sum(
                    1 for o in source["objects"] if "etag" in o or "lastModified" in o
                ),
                "watermark": source.get("watermark", ""),
                "new": sum(1 for n, d in now.items() if old.get(n) != d),
                "unchanged": sum(1 for n, d in now.items() if old.get(n) == d),
                "removed": sum(1 for n in old if n not in now),
                "deferred": len(source.get("deferred", [])),
                "gaps": len(source.get("gaps", [])),
            }
        )
    return rows
