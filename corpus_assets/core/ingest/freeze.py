"""The freeze: the consistent boundary a partition names, and the raw_snapshot layer built on it.

Order matters: read the tombstone watermark and benchmark fence first, then pin every
source (object versions and bytes, CDC high watermarks). The spec is written once per partition
key; re-materializing reuses it, so every later layer sees exactly the same inputs. A freeze whose
sources could not give a consistent boundary (a CDC offset gap) records why in ``incomplete``, and
validation moves its snapshot to INCOMPLETE instead of publishing it.
"""

from typing import Any

from corpus_assets.core.governance import alias_gate
from corpus_assets.core.ingest.freeze_spec import (
    FREEZE_SCHEMA,
    ChangelogSourceSpec,
    FreezeSpec,
    FrozenConfig,
    ObjectsSourceSpec,
)
from corpus_assets.core.ingest.pinning import pin_source
from corpus_assets.core.ingest.sources import fingerprint
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layer_index import LayerResult, publish_index
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import (
    JSON,
    NDJSON,
    PARQUET,
    Ref,
    make_ref,
    put_json,
)
from corpus_assets.core.storage.trust import StatTrust

CODE = stage_code("raw_snapshot.v2", __name__)  # the freeze + pinning closure, hashed at import
MEDIA = {"jsonl": NDJSON, "parquet": PARQUET}


def freeze(ws: Workspace, partition_key: str) -> tuple[Ref, FreezeSpec]:
    """Return the partition's freeze spec, taking it on first use (written once per partition)."""
    existing = ws.catalog.freeze_digest(partition_key)
    if existing is None:
        listing_fingerprint = fingerprint(ws.loaded)
        ref = put_json(ws.cas, _take_freeze(ws, partition_key).document())
        existing = ws.catalog.record_freeze(partition_key, ref["digest"], listing_fingerprint)
    return make_ref(existing, JSON, ws.cas.size(existing)), FreezeSpec.load(ws.cas, existing)


def _take_freeze(ws: Workspace, partition_key: str) -> FreezeSpec:
    config = ws.config
    fence = alias_gate.read_alias_gate(ws.catalog, config.alias)  # first: the revocation boundary
    pinned = [pin_source(ws, source) for source in config.sources]
    return FreezeSpec(
        schema_id=FREEZE_SCHEMA,
        partition=partition_key,
        alias=config.alias,
        purpose=config.purpose,
        tombstone_watermark=fence.tombstone_watermark,
        benchmark_fence=fence.benchmark_fence,
        parents=[fence.active_snapshot] if fence.active_snapshot else [],
        sources=[p.spec for p in pinned],
        incomplete=[reason for p in pinned for reason in p.incomplete],
        config=FrozenConfig(
            sources=[s.model_dump(mode="json") for s in config.sources],
            policies={
                name: config.policy_digest(name) for name in type(config.policies).model_fields
            },
        ),
    )


def pinned_objects(spec: FreezeSpec) -> list[dict[str, Any]]:
    """(source, name, format, ref) of every pinned object, in source then name order."""
    return [
        {
            "source": source_id,
            "name": entry.name,
            "format": entry.format,
            "object": make_ref(entry.sha256, MEDIA[entry.format], entry.size),
        }
        for source_id, entry in spec.pinned()
    ]


def build_raw_snapshot(ws: Workspace, partition_key: str) -> LayerResult:
    """Pin the freeze and publish an index of the CAS copies later layers may read."""
    freeze_ref, spec = freeze(ws, partition_key)
    objects = pinned_objects(spec)
    # every pinned object re-hashed, but for a file unchanged since it last hashed right
    StatTrust(ws.cas, ws.catalog).verify_all(
        {o["object"]["digest"]: f"raw object {o['source']}/{o['name']}" for o in objects}
    )
    counts = {
        "objects": len(objects),
        "bytes": sum(o["object"]["size"] for o in objects),
        "deferred_changes": sum(
            len(s.deferred) for s in spec.sources if isinstance(s, ObjectsSourceSpec)
        ),
        "incomplete": len(spec.incomplete),
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


def source_table(ws: Workspace, partition_key: str, spec: FreezeSpec) -> list[dict[str, Any]]:
    """Per source: objects, bytes, versions, watermark, and new/unchanged/removed vs the parent
    freeze (the partition frozen just before this one)."""
    previous = ws.catalog.previous_freeze(partition_key)
    before: dict[str, dict[str, str]] = {}
    if previous is not None:
        for source in FreezeSpec.load(ws.cas, previous, "parent freeze spec").sources:
            before[source.id] = {o.name: o.sha256 for o in source.objects}
    rows = []
    for source in spec.sources:
        now = {o.name: o.sha256 for o in source.objects}
        old = before.get(source.id, {})
        if isinstance(source, ChangelogSourceSpec):
            watermark, deferred, gaps = str(source.watermark), 0, len(source.gaps)
        else:
            watermark, deferred, gaps = "", len(source.deferred), 0
        rows.append(
            {
                "source": source.id,
                "kind": source.kind,
                "objects": len(now),
                "bytes": sum(o.size for o in source.objects),
                "versioned": sum(
                    1 for o in source.objects if o.etag is not None or o.last_modified is not None
                ),
                "watermark": watermark,
                "new": sum(1 for n, d in now.items() if old.get(n) != d),
                "unchanged": sum(1 for n, d in now.items() if old.get(n) == d),
                "removed": sum(1 for n in old if n not in now),
                "deferred": deferred,
                "gaps": gaps,
            }
        )
    return rows
