"""manifest: the ``training.dataset.snapshot.v1`` contract a training run names by digest.

snapshotId = sha256 of the RFC 8785 payload with ``snapshotId`` and ``signature`` removed, so the
manifest can carry its own id without referring to itself. It enumerates facts, not queries: the
freeze (pinned object digests, watermarks), every layer index, the policy digests, the tokenizer
the blocks were packed with (by digest, with its special tokens and vocabulary size), the realised
mixture per source and the members table (stable record id, source object, line, record digest,
split) in the CAS.
"""

import json
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

from corpus_assets.core.governance import deletion_index, states
from corpus_assets.core.ingest.freeze import freeze
from corpus_assets.core.ingest.freeze_spec import ChangelogSourceSpec, FreezeSpec
from corpus_assets.core.publication.identity import SELF_EXCLUDED, snapshot_id
from corpus_assets.core.publication.manifest_deletion import changed_objects
from corpus_assets.core.publication.member_parts import (
    MEMBERS_CODE,
    Chunk,
    Parent,
    Written,
    put_member_parts,
    same_clusters_parts,
)
from corpus_assets.core.publication.narrowed import narrowed
from corpus_assets.core.publication.shadow import shadow_diff
from corpus_assets.core.publication.signing import sign_snapshot
from corpus_assets.core.records.index import CanonicalIndex, record_schema_digest
from corpus_assets.core.runtime.layer_index import (
    LAYERS,
    LayerIndex,
    LayerResult,
    load_index,
    read_layer_index,
)
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import (
    MANIFEST_SCHEMA,
    Manifest,
    ManifestError,
    read_manifest,
)
from corpus_assets.core.runtime.transform import transform_image
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage import failpoints
from corpus_assets.core.storage.artifacts import (
    JSON,
    PARQUET,
    Ref,
    make_ref,
    put_json,
)
from corpus_assets.core.storage.cas import CasError
from corpus_assets.core.storage.digests import json_digest
from corpus_assets.core.storage.table_lookup import TrustedFiles
from corpus_assets.core.tokens.spec import resolve_tokenizer
from corpus_assets.core.training_view.splits import SPLITS

Indexes = dict[str, tuple[Ref, LayerIndex]]  # layer -> (ref, index) of the six built layers
MEMBER_LAYERS = ("canonical_records", "dedup_clusters", "splits")  # what members are made of
PREVIEW_ROWS = 10  # the first rows a layer result shows


class BuildConflict(RuntimeError):
    """The same build identity produced different content: nondeterminism, never overwritten."""


def put_members(ws: Workspace, indexes: Indexes, parents: list[str] | None = None) -> Written:
    """The members table put in the CAS as parts (``member_parts``): one row per member
    (stable id, source version, logical digests, split - never the text).

    Members are the dedup representatives the splits layer assigned a split (a record a split
    conflict quarantined is in no split, so no member). DuckDB joins and sorts the layer files
    out of core, and its sorted rows stream into the store a row group at a time. A child
    (``parents``: its parent snapshot first) names its parent's part of every chunk whose
    rows did not change (``member_parts.reusable``)."""
    canonical = CanonicalIndex(ws.cas, indexes["canonical_records"][1])
    files = TrustedFiles(ws.cas, ws.catalog)  # a parent's narrowed chunks: hashed before
    with tempfile.TemporaryDirectory(prefix="members-", dir=_spill(ws)) as tmp:
        records = narrowed(ws, files, canonical, Path(tmp))
        chunks = [
            Chunk(c.key, c.records["digest"], path)
            for c, path in zip(canonical.chunks(), records, strict=True)
        ]
        dedup = indexes["dedup_clusters"][1]
        clusters = PartedTable.read(ws.cas, dedup.output("clusters"), "dedup clusters")
        return put_member_parts(
            ws.cas,
            chunks,
            clusters=clusters.relation(files, "dedup clusters"),
            splits=files.path(indexes["splits"][1].output("splits")["digest"]),
            tmp=Path(tmp),
            parent=parent_members(ws, files, parents or [], dedup),
        )


def parent_members(
    ws: Workspace, files: TrustedFiles, parents: list[str], dedup: LayerIndex | None = None
) -> Parent | None:
    """The parent snapshot's members parts and the tables they were joined from, when this
    code wrote them and all are stored; else None (every chunk is joined). With the child's
    dedup index, also the chunks whose clusters part the child's and the parent's clusters
    tables share, when both are parts (``member_parts.same_clusters_parts``)."""
    if not parents:
        return None
    try:
        parent = read_manifest(ws.cas, states.get(ws.catalog, parents[0]).manifest_digest)
        if parent.members.media == PARQUET:
            return None
        parts = parent.members.parts(ws.cas)
        if parts.code != MEMBERS_CODE:
            return None
        parent_dedup = load_index(ws.cas, parent.layers["dedup_clusters"], "dedup_clusters")
        splits = load_index(ws.cas, parent.layers["splits"], "splits")
        theirs = PartedTable.read(ws.cas, parent_dedup.output("clusters"), "parent dedup clusters")
        same = None
        if dedup is not None:
            ours = PartedTable.read(ws.cas, dedup.output("clusters"), "dedup clusters")
            same = same_clusters_parts(ours, theirs)
        return Parent(
            parts={part.chunk: part for part in parts.parts if ws.cas.contains(part.digest)},
            clusters=theirs.relation(files, "parent dedup clusters"),
            splits=files.path(splits.output("splits")["digest"], "parent splits"),
            clusters_same=same,
        )
    except (CasError, ManifestError, states.StateError):
        return None


def _spill(ws: Workspace) -> Path:
    """The data home's scratch directory (same filesystem as the CAS, so files move in)."""
    spill = ws.home / "tmp"
    spill.mkdir(parents=True, exist_ok=True)
    return spill


def source_versions(spec: FreezeSpec) -> list[dict[str, Any]]:
    """The seed's per-source fields: object versions, or table snapshot + CDC high watermark."""
    out = []
    for source in spec.sources:
        entry = {"id": source.id, "kind": source.kind}
        if isinstance(source, ChangelogSourceSpec):
            entry["tableSnapshot"] = source.objects[0].sha256
            entry["cdcHighWatermark"] = f"lsn:{source.watermark}"
        else:
            objects = [o.model_dump(mode="json") for o in source.objects]  # as frozen
            entry["objects"] = str(len(objects))
            entry["objectVersions"] = json_digest(objects)
        out.append(entry)
    return out


def build_identity(freeze_digest: str, ws: Workspace, image: str) -> str:
    """Digest of the build specification (inputs + config + code), apart from the content.

    The tokenizer counts by its digest: the same config path may hold another file."""
    config = ws.config
    return json_digest(
        {
            "freeze": freeze_digest,
            "transformImage": image,
            "purpose": config.purpose,
            "alias": config.alias,
            "policies": {n: config.policy_digest(n) for n in type(config.policies).model_fields},
            "sources": [s.model_dump(mode="json") for s in config.sources],
            "tokenizer": resolve_tokenizer(ws).document(),
        }
    )


def build_manifest(ws: Workspace, partition_key: str) -> LayerResult:
    """Assemble, sign, store and register the snapshot of a partition from its six layers."""
    freeze_ref, spec = freeze(ws, partition_key)
    indexes = {layer: read_layer_index(ws, partition_key, layer) for layer in LAYERS[:-1]}
    members_ref, count, preview = _members(ws, indexes, spec.parents)
    members_entry = {
        "uri": ws.cas.uri(members_ref["digest"]),
        **members_ref,
        "count": count,
    }
    image = transform_image()
    payload = _document(ws, partition_key, freeze_ref, spec, indexes, members_entry, image)
    sid = snapshot_id(payload)
    manifest = Manifest.new(
        {**payload, "snapshotId": sid, "signature": sign_snapshot(ws.home, sid)}
    )
    _refuse_conflicting_rebuild(ws, manifest)
    manifest_ref = put_json(ws.cas, manifest.document())
    failpoints.hit("layer/manifest/indexed")
    _register(ws, partition_key, manifest, manifest_ref["digest"])
    failpoints.hit("layer/manifest/published")
    objects = partial(changed_objects, ws.cas, ws.catalog)  # the clusters rows to diff
    deletion_index.ensure(ws.cas, ws.catalog, manifest_ref["digest"], objects=objects)
    diff = shadow_diff(ws.cas, ws.catalog, manifest.snapshot_id, remembered=True)
    return LayerResult(
        layer="manifest",
        details={"shadow_diff": diff, "manifest": manifest.document()},
        run_stats={
            "shadow.added": diff["added"],
            "shadow.removed": diff["removed"],
            "shadow.split_migrations": diff["split_migrations"],
        },
        digest=manifest_ref["digest"],
        counts=manifest.counts.document(),
        preview=preview,
        digests={
            "snapshotId": manifest.snapshot_id,
            "buildId": manifest.build_id,
            "transformImage": image,
            "members": members_ref["digest"],
        },
    )


def _members(
    ws: Workspace, indexes: Indexes, parents: list[str]
) -> tuple[Ref, int, list[dict[str, Any]]]:
    """The members table's ref, row count and first rows. The table is a function of the
    canonical, dedup and splits indexes and the code alone, so one built before from the same
    three (an unchanged snapshot in a new partition) is reused through the layer memo table;
    the check's ``verify`` still vouches for its bytes."""
    key = json_digest(
        {
            "table": "manifest.members",
            "code": MEMBERS_CODE,
            "image": transform_image(),
            "layers": {n: indexes[n][0]["digest"] for n in MEMBER_LAYERS},
        }
    )
    hit = ws.catalog.memo(key)
    if hit is not None and ws.cas.contains(hit[0]):
        saved = json.loads(hit[1])
        ref = make_ref(hit[0], JSON, ws.cas.size(hit[0]))
        return ref, saved["count"], saved["preview"]
    written = put_members(ws, indexes, parents)
    saved = json.dumps({"count": written.count, "preview": written.preview})
    ws.catalog.remember(key, "manifest.members", written.ref["digest"], saved)
    return written.ref, written.count, written.preview


def _document(
    ws: Workspace,
    partition_key: str,
    freeze_ref: Ref,
    spec: FreezeSpec,
    indexes: Indexes,
    members: dict[str, Any],
    image: str,
) -> dict[str, Any]:
    """The manifest payload (without snapshotId and signature): facts, each by digest."""
    config = ws.config
    return {
        "schema": MANIFEST_SCHEMA,
        "buildId": build_identity(freeze_ref["digest"], ws, image),
        "partition": partition_key,
        "parents": spec.parents,
        "purpose": spec.purpose,
        "alias": spec.alias,
        "freeze": freeze_ref,
        "sources": source_versions(spec),
        "tombstoneWatermark": str(spec.tombstone_watermark),
        "benchmarkFence": str(spec.benchmark_fence),
        "recordSchema": record_schema_digest(),
        "selectionPolicy": config.policy_digest("dedup"),
        "splitPolicy": config.policy_digest("splits"),
        "mixingPolicy": config.policy_digest("mixing"),
        "packingPolicy": config.policy_digest("packing"),
        "transformImage": image,
        "transform": {layer: index.code for layer, (_, index) in indexes.items()},
        "layers": {layer: ref for layer, (ref, _) in indexes.items()},
        "tokenizer": indexes["packed_blocks"][1].output("tokenizer"),
        "packing": indexes["packed_blocks"][1].outputs.get("packing"),
        "mixture": indexes["mixed_samples"][1].output("report"),
        "contamination": indexes["canonical_records"][1].output("contamination"),
        "members": members,
        "counts": _counts(indexes, members["count"]),
    }


def _counts(indexes: Indexes, members: int) -> dict[str, int]:
    """The headline counts a reviewer compares, taken from the layers that produced them."""
    counts = {layer: index.counts for layer, (_, index) in indexes.items()}
    canonical, dedup = counts["canonical_records"], counts["dedup_clusters"]
    return {
        "records": canonical["records"],
        "quarantined": canonical["quarantined"],
        "dead_letters": canonical["dead_letters"],
        "duplicates_removed": dedup["removed"],
        "duplicate_ids": dedup["duplicate_ids"],  # the same record id and text again
        "id_conflicts": dedup["id_conflicts"],  # the same record id, another text: quarantined
        "tombstoned": dedup["tombstoned"],
        "members": members,
        **{split: counts["splits"][split] for split in SPLITS},
        "blocks": counts["packed_blocks"]["blocks"],
        "tokens": counts["packed_blocks"]["tokens"],
    }


def _register(
    ws: Workspace, partition_key: str, manifest: Manifest, manifest_digest: str
) -> states.Snapshot:
    """Point the partition's manifest layer at it and record the snapshot as BUILDING.

    A build with open dead letters is marked partial, so a retry may replace it."""
    partial = "~partial" if manifest.counts.dead_letters else ""
    ws.catalog.set_layer_output(
        partition_key, "manifest", manifest_digest, manifest.build_id + partial
    )
    return states.register(
        ws.catalog,
        manifest.snapshot_id,
        partition_key,
        manifest_digest,
        ws.config.alias,
        build_id=manifest.build_id,
    )


def _refuse_conflicting_rebuild(ws: Workspace, manifest: Manifest) -> None:
    """The same build identity must give the same snapshot; a difference is nondeterminism,
    reported by field and never overwritten."""
    for earlier in states.find(ws.catalog):
        if earlier.build_id == manifest.build_id and earlier.snapshot_id != manifest.snapshot_id:
            old = read_manifest(ws.cas, earlier.manifest_digest, "earlier manifest")
            if old.counts.dead_letters or manifest.counts.dead_letters:
                continue  # a build with open dead letters was never complete: retrying is progress
            was, now = old.document(), manifest.document()
            differing = sorted(
                k
                for k in set(was) | set(now)
                if k not in SELF_EXCLUDED and was.get(k) != now.get(k)
            )
            raise BuildConflict(
                f"build {manifest.build_id} (partition {manifest.partition}) was built before "
                f"as {earlier.snapshot_id} and now gives {manifest.snapshot_id}: the same "
                f"inputs, config and code produced different content in {', '.join(differing)}; "
                "nothing was overwritten"
            )
