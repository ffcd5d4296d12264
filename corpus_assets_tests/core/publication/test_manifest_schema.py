"""The shipped JSON Schema accepts a real manifest and names the path of every violation."""

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from corpus_assets.core.publication.manifest_schema import schema, schema_errors
from corpus_assets.core.runtime.layer_index import LAYERS
from corpus_assets.core.runtime.workspace import Workspace


@pytest.fixture
def catalog_url(tmp_path: Path) -> str:
    """SQLite is enough here: the schema does not depend on the catalog backend."""
    return f"sqlite:///{tmp_path / 'catalog.sqlite'}"


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def damage(manifest: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = manifest
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[int(last) if last.isdigit() else last] = value

    return damage


def _drop(key: str) -> Callable[[dict[str, Any]], None]:
    return lambda manifest: manifest.pop(key)


def _drop_at(path: str, key: str) -> Callable[[dict[str, Any]], None]:
    def damage(manifest: dict[str, Any]) -> None:
        node: Any = manifest
        for part in path.split("."):
            node = node[part]
        node.pop(key)

    return damage


DAMAGES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("required key removed", _drop("tombstoneWatermark"), "tombstoneWatermark: required"),
    ("signature removed", _drop("signature"), "signature: required"),
    ("float watermark", _set("tombstoneWatermark", 44192.0), "tombstoneWatermark: 44192.0 is not"),
    ("int fence", _set("benchmarkFence", 3908), "benchmarkFence: 3908 is not of type 'string'"),
    ("signed watermark", _set("benchmarkFence", "-1"), "benchmarkFence: '-1' does not match"),
    ("malformed digest", _set("recordSchema", "sha256:7d11"), "recordSchema: 'sha256:7d11'"),
    ("upper-case digest", _set("members.digest", "sha256:" + "AB" * 32), "members.digest: "),
    ("parent by name", _set("parents", ["latest"]), "parents[0]: 'latest' does not match"),
    ("float count", _set("members.count", 265.0), "members.count: 265.0 is not of type"),
    ("negative count", _set("counts.tokens", -1), "counts.tokens: -1 is less than"),
    ("source digest", _set("sources.1.objectVersions", "abc"), "sources[1].objectVersions: 'abc'"),
    ("source objects int", _set("sources.0.objects", 2), "sources[0].objects: 2 is not of type"),
    ("unknown kind", _set("sources.0.kind", "table"), "sources[0].kind: 'table' is not one of"),
    ("tag image", _set("transformImage", "corpus-assets:latest"), "transformImage: "),
    ("extra top-level key", _set("generatedAt", "2024-01-01"), "generatedAt: key is not allowed"),
    ("layer ref media", _set("layers.splits.media", "text/plain"), "layers.splits.media: "),
    ("cas uri", _set("members.uri", "s3://bucket/members"), "members.uri: "),
    ("sig not base64", _set("signature.signatures.0.sig", "***"), "signature.signatures[0].sig: "),
    ("schema name", _set("schema", "training.dataset.snapshot.v2"), "schema: "),
    ("tokenizer dropped", _drop("tokenizer"), "tokenizer: required"),
    ("vocab size as text", _set("tokenizer.vocabSize", "259"), "tokenizer.vocabSize: '259'"),
    ("no eos", _drop_at("tokenizer.specialTokens", "eos"), "tokenizer.specialTokens.eos: required"),
    ("negative token id", _set("tokenizer.specialTokens.eos.id", -1), "tokenizer.specialTokens"),
    ("tokenizer by path", _set("tokenizer.digest", "tok.json"), "tokenizer"),
    ("mixture row", _set("mixture.0", {"docs": 3}), "mixture[0].source: required"),
    (
        "contamination policy",
        _set("contamination.policy", "contamination.v9"),
        "contamination.policy: 'contamination.v9' is not one of",
    ),
    ("float share", _set("mixture.0.doc_share", 0.5), "mixture[0].doc_share: 0.5"),
]


def test_schema_is_valid_2020_12_and_loads_from_the_package() -> None:
    document = schema()
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(document)
    assert document["additionalProperties"] is False


def test_a_process_validating_manifests_does_not_recheck_the_shipped_schema(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The metaschema check is the test above's, once, not every process's (~0.03 CPU-s of a
    build's check)."""
    from corpus_assets.core.publication import manifest_schema

    checked: list[object] = []
    monkeypatch.setattr(
        Draft202012Validator,
        "check_schema",
        classmethod(lambda _cls, document, *_a, **_k: checked.append(document)),
    )
    manifest_schema._validator.cache_clear()
    try:
        assert schema_errors({}) != []  # an empty document is invalid: the validator works
    finally:
        manifest_schema._validator.cache_clear()
    assert checked == []


ADDED_AFTER_V1 = {"contamination", "packing"}  # per-benchmark report, packing mode


def test_demo_manifest_passes_and_every_damage_is_named_by_path(built_workspace: Workspace) -> None:
    manifest = json.loads(
        built_workspace.cas.get_bytes(built_workspace.catalog.layer_output("p1", "manifest"))
    )
    assert schema_errors(manifest) == []
    # the schema and the builder name the same top-level keys: neither may drift alone; a key
    # added after v1 was published is optional, so manifests built before it still validate
    assert (
        set(schema()["required"]) | ADDED_AFTER_V1 == set(manifest) == set(schema()["properties"])
    )
    older = {k: v for k, v in manifest.items() if k not in ADDED_AFTER_V1}
    assert schema_errors(older) == []

    for name, damage, expected in DAMAGES:
        broken = copy.deepcopy(manifest)
        damage(broken)
        errors = schema_errors(broken)
        assert any(e.startswith(expected) for e in errors), (name, expected, errors)
        assert len(errors) == 1, (name, errors)


def test_a_changelog_source_is_checked_by_its_own_shape() -> None:
    changelog = {
        "id": "tickets-eu",
        "kind": "changelog",
        "tableSnapshot": "sha256:" + "1" * 64,
        "cdcHighWatermark": "lsn:918337",
    }
    good = _minimal({"sources": [changelog]})
    assert schema_errors(good) == []
    bad = _minimal({"sources": [{**changelog, "cdcHighWatermark": "lsn:0/8F34A210"}]})
    assert [e.split(":")[0] for e in schema_errors(bad)] == ["sources[0].cdcHighWatermark"]
    mixed = _minimal({"sources": [{**changelog, "objects": "1"}]})
    assert schema_errors(mixed) == ["sources[0].objects: key is not allowed here"]


def test_non_objects_are_refused_at_the_root() -> None:
    assert schema_errors([]) == ["$: [] is not of type 'object'"]


def _minimal(overrides: dict[str, Any]) -> dict[str, Any]:
    digest = "sha256:" + "0" * 64
    ref = {"digest": digest, "media": "application/json", "size": 1}
    layers = list(LAYERS[:-1])  # every layer but the manifest itself
    counts = ["records", "quarantined", "duplicates_removed", "members", "train"]
    manifest = {
        "schema": "training.dataset.snapshot.v1",
        "buildId": digest,
        "partition": "p1",
        "parents": [],
        "purpose": "demo",
        "alias": "demo",
        "freeze": ref,
        "sources": [],
        "tombstoneWatermark": "0",
        "benchmarkFence": "0",
        "recordSchema": digest,
        "selectionPolicy": digest,
        "splitPolicy": digest,
        "mixingPolicy": digest,
        "packingPolicy": digest,
        "transformImage": "corpus-assets/0.1.0@" + digest,
        "transform": {layer: f"{layer}.v1" for layer in layers},
        "layers": {layer: ref for layer in layers},
        "tokenizer": {
            "schema": "corpus.tokenizer.v1",
            "kind": "utf8-bytes-v1",
            "digest": "utf8-bytes-v1",
            "vocabSize": 259,
            "dtype": "uint16-le",
            "specialTokens": {
                "eos": {"token": "<eos>", "id": 256},
                "pad": {"token": "<pad>", "id": 257},
            },
        },
        "mixture": [{"source": "essays", "selected_docs": 3, "doc_share": "1", "max_epochs": None}],
        "contamination": {"policy": "contamination.v2", "benchmarks": [], "flagged": []},
        "members": {
            "uri": "cas://sha256/" + "0" * 64,
            "digest": digest,
            "media": "application/vnd.apache.parquet",
            "size": 1,
            "count": 0,
        },
        "counts": {name: 0 for name in [*counts, "validation", "test", "blocks", "tokens"]},
        "snapshotId": digest,
        "signature": {
            "payload": "e30=",
            "payloadType": "application/vnd.in-toto+json",
            "signatures": [{"keyid": "k", "sig": "AA=="}],
        },
    }
    return {**manifest, **overrides}
