"""A snapshot's lineage graph, as an auditor reads it: sources with their pinned versions -> the
freeze -> each layer's CAS index (digest and the code identity that built it) -> the signed
manifest -> the alias generations that served it -> the training runs and their permits.

Every node is named by a digest or a catalog key, never by "latest"; edges between layers come
from each layer index's own ``inputs`` (what it was built from), not from the layer order. The
same catalog state gives the same graph, rendered as text (``corpus-assets lineage``) or Mermaid
(the CLI, and Markdown metadata on the manifest in the Dagster UI) or W3C PROV-JSON.
"""

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from sqlalchemy import select

from corpus_assets.core.audit.prov import PREFIXES
from corpus_assets.core.governance import states
from corpus_assets.core.publication.verify import load_manifest
from corpus_assets.core.runtime.layer_index import LAYERS, load_index
from corpus_assets.core.runtime.snapshot_manifest import Manifest
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, alias_history, permits


@dataclass(frozen=True)
class Node:
    id: str
    kind: str  # source, freeze, layer, manifest, generation, run
    label: str
    digest: str | None = None
    code: str | None = None


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    relation: str


@dataclass(frozen=True)
class LineageGraph:
    snapshot_id: str
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]

    def text(self) -> str:
        """One line per node, with what it was derived from."""
        into: dict[str, list[Edge]] = {}
        for edge in self.edges:
            into.setdefault(edge.target, []).append(edge)
        lines = [f"lineage of {self.snapshot_id}"]
        for node in self.nodes:
            lines.append(f"{node.kind:<10} {node.label}")
            lines += [f"{'':<10}   digest {node.digest}"] if node.digest else []
            lines += [f"{'':<10}   code {node.code}"] if node.code else []
            lines += [f"{'':<10}   <- {e.source} ({e.relation})" for e in into.get(node.id, [])]
        return "\n".join(lines) + "\n"

    def mermaid(self) -> str:
        """A ``flowchart LR`` (ids in node order, so the same graph gives the same text) whose
        labels carry short digests."""
        ids = {node.id: f"n{n}" for n, node in enumerate(self.nodes)}
        lines = ["flowchart LR"]
        for node in self.nodes:
            label = node.label + (f"<br/>{_short(node.digest)}" if node.digest else "")
            lines.append(f'  {ids[node.id]}["{_mermaid_text(label)}"]')
        for edge in self.edges:
            relation = _mermaid_text(edge.relation)
            lines.append(f"  {ids[edge.source]} -->|{relation}| {ids[edge.target]}")
        return "\n".join(lines) + "\n"


def snapshot_lineage(
    cas: ContentStore, catalog: Catalog, snapshot: states.Snapshot
) -> LineageGraph:
    """The graph of ``snapshot`` from its verified manifest, layer indexes and the catalog."""
    manifest = load_manifest(cas, snapshot)
    nodes, edges = _sources(manifest), []
    freeze = manifest.freeze["digest"]
    nodes.append(Node("freeze", "freeze", f"freeze of partition {snapshot.partition_key}", freeze))
    edges += [Edge(n.id, "freeze", "pinned in") for n in nodes if n.kind == "source"]
    layer_nodes, layer_edges = _layers(cas, manifest, freeze)
    nodes += layer_nodes
    edges += layer_edges
    image = manifest.transform_image
    nodes.append(Node("manifest", "manifest", "signed manifest", snapshot.snapshot_id, image))
    edges += [Edge(n.id, "manifest", "listed in") for n in layer_nodes]
    served, served_edges = _served(catalog, snapshot.snapshot_id)
    return LineageGraph(snapshot.snapshot_id, (*nodes, *served), (*edges, *served_edges))


def _sources(manifest: Manifest) -> list[Node]:
    return [
        Node(
            f"source:{s.id}",
            "source",
            f"source {s.id} ({s.kind}): {s.objects or '?'} objects pinned",
            s.object_versions,
        )
        for s in manifest.sources
    ]


def _layers(cas: ContentStore, manifest: Manifest, freeze: str) -> tuple[list[Node], list[Edge]]:
    """Each layer's index node, and an edge from every input its index names."""
    refs = manifest.layers
    by_digest = {ref["digest"]: f"layer:{layer}" for layer, ref in refs.items()}
    by_digest[freeze] = "freeze"
    nodes: list[Node] = []
    edges = [Edge("freeze", "layer:raw_snapshot", "pins the objects of")] if refs else []
    for layer in (name for name in LAYERS if name in refs):
        index = load_index(cas, refs[layer], layer)
        nodes.append(Node(f"layer:{layer}", "layer", layer, refs[layer]["digest"], index.code))
        for ref in index.inputs:
            source = by_digest.get(ref["digest"])
            if source is not None:
                edges.append(Edge(source, f"layer:{layer}", "input of"))
    return nodes, edges


def _served(catalog: Catalog, snapshot_id: str) -> tuple[list[Node], list[Edge]]:
    """The alias generations that pointed at the snapshot and the runs that took a permit."""
    with catalog.begin() as conn:
        generations = conn.execute(
            select(alias_history)
            .where(alias_history.c.snapshot_id == snapshot_id)
            .order_by(alias_history.c.alias, alias_history.c.generation)
        ).all()
        runs = conn.execute(
            select(permits).where(permits.c.snapshot_id == snapshot_id).order_by(permits.c.at)
        ).all()
    nodes = [
        Node(
            f"generation:{g.alias}/{g.generation}",
            "generation",
            f"alias {g.alias} generation {g.generation}",
        )
        for g in generations
    ]
    nodes += [
        Node(f"run:{r.run_id}", "run", f"training run {r.run_id} ({r.purpose})", r.permit_id)
        for r in runs
    ]
    edges = [
        Edge("manifest", n.id, "served as" if n.kind == "generation" else "read by") for n in nodes
    ]
    return nodes, edges


def _short(digest: str) -> str:
    return digest[:19] + "…"


def _mermaid_text(text: str) -> str:
    return text.replace('"', "#quot;").replace("|", "#124;")


LINEAGE_PREFIX = "https://corpus-assets.dev/lineage/"


def lineage_prov(graph: LineageGraph) -> dict[str, Any]:
    """The graph as W3C PROV-JSON: layers are entities generated by their build activity (its
    code identity an attribute) from the inputs it used; a training run is an activity that used
    the manifest; every other edge is a derivation."""
    kinds = {node.id: node.kind for node in graph.nodes}
    doc: dict[str, Any] = {"prefix": {**PREFIXES, "lineage": LINEAGE_PREFIX}}
    for node in graph.nodes:
        section = "activity" if node.kind == "run" else "entity"
        doc.setdefault(section, {})[_qid(node.id)] = _attributes(node)
        if node.kind == "layer":
            doc.setdefault("activity", {})[_qid("build/" + node.id)] = {
                "prov:label": f"build {node.label}",
                "corpus:code": node.code,
            }
            _relate(doc, "wasGeneratedBy", entity=node.id, activity="build/" + node.id)
    for edge in graph.edges:
        if kinds[edge.target] == "layer":
            _relate(doc, "used", activity="build/" + edge.target, entity=edge.source)
        elif kinds[edge.target] == "run":
            _relate(doc, "used", activity=edge.target, entity=edge.source)
        else:
            _relate(doc, "wasDerivedFrom", generatedEntity=edge.target, usedEntity=edge.source)
    return doc


def _attributes(node: Node) -> dict[str, Any]:
    found: dict[str, Any] = {"prov:label": node.label, "prov:type": f"corpus:{node.kind}"}
    found.update({"corpus:digest": node.digest} if node.digest else {})
    found.update({"corpus:code": node.code} if node.code else {})
    return found


def _relate(doc: dict[str, Any], relation: str, **ends: str) -> None:
    """One relation, numbered in insertion order (the same graph gives the same ids)."""
    rows = doc.setdefault(relation, {})
    rows[f"_:{relation}{len(rows) + 1}"] = {f"prov:{k}": _qid(v) for k, v in ends.items()}


def _qid(node_id: str) -> str:
    return "lineage:" + quote(node_id, safe="")
