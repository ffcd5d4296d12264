"""W3C PROV-JSON lineage of a snapshot: which build, run by whom with which transform, made it
from which pinned source objects and parent snapshots (seed 001).

Every entity is named by an immutable digest - the snapshotId, the freeze spec, the bytes of each
pinned object, the transform image - never by a name or "latest". Where an object was read from
(source, name, ETag / Last-Modified, CDC watermark) is a fact of the *usage*, so it sits on the
``used`` relation, and the same bytes pinned under two names stay one entity. Sections and
relations are in a stated order (freeze source order, object name order, manifest parent order),
so the same manifest and freeze give the same document.
"""

import re
from typing import Any
from urllib.parse import quote

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
    if not isinstance(agent, str) or not agent.strip():
        raise ValueError(f"PROV agent {agent!r} must be a non-empty string")
    return "agent:" + quote(agent, safe=":@._-")


def prov_document(manifest: dict[str, Any], freeze: dict[str, Any], agent: str) -> dict[str, Any]:
    """PROV-JSON for ``manifest`` built from ``freeze`` (the spec its ``freeze`` ref names)."""
    snapshot = check_digest(manifest["snapshotId"], "manifest snapshotId")
    freeze_digest = check_digest(manifest["freeze"]["digest"], "manifest freeze digest")
    if json_digest(freeze) != freeze_digest:
        raise ValueError(
            f"freeze spec hashes to {json_digest(freeze)}, manifest {snapshot} names "
            f"freeze {freeze_digest}"
        )
    build = "build:" + hex_of(check_digest(manifest["buildId"], "manifest buildId"))
    image = manifest["transformImage"]
    matched = IMAGE_RE.fullmatch(image) if isinstance(image, str) else None
    if matched is None:
        raise ValueError(f"transformImage {image!r} is not <name>@sha256:<hex>: no digest to name")
    plan = matched["digest"]
    who = agent_id(agent)
    parents = [check_digest(p, f"parent of {snapshot}") for p in manifest["parents"]]

    entity: dict[str, dict[str, Any]] = {
        snapshot: {
            "prov:type": _qname("corpus:TrainingDatasetSnapshot"),
            "prov:label": f"{manifest['alias']}/{manifest['partition']}",
            "corpus:schema": manifest["schema"],
            "corpus:buildId": manifest["buildId"],
            "corpus:transformImage": image,
            "corpus:purpose": manifest["purpose"],
            "corpus:alias": manifest["alias"],
            "corpus:partition": manifest["partition"],
            "corpus:members": manifest["members"]["digest"],
            "corpus:memberCount": manifest["members"]["count"],
            "corpus:tombstoneWatermark": manifest["tombstoneWatermark"],
            "corpus:benchmarkFence": manifest["benchmarkFence"],
        },
        freeze_digest: {
            "prov:type": _qname("corpus:FreezeSpec"),
            "corpus:schema": freeze["schema"],
            "corpus:partition": freeze["partition"],
        },
        plan: {"prov:type": _qname("prov:Plan"), "corpus:image": image},
    }
    used: dict[str, dict[str, Any]] = {
        "_:used-freeze": {
            "prov:activity": build,
            "prov:entity": freeze_digest,
            "prov:role": _qname("corpus:freeze"),
        }
    }
    for source in freeze["sources"]:
        for n, obj in enumerate(source["objects"]):
            digest = check_digest(obj["sha256"], f"source {source['id']!r} object {obj['name']!r}")
            if digest not in entity:
                entity[digest] = {
                    "prov:type": _qname("corpus:SourceObject"),
                    "corpus:size": obj["size"],
                }
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
            used[f"_:used-{quote(source['id'], safe='')}-{n}"] = usage
    was_derived_from: dict[str, dict[str, Any]] = {}
    for n, parent in enumerate(parents):
        entity.setdefault(parent, {"prov:type": _qname("corpus:TrainingDatasetSnapshot")})
        was_derived_from[f"_:parent-{n}"] = {
            "prov:generatedEntity": snapshot,
            "prov:usedEntity": parent,
            "prov:activity": build,
            "prov:type": _qname("prov:Revision"),
        }

    activity_attrs: dict[str, Any] = {
        "prov:type": _qname("corpus:SnapshotBuild"),
        "corpus:buildId": manifest["buildId"],
        "corpus:transformImage": image,
        "corpus:recordSchema": manifest["recordSchema"],
        "corpus:selectionPolicy": manifest["selectionPolicy"],
        "corpus:splitPolicy": manifest["splitPolicy"],
        "corpus:mixingPolicy": manifest["mixingPolicy"],
        "corpus:packingPolicy": manifest["packingPolicy"],
    }
    for layer, code in manifest["transform"].items():
        activity_attrs[f"corpus:transform.{layer}"] = code
    return {
        "prefix": dict(PREFIXES),
        "entity": entity,
        "activity": {build: activity_attrs},
        "agent": {who: {"prov:type": _qname("prov:SoftwareAgent"), "prov:label": agent}},
        "wasGeneratedBy": {"_:generated": {"prov:entity": snapshot, "prov:activity": build}},
        "used": used,
        "wasAssociatedWith": {
            "_:associated": {"prov:activity": build, "prov:agent": who, "prov:plan": plan}
        },
        "wasAttributedTo": {"_:attributed": {"prov:entity": snapshot, "prov:agent": who}},
        "wasDerivedFrom": was_derived_from,
    }
