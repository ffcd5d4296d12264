"""``corpus-assets lineage DIGEST``: the snapshot's lineage from pinned sources through every
layer's CAS index (with the code identity that built it) to the manifest, the alias generations
that served it and the training runs that read it, as text, Mermaid and JSON."""

import io
import json
from collections import Counter
from pathlib import Path

import pytest
from prov.serializers.provjson import ProvJSONSerializer

from corpus_assets.core.publication.verify import load_manifest, resolve
from corpus_assets.core.runtime.layer_index import LAYERS, load_index
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets_tests.cli_process import output_field, run
from corpus_assets_tests.prov_json_schema import schema_errors


def test_lineage_names_every_layer_digest_and_code_and_who_served_and_read_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = output_field(run(tmp_path, "demo").stdout, "snapshotId")
    read = run(tmp_path, "read", sid, "--run-id", "audit-1", "--purpose", "demo-pretraining")
    assert read.returncode == 0, read.stderr
    graph = json.loads(run(tmp_path, "lineage", sid, "--format", "json").stdout)
    nodes = {n["id"]: n for n in graph["nodes"]}
    edges = {(e["source"], e["target"]) for e in graph["edges"]}

    monkeypatch.chdir(tmp_path)  # the demo config names its data home relative to it
    monkeypatch.setenv("CORPUS_HOME", str(tmp_path / ".corpus"))
    with open_workspace(tmp_path / ".corpus" / "corpus.yaml") as ws:
        manifest = load_manifest(ws.cas, resolve(ws.catalog, sid))
        for layer in LAYERS[:-1]:
            ref = manifest.layers[layer]
            node = nodes[f"layer:{layer}"]
            assert node["digest"] == ref["digest"]
            assert node["code"] == load_index(ws.cas, ref, layer).code
    assert {n["id"] for n in graph["nodes"] if n["kind"] == "source"} == {
        f"source:{s.id}" for s in manifest.sources
    }
    assert nodes["manifest"]["digest"] == sid
    assert nodes["manifest"]["code"] == manifest.transform_image
    assert ("freeze", "layer:raw_snapshot") in edges
    assert ("layer:canonical_records", "layer:dedup_clusters") in edges  # from the index inputs
    assert ("manifest", "generation:demo/1") in edges and ("manifest", "run:audit-1") in edges

    text = run(tmp_path, "lineage", sid).stdout
    assert text.startswith(f"lineage of {sid}\n")
    assert "training run audit-1 (demo-pretraining)" in text and "alias demo generation 1" in text
    mermaid = run(tmp_path, "lineage", sid, "--format", "mermaid").stdout
    assert mermaid.startswith("flowchart LR\n")
    assert mermaid.count("-->") == len(graph["edges"]) and mermaid.count('["') == len(nodes)
    assert run(tmp_path, "lineage", sid, "--format", "mermaid").stdout == mermaid  # same bytes
    _prov_reads_back(run(tmp_path, "lineage", sid, "--format", "prov").stdout, graph)


def _prov_reads_back(text: str, graph: dict) -> None:
    """Valid W3C PROV-JSON, which the ``prov`` package parses into one element per node (plus
    one build activity per layer) and one relation per edge (plus each layer's generation)."""
    assert schema_errors(json.loads(text)) == []  # valid against the W3C PROV-JSON schema
    document = ProvJSONSerializer().deserialize(io.StringIO(text))
    records = Counter(type(r).__name__ for r in document.get_records())
    layers = sum(n["kind"] == "layer" for n in graph["nodes"])
    runs = sum(n["kind"] == "run" for n in graph["nodes"])
    assert records["ProvEntity"] == len(graph["nodes"]) - runs
    assert records["ProvActivity"] == layers + runs
    assert records["ProvGeneration"] == layers
    assert records["ProvUsage"] + records["ProvDerivation"] == len(graph["edges"])
    read = {"prov:activity": "lineage:run%3Aaudit-1", "prov:entity": "lineage:manifest"}
    assert read in json.loads(text)["used"].values()  # the training run used the manifest
