"""The seven layers in dependency order, for callers that run them without Dagster."""

from collections.abc import Callable

from corpus_assets.core.dedup import build_dedup_clusters
from corpus_assets.core.freeze import build_raw_snapshot
from corpus_assets.core.layers import LAYERS, LayerResult
from corpus_assets.core.manifest import build_manifest
from corpus_assets.core.mixing import build_mixed_samples
from corpus_assets.core.packing import build_packed_blocks
from corpus_assets.core.records import build_canonical_records
from corpus_assets.core.splits import build_splits
from corpus_assets.core.workspace import Workspace

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
