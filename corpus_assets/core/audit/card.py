"""The dataset card of one snapshot: what a reader of the data wants to see before training on it.

Everything on the card comes from the signed manifest, read through ``verify.signed_manifest``
(re-hashed, snapshotId recomputed, signature by a trusted key the catalog pins for the alias),
and from the CAS documents and tables it names, each re-hashed on read. Nothing comes from where
the snapshot stands now (state, generations, runs: ``status`` and ``history`` say that), so the
same snapshot always gives the same card, byte for byte. ``card_render`` draws and writes it.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np

from corpus_assets.core.audit.snapshot_graph import LineageGraph, snapshot_lineage
from corpus_assets.core.dedup.report import DedupReport
from corpus_assets.core.governance import states
from corpus_assets.core.publication.verify import resolve, signed_manifest
from corpus_assets.core.runtime.layer_index import LayerIndex, load_index
from corpus_assets.core.runtime.snapshot_manifest import Manifest
from corpus_assets.core.storage.artifacts import get_json, get_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog

HISTOGRAM_BINS = 30
CONFLICTS_SHOWN = 20  # split conflicts listed on the card (all are counted)
BEFORE_SERVING = ("source", "freeze", "layer", "manifest")  # lineage kinds the snapshot fixes


@dataclass(frozen=True)
class Histogram:
    """Integer values in equal-width bins: ``counts[i]`` values in [edges[i], edges[i+1])."""

    edges: list[int]
    counts: list[int]
    values: int
    total: int
    low: int
    median: int
    high: int


@dataclass(frozen=True)
class Card:
    """What the card shows, read and checked; the renderer only lays it out."""

    snapshot: states.Snapshot
    keyid: str
    manifest: Manifest
    accounting: dict[str, dict[str, int]]  # canonical_records rows per source
    dedup_counts: dict[str, int]
    dedup: DedupReport
    split_counts: dict[str, int]
    conflicts: list[dict[str, Any]]  # the first CONFLICTS_SHOWN split conflicts
    pack_counts: dict[str, int]
    sample_lengths: Histogram  # tokens per packed sample
    block_padding: Histogram  # pad tokens per block
    lineage: LineageGraph  # sources -> freeze -> layers -> manifest

    @property
    def snapshot_id(self) -> str:
        return self.snapshot.snapshot_id


def load_card(cas: ContentStore, catalog: Catalog, digest: str) -> Card:
    """The card of the snapshot named by ``digest`` (snapshotId or manifest digest, as every
    command takes it). Raises ``StateError`` for an unknown digest, ``SignatureError`` for a
    manifest that is not the one a trusted key signed, ``CasError`` for a damaged object."""
    snapshot = resolve(catalog, digest)
    manifest, keyid = signed_manifest(cas, catalog, snapshot)
    indexes = {layer: load_index(cas, ref, layer) for layer, ref in sorted(manifest.layers.items())}
    dedup, splits, packed = (
        indexes["dedup_clusters"],
        indexes["splits"],
        indexes["packed_blocks"],
    )
    lengths, padding = _packed_shapes(cas, packed)
    return Card(
        snapshot=snapshot,
        keyid=keyid,
        manifest=manifest,
        accounting=indexes["canonical_records"].output("accounting"),
        dedup_counts=dedup.counts,
        dedup=DedupReport.parse(get_json(cas, dedup.output("report"), "dedup report")),
        split_counts=splits.counts,
        conflicts=_conflicts(cas, splits),
        pack_counts=packed.counts,
        sample_lengths=lengths,
        block_padding=padding,
        lineage=_fixed_lineage(snapshot_lineage(cas, catalog, snapshot)),
    )


def _conflicts(cas: ContentStore, splits: LayerIndex) -> list[dict[str, Any]]:
    table = get_table(cas, splits.output("split_conflicts"), "split conflicts")
    return table.slice(0, CONFLICTS_SHOWN).to_pylist()


def _packed_shapes(cas: ContentStore, packed: LayerIndex) -> tuple[Histogram, Histogram]:
    """(tokens per sample, pad tokens per block) from the packed spans: a sample split across
    blocks is summed back, and a block's padding is what its spans leave of it (a block no span
    reaches is all padding). Sums by ``bincount`` over the integer ids: no hash grouping."""
    spans = get_table(
        cas, packed.output("spans"), "packed spans", ["block", "sample", "start", "end"]
    )
    tokens = spans["end"].to_numpy() - spans["start"].to_numpy()
    block, sample = spans["block"].to_numpy(), spans["sample"].to_numpy()
    used = np.bincount(block, weights=tokens, minlength=int(packed.counts["blocks"]))
    block_tokens = int(packed.counts["block_tokens"])
    padding = block_tokens - used.astype(np.int64)
    lengths = np.bincount(sample, weights=tokens)[np.bincount(sample) > 0].astype(np.int64)
    return histogram(lengths, int(lengths.max(initial=0))), histogram(padding, block_tokens)


def histogram(values: np.ndarray, high: int) -> Histogram:
    """``values`` in at most ``HISTOGRAM_BINS`` equal integer-width bins covering [0, high]."""
    width = max(1, -(-(high + 1) // HISTOGRAM_BINS))
    counts = np.bincount(values // width, minlength=-(-(high + 1) // width))
    ordered = np.sort(values)
    middle = int(ordered[len(ordered) // 2]) if len(ordered) else 0
    return Histogram(
        edges=[width * n for n in range(len(counts) + 1)],
        counts=[int(c) for c in counts],
        values=len(values),
        total=int(values.sum()),
        low=int(ordered[0]) if len(ordered) else 0,
        median=middle,
        high=int(ordered[-1]) if len(ordered) else 0,
    )


def _fixed_lineage(graph: LineageGraph) -> LineageGraph:
    """The part of the graph the signed snapshot fixes: what served or read it comes later."""
    kept = {node.id for node in graph.nodes if node.kind in BEFORE_SERVING}
    return LineageGraph(
        graph.snapshot_id,
        tuple(n for n in graph.nodes if n.id in kept),
        tuple(e for e in graph.edges if e.source in kept and e.target in kept),
    )
