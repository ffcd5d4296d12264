"""PROV-JSON lineage: every entity a digest, every relation endpoint declared, stable bytes."""

import copy
import json
from typing import Any

import pytest

from corpus_assets.core.audit.prov import prov_document
from corpus_assets.core.runtime.snapshot_manifest import Manifest
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.digests import DIGEST_RE, canonical_json, json_digest
from corpus_assets_tests.prov_json_schema import schema_errors

SECTIONS = {
    "prefix",
    "entity",
    "activity",
    "agent",
    "wasGeneratedBy",
    "used",
    "wasAssociatedWith",
    "wasAttributedTo",
    "wasDerivedFrom",
}
ENDPOINTS = {  # relation attribute -> section its value must be declared in
    "prov:entity": "entity",
    "prov:generatedEntity": "entity",
    "prov:usedEntity": "entity",
    "prov:plan": "entity",
    "prov:activity": "activity",
    "prov:agent": "agent",
}


def _d(n: int) -> str:
    return "sha256:" + f"{n:064x}"


REQUIRED_COUNTS = ("records", "quarantined", "duplicates_removed", "members", "train")
REQUIRED_COUNTS += ("validation", "test", "blocks", "tokens")


def _hand_built() -> tuple[dict[str, Any], dict[str, Any]]:
    """A freeze with an HTTP object source (ETag, the same bytes under two names) and a change
    log, and a manifest with one parent that names it."""
    freeze = {
        "schema": "corpus.freeze.v1",
        "partition": "p7",
        "alias": "support",
        "purpose": "support-model-training-v3",
        "tombstoneWatermark": "44192",
        "benchmarkFence": "3908",
        "parents": [_d(31)],
        "sources": [
            {
                "id": "web",
                "kind": "objects",
                "objects": [
                    {"name": "a.jsonl", "sha256": _d(1), "size": 10, "etag": '"e1"'},
                    {"name": "b.jsonl", "sha256": _d(2), "size": 20, "lastModified": "Tue"},
                    {"name": "copy-of-a.jsonl", "sha256": _d(1), "size": 10, "etag": '"e9"'},
                ],
                "deferred": [],
            },
            {
                "id": "tickets-eu",
                "kind": "changelog",
                "watermark": "918337",
                "objects": [{"name": "state@lsn:918337", "sha256": _d(3), "size": 30}],
            },
        ],
        "incomplete": [],
    }
    manifest = {
        "schema": "training.dataset.snapshot.v1",
        "buildId": _d(40),
        "partition": "p7",
        "parents": [_d(31)],
        "purpose": "support-model-training-v3",
        "alias": "support",
        "freeze": {"digest": json_digest(freeze), "media": "application/json", "size": 1},
        "tombstoneWatermark": "44192",
        "benchmarkFence": "3908",
        "recordSchema": _d(50),
        "selectionPolicy": _d(51),
        "splitPolicy": _d(52),
        "mixingPolicy": _d(53),
        "packingPolicy": _d(54),
        "transformImage": "corpus-assets/0.1.0@" + _d(60),
        "transform": {"raw_snapshot": "raw_snapshot.v2"},
        "members": {
            "uri": "cas://sha256/" + "7" * 64,
            "digest": _d(70),
            "media": "application/vnd.apache.parquet",
            "size": 1,
            "count": 3,
        },
        "snapshotId": _d(99),
        **_unread_by_prov(),
    }
    return manifest, freeze


def _unread_by_prov() -> dict[str, Any]:
    """The manifest fields prov does not name: present so the document is a whole manifest."""
    ref = {"digest": _d(80), "media": "application/json", "size": 1}
    token = {"token": "<eos>", "id": 256}
    return {
        "sources": [{"id": "web", "kind": "objects", "objects": "3", "objectVersions": _d(81)}],
        "layers": {"raw_snapshot": ref},
        "tokenizer": {
            "schema": "corpus.tokenizer.v1",
            "kind": "utf8-bytes-v1",
            "digest": "utf8-bytes-v1",
            "vocabSize": 259,
            "dtype": "uint16-le",
            "specialTokens": {"eos": token, "pad": {"token": "<pad>", "id": 257}},
        },
        "mixture": [],
        "counts": dict.fromkeys(REQUIRED_COUNTS, 0),
        "signature": {
            "payload": "",
            "payloadType": "application/vnd.in-toto+json",
            "signatures": [],
        },
    }


def _prov(manifest: dict[str, Any], freeze: dict[str, Any], agent: str) -> dict[str, Any]:
    """The PROV-JSON document of a manifest document, read through the typed model."""
    return prov_document(Manifest.read(manifest), freeze, agent)


def _check_shape(doc: dict[str, Any]) -> None:
    assert set(doc) == SECTIONS
    for section, items in doc.items():
        if section in ("prefix", "entity", "activity", "agent"):
            continue
        for rid, relation in items.items():
            assert rid.startswith("_:"), rid
            for attribute, target in ENDPOINTS.items():
                if attribute in relation:
                    assert relation[attribute] in doc[target], (section, rid, attribute)
    for eid in doc["entity"]:
        assert DIGEST_RE.fullmatch(eid), eid
    assert "latest" not in json.dumps(doc).lower()
    used_prefixes = {
        qname.split(":", 1)[0]
        for section in ("entity", "activity", "agent")
        for qname in doc[section]
    }
    assert used_prefixes <= set(doc["prefix"])
    canonical_json(doc)  # no floats, JSON-able


def test_hand_built_lineage_names_every_use_and_the_parent() -> None:
    manifest, freeze = _hand_built()
    doc = _prov(manifest, freeze, "builder@ci")
    _check_shape(doc)
    snapshot = doc["entity"][_d(99)]
    assert snapshot["corpus:buildId"] == _d(40)
    assert snapshot["corpus:transformImage"] == manifest["transformImage"]
    assert snapshot["corpus:purpose"] == "support-model-training-v3"
    freeze_digest = manifest["freeze"]["digest"]
    expected = {_d(99), freeze_digest, _d(60), _d(1), _d(2), _d(3), _d(31)}
    assert set(doc["entity"]) == expected  # the bytes pinned twice are one entity
    [build] = doc["activity"]
    assert build == "build:" + f"{40:064x}"
    assert doc["wasGeneratedBy"] == {"_:generated": {"prov:entity": _d(99), "prov:activity": build}}
    [association] = doc["wasAssociatedWith"].values()
    assert association == {
        "prov:activity": build,
        "prov:agent": "agent:builder@ci",
        "prov:plan": _d(60),
    }
    assert doc["entity"][_d(60)]["corpus:image"] == manifest["transformImage"]
    assert doc["wasAttributedTo"]["_:attributed"]["prov:agent"] == "agent:builder@ci"
    uses = [
        (u["prov:entity"], u.get("corpus:source"), u.get("corpus:name"))
        for u in doc["used"].values()
    ]
    assert uses == [
        (manifest["freeze"]["digest"], None, None),
        (_d(1), "web", "a.jsonl"),
        (_d(2), "web", "b.jsonl"),
        (_d(1), "web", "copy-of-a.jsonl"),
        (_d(3), "tickets-eu", "state@lsn:918337"),
    ]
    by_name = {u.get("corpus:name"): u for u in doc["used"].values()}
    assert by_name["a.jsonl"]["corpus:etag"] == '"e1"'
    assert by_name["copy-of-a.jsonl"]["corpus:etag"] == '"e9"'
    assert by_name["b.jsonl"]["corpus:lastModified"] == "Tue"
    assert by_name["state@lsn:918337"]["corpus:watermark"] == "lsn:918337"
    assert doc["entity"][_d(1)]["corpus:size"] == 10
    assert list(doc["wasDerivedFrom"].values()) == [
        {
            "prov:generatedEntity": _d(99),
            "prov:usedEntity": _d(31),
            "prov:activity": build,
            "prov:type": {"$": "prov:Revision", "type": "prov:QUALIFIED_NAME"},
        }
    ]


def test_same_inputs_give_the_same_document_bytes() -> None:
    manifest, freeze = _hand_built()
    first = canonical_json(_prov(manifest, freeze, "builder"))
    again = _prov(copy.deepcopy(manifest), copy.deepcopy(freeze), "builder")
    assert canonical_json(again) == first
    assert list(again["used"]) == list(_prov(manifest, freeze, "builder")["used"])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda m, f: m.update(parents=["latest"]), "parent of"),
        (lambda m, f: m.update(snapshotId="latest"), "snapshotId"),
        (lambda m, f: m.update(transformImage="corpus-assets:latest"), "transformImage"),
        (lambda m, f: f["sources"][0]["objects"][0].update(sha256="latest"), "a.jsonl"),
        (lambda m, f: m["freeze"].update(digest=_d(5)), "freeze"),
    ],
    ids=["parent", "snapshot", "image-tag", "object", "other-freeze"],
)
def test_names_instead_of_digests_are_refused(damage, message: str) -> None:
    manifest, freeze = _hand_built()
    digest_before = json_digest(freeze)
    damage(manifest, freeze)
    if json_digest(freeze) != digest_before:  # keep the pairing, so the digest check is reached
        manifest["freeze"]["digest"] = json_digest(freeze)
    with pytest.raises(ValueError, match=message):
        _prov(manifest, freeze, "builder")


def test_empty_agent_is_refused() -> None:
    manifest, freeze = _hand_built()
    with pytest.raises(ValueError, match="agent"):
        _prov(manifest, freeze, " ")


@pytest.mark.parametrize("built_demo", ["sqlite"], indirect=True)
def test_demo_snapshot_lineage_covers_every_pinned_object(built_workspace: Workspace) -> None:
    ws = built_workspace
    manifest = json.loads(ws.cas.get_bytes(ws.catalog.layer_output("p1", "manifest")))
    freeze = json.loads(ws.cas.get_bytes(manifest["freeze"]["digest"]))
    doc = _prov(manifest, freeze, "corpus-assets-builder")
    _check_shape(doc)
    assert schema_errors(doc) == []  # the W3C PROV-JSON schema, not only our own shape check
    assert doc["entity"][manifest["snapshotId"]]["corpus:buildId"] == manifest["buildId"]
    pinned = {(s["id"], o["name"], o["sha256"]) for s in freeze["sources"] for o in s["objects"]}
    assert len(pinned) == 4
    used = {
        (u["corpus:source"], u["corpus:name"], u["prov:entity"])
        for u in doc["used"].values()
        if "corpus:source" in u
    }
    assert used == pinned
    assert doc["wasDerivedFrom"] == {}  # the first snapshot of the alias has no parent
    assert canonical_json(doc) == canonical_json(_prov(manifest, freeze, "corpus-assets-builder"))


def _first_entity(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["entity"][next(iter(doc["entity"]))]


@pytest.mark.parametrize(
    ("damage", "where"),
    [
        (lambda d: d["used"][next(iter(d["used"]))].pop("prov:entity"), "used/"),
        (lambda d: d.__setitem__("wasUsedBy", {}), "<root>"),
        (lambda d: _first_entity(d).__setitem__("x:y", {"type": "t"}), "entity/"),
        (lambda d: _first_entity(d).__setitem__("x:y", None), "entity/"),
    ],
    ids=["usage-without-entity", "unknown-section", "literal-without-value", "null-attribute"],
)
def test_the_prov_json_schema_refuses_what_prov_json_forbids(damage, where: str) -> None:
    """The vendored schema is live: each damage a PROV-JSON consumer would reject is reported
    at its path (a schema that accepted anything would make the validity checks vacuous)."""
    manifest, freeze = _hand_built()
    doc = _prov(manifest, freeze, "corpus-assets-builder")
    assert schema_errors(doc) == []
    damage(doc)
    errors = schema_errors(doc)
    assert errors and errors[0].startswith(where), errors
