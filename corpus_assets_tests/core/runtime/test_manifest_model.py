"""The typed ``Manifest`` model and the shipped JSON Schema describe the same document.

The model's own JSON Schema (pydantic's) is compared with the shipped one, object by object:
the same keys, the same required keys, the same JSON types; a key only the model names must fit
the schema's ``additionalProperties``. Changing one without the other fails here.
"""

import copy
from typing import Any

import pytest

from corpus_assets.core.publication.manifest_schema import schema
from corpus_assets.core.runtime.snapshot_manifest import Manifest, ManifestError
from corpus_assets.core.storage.digests import canonical_json
from corpus_assets_tests.core.publication.test_manifest_schema import _minimal

Node = dict[str, Any]
JSON_TYPES = {str: "string", bool: "boolean", int: "integer", type(None): "null"}


def _resolve(root: Node, node: Any) -> Any:
    """``node`` with its local ``$ref`` followed (its own keys win, properties merged), and an
    optional (``anyOf`` of one type and null) opened to that type."""
    while isinstance(node, dict) and "$ref" in node:
        target: Any = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        properties = {**target.get("properties", {}), **rest.get("properties", {})}
        node = {**target, **rest} | ({"properties": properties} if properties else {})
    branches = node.get("anyOf", []) if isinstance(node, dict) else []
    solid = [b for b in branches if b != {"type": "null"}]
    if len(branches) == 2 and len(solid) == 1:
        return _resolve(root, solid[0])
    return node


def _types(root: Node, node: Any) -> set[str]:
    """The JSON types a schema node admits; ``any`` when it does not say."""
    if isinstance(node, dict) and "anyOf" in node:
        return set().union(*(_types(root, b) for b in node["anyOf"]))
    node = _resolve(root, node)
    if not isinstance(node, dict):
        return {"any"}
    if "type" in node:
        return set(node["type"]) if isinstance(node["type"], list) else {node["type"]}
    if "const" in node:
        return {JSON_TYPES[type(node["const"])]}
    if "enum" in node:
        return {JSON_TYPES[type(v)] for v in node["enum"]}
    return {"object"} if "properties" in node else {"any"}


def _properties(root: Node, node: Node) -> dict[str, Any]:
    """Named keys, with those of ``allOf`` branches (``then`` of an ``if``) added."""
    found = dict(node.get("properties", {}))
    for branch in node.get("allOf", []):
        named = _resolve(root, branch.get("then", branch)).get("properties", {})
        found.update({k: v for k, v in named.items() if v is not True or k not in found})
    return found


def _compare(shipped: Node, model: Node, path: str = "$") -> list[str]:
    """Every disagreement between the shipped schema and the model's, as ``path: what``."""
    return _node(shipped, shipped, model, model, path)


def _node(s_root: Node, s: Any, m_root: Node, m: Any, path: str) -> list[str]:
    s_types, m_types = _types(s_root, s), _types(m_root, m)
    if "any" not in s_types | m_types and (
        s_types - {"null"} != m_types - {"null"} or "null" in s_types - m_types
    ):
        return [f"{path}: schema types {sorted(s_types)}, model types {sorted(m_types)}"]
    s, m = _resolve(s_root, s), _resolve(m_root, m)
    if not (isinstance(s, dict) and isinstance(m, dict)):
        return []
    problems: list[str] = []
    s_props, m_props = _properties(s_root, s), _properties(m_root, m)
    if s_props or m_props:
        problems += _keys(s_root, s, s_props, m_root, m, m_props, path)
    elif isinstance(s.get("additionalProperties"), dict):
        extra = m.get("additionalProperties")
        problems += _node(s_root, s["additionalProperties"], m_root, extra, f"{path}.*")
    if "items" in s:
        problems += _node(s_root, s["items"], m_root, m.get("items"), f"{path}[]")
    return problems


def _keys(
    s_root: Node, s: Node, s_props: Node, m_root: Node, m: Node, m_props: Node, path: str
) -> list[str]:
    """Named keys: the same required ones, each compared; a key only the model names must be
    one the schema's ``additionalProperties`` admits."""
    problems = []
    if set(s.get("required", [])) != set(m.get("required", [])):
        required = sorted(set(s.get("required", [])) ^ set(m.get("required", [])))
        problems.append(f"{path}: required in one and not the other: {required}")
    problems += [f"{path}.{k}: in the schema, not the model" for k in s_props.keys() - m_props]
    for key in sorted(m_props.keys() - s_props.keys()):
        extra = s.get("additionalProperties")
        if not isinstance(extra, dict):
            problems.append(f"{path}.{key}: in the model, not the schema")
        elif not _types(m_root, m_props[key]) - {"null"} <= _types(s_root, extra):
            problems.append(f"{path}.{key}: the model's type is not the schema's")
    for key in sorted(s_props.keys() & m_props.keys()):
        if s_props[key] is not True:
            problems += _node(s_root, s_props[key], m_root, m_props[key], f"{path}.{key}")
    return problems


def _model_schema() -> Node:
    return Manifest.model_json_schema(by_alias=True, mode="validation")


def test_the_model_and_the_shipped_schema_agree() -> None:
    assert _compare(schema(), _model_schema()) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda s: s["properties"].pop("alias"), "$.alias: in the model, not the schema"),
        (lambda s: s["required"].remove("buildId"), "$: required in one and not the other"),
        (lambda s: s["properties"].update(note={"type": "string"}), "$.note: in the schema"),
        (lambda s: s["$defs"].update(count={"type": "string"}), "$.members.count: schema types"),
        (
            lambda s: s["properties"]["counts"]["required"].append("dead_letters"),
            "$.counts: required in one",
        ),
    ],
    ids=["key-dropped", "required-dropped", "key-added", "type-changed", "count-required"],
)
def test_a_schema_change_without_the_model_is_named(change: Any, named: str) -> None:
    """The comparison is live: each one-sided change is reported at its path."""
    shipped = copy.deepcopy(schema())
    change(shipped)
    problems = _compare(shipped, _model_schema())
    assert any(p.startswith(named) for p in problems), problems


def test_a_document_reads_back_to_its_own_bytes_extra_keys_and_all() -> None:
    document = _minimal({"generatedAt": "2024-01-01"})
    document["counts"]["dead_letters"] = 0
    document["tokenizer"]["specialTokens"]["eos"]["note"] = "kept"
    read = Manifest.read(document)
    assert canonical_json(read.document()) == canonical_json(document)
    older = {k: v for k, v in document.items() if k not in ("contamination", "packing")}
    assert canonical_json(Manifest.read(older).document()) == canonical_json(older)
    assert Manifest.read(older).contamination is None


def test_a_writer_may_not_add_a_key_the_model_does_not_name() -> None:
    Manifest.new(_minimal({}))
    with pytest.raises(ManifestError, match="generatedAt"):
        Manifest.new(_minimal({"generatedAt": "2024-01-01"}))
    nested = _minimal({})
    nested["tokenizer"]["specialTokens"]["eos"]["note"] = "new"
    with pytest.raises(ManifestError, match=r"tokenizer\.special_tokens\.eos\.note"):
        Manifest.new(nested)


def test_values_are_never_coerced() -> None:
    """What is read is what was hashed: a count as text or a float is not silently an int."""
    for damage in ({"vocabSize": "259"}, {"vocabSize": 259.0}):
        document = _minimal({})
        document["tokenizer"].update(damage)
        with pytest.raises(ManifestError, match="vocabSize"):
            Manifest.read(document)
