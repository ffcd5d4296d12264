"""W3C PROV-JSON lineage of a snapshot: which build, run by whom with which transform, made it
from which pinned source objects and parent snapshots.

Every entity is named by an immutable digest - the snapshotId, the freeze spec, the bytes of each
pinned object, the transform image - never by a name or "latest". Where an object was read from
(source, name, ETag / Last-Modified, CDC watermark) is a fact of the *usage*, so it sits on the
``used`` relation, and the same bytes pinned under two names stay one entity. Sections and
relations are in a stated order (freeze source order, object name order, manifest parent order),
so the same manifest and freeze give the same document.
"""

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from corpus_assets.core.runtime.snapshot_manifest import Manifest
from corpus_assets.core.storage.digests import check_digest, hex_of, json_digest

PREFIXES = {
    "prov": "http://www.w3.org/ns/prov#",
    "xsd": "http://www.w3.org/2001/XMLSchema#",
    "corpus": "https://corpus-assets.dev/ns/prov#",
    "sha256": "https://corpus-assets.dev/sha256/",
    "build": "https://corpus-assets.dev/build/sha256/",
    "agent": "https://corpus-assets.dev/agent/",
}
IMAGE_RE = re.compile(r"^(?P<name>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})$")


def _qname(value: str) -> dict[str, str]:
    return {"$": value, "type": "prov:QUALIFIED_NAME"}


def agent_id(agent: str) -> str:
    """A PROV qualified name for the agent, percent-encoded so any user@host is one."""
    if not isinstance(agent, str) or not agent.strip():
        raise ValueError(f"PROV agent {agent!r} must be a non-empty string")
    return "agent:" + quote(agent, safe=":@._-")


@dataclass(frozen=True)
class _Names:
    """The digests a document is about, each checked before anything is written."""

    snapshot: str
    freeze: str
    build: str
    image: str
    plan: str
    parents: list[str]


def prov_document(manifest: Manifest, freeze: dict[str, Any], agent: str) -> dict[str, Any]:
    """PROV-JSON for ``manifest`` built from ``freeze`` (the spec its ``freeze`` ref names)."""
    names = _names(manifest, freeze)
    who = agent_id(agent)
    entity = _core_entities(manifest, freeze, names)
    used = _usages(freeze, names, entity)
    was_derived_from = _revisions(names, entity)
    return {
        "prefix": dict(PREFIXES),
        "entity": entity,
        "activity": {names.build: _build_activity(manifest)},
        "agent": {who: {"prov:type": _qname("prov:SoftwareAgent"), "prov:label": agent}},
        "wasGeneratedBy": {
            "_:generated": {"prov:entity": names.snapshot, "prov:activity": names.build}
        },
        "used": used,
        "wasAssociatedWith": {
            "_:associated": {
                "prov:activity": names.build,
                "prov:agent": who,
                "prov:plan": names.plan,
            }
        },
        "wasAttributedTo": {"_:attributed": {"prov:entity": names.snapshot, "prov:agent": who}},
        "wasDerivedFrom": was_derived_from,
    }


def _names(manifest: Manifest, freeze: dict[str, Any]) -> _Names:
    """Refuse a manifest whose freeze is not this one or whose names are not digests."""
    snapshot = check_digest(manifest.snapshot_id, "manifest snapshotId")
    freeze_digest = check_digest(manifest.freeze["digest"], "manifest freeze digest")
    if json_digest(freeze) != freeze_digest:
        raise ValueError(
            f"freeze spec hashes to {json_digest(freeze)}, manifest {snapshot} names "
            f"freeze {freeze_digest}"
        )
    build = "build:" + hex_of(check_digest(manifest.build_id, "manifest buildId"))
    image = manifest.transform_image
    matched = IMAGE_RE.fullmatch(image) if isinstance(image, str) else None
    if matched is None:
        raise ValueError(f"transformImage {image!r} is not <name>@sha256:<hex>: no digest to name")
    parents = [check_digest(p, f"parent of {snapshot}") for p in manifest.parents]
    return _Names(snapshot, freeze_digest, build, image, matched["digest"], parents)


def _core_entities(
    manifest: Manifest, freeze: dict[str, Any], names: _Names
) -> dict[str, dict[str, Any]]:
    """The snapshot, its freeze spec and the transform image (the plan)."""
    return {
        names.snapshot: {
            "prov:type": _qname("corpus:TrainingDatasetSnapshot"),
            "prov:label": f"{manifest.alias}/{manifest.partition}",
            "corpus:schema": manifest.schema_name,
            "corpus:buildId": manifest.build_id,
            "corpus:transformImage": names.image,
            "corpus:purpose": manifest.purpose,
            "corpus:alias": manifest.alias,
            "corpus:partition": manifest.partition,
            "corpus:members": manifest.members.digest,
            "corpus:memberCount": manifest.members.count,
            "corpus:tombstoneWatermark": manifest.tombstone_watermark,
            "corpus:benchmarkFence": manifest.benchmark_fence,
        },
        names.freeze: {
            "prov:type": _qname("corpus:FreezeSpec"),
            "corpus:schema": freeze["schema"],
            "corpus:partition": freeze["partition"],
        },
        names.plan: {"prov:type": _qname("prov:Plan"), "corpus:image": names.image},
    }


def _usages(
    freeze: dict[str, Any], names: _Names, entity: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """One ``used`` per pinned object read (where it was read from is a fact of the usage);
    each distinct object digest becomes one entity."""
    used: dict[str, dict[str, Any]] = {
        "_:used-freeze": {
            "prov:activity": names.build,
            "prov:entity": names.freeze,
            "prov:role": _qname("corpus:freeze"),
        }
    }
    for source in freeze["sources"]:
        for n, obj in enumerate(source["objects"]):
            digest = check_digest(obj["sha256"], f"source {source['id']!r} object {obj['name']!r}")
            entity.setdefault(
                digest, {"prov:type": _qname("corpus:SourceObject"), "corpus:size": obj["size"]}
            )
            key = f"_:used-{quote(source['id'], safe='')}-{n}"
            used[key] = _usage(names.build, digest, source, obj)
    return used


def _usage(build: str, digest: str, source: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """Where and how the object was read: source, name, ETag / Last-Modified, CDC watermark."""
    usage: dict[str, Any] = {
        "prov:activity": build,
        "prov:entity": digest,
        "prov:role": _qname("corpus:source"),
        "corpus:source": source["id"],
        "corpus:kind": source["kind"],
        "corpus:name": obj["name"],
    }
    for key in ("etag", "lastModified"):
        if key in obj:
            usage[f"corpus:{key}"] = obj[key]
    if source["kind"] == "changelog":
        usage["corpus:watermark"] = f"lsn:{source['watermark']}"
    return usage


def _revisions(names: _Names, entity: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The snapshot revises its parents, in manifest order."""
    was_derived_from: dict[str, dict[str, Any]] = {}
    for n, parent in enumerate(names.parents):
        entity.setdefault(parent, {"prov:type": _qname("corpus:TrainingDatasetSnapshot")})
        was_derived_from[f"_:parent-{n}"] = {
            "prov:generatedEntity": names.snapshot,
            "prov:usedEntity": parent,
            "prov:activity": names.build,
            "prov:type": _qname("prov:Revision"),
        }
    return was_derived_from


def _build_activity(manifest: Manifest) -> dict[str, Any]:
    """The build: its identity, transform image, policy digests and per-layer code versions."""
    attributes: dict[str, Any] = {
        "prov:type": _qname("corpus:SnapshotBuild"),
        "corpus:buildId": manifest.build_id,
        "corpus:transformImage": manifest.transform_image,
        "corpus:recordSchema": manifest.record_schema,
        "corpus:selectionPolicy": manifest.selection_policy,
        "corpus:splitPolicy": manifest.split_policy,
        "corpus:mixingPolicy": manifest.mixing_policy,
        "corpus:packingPolicy": manifest.packing_policy,
    }
    for layer, code in manifest.transform.items():
        attributes[f"corpus:transform.{layer}"] = code
    return attributes
