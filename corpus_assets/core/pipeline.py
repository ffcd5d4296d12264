"""The seven layers in dependency order, for callers that run them without Dagster."""

from collections.abc import Callable

from corpus_assets.core.dedup.layer import build_dedup_clusters
from corpus_assets.core.ingest.freeze import build_raw_snapshot
from corpus_assets.core.records.layer import build_canonical_records
from corpus_assets.core.release.manifest import build_manifest
from corpus_assets.core.runtime.layers import LAYERS, LayerResult
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.training_view.mixing import build_mixed_samples
from corpus_assets.core.training_view.packing import build_packed_blocks
from corpus_assets.core.training_view.splits import build_splits

BUILDERS: dict[str, Callable[[Workspace, str], LayerResult]] = {
    "raw_snapshot": build_raw_snapshot,
    "canonical_records": build_canonical_records,
    "dedup_clusters": build_dedup_clusters,
    "splits": build_splits,
    "mixed_samples": build_mixed_samples,
    "packed_blocks": build_packed_blocks,
    "manifest": build_manifest,
}
assert tuple(BUILDERS) == LAYERS


def build_all(ws: Workspace, partition_key: str) -> dict[str, LayerResult]:
    return {layer: build(ws, partition_key) for layer, build in BUILDERS.items()}
