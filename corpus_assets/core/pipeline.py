"""The seven layers in dependency order, for callers that run them without Dagster.

A layer whose every input equals that of a layer already built - for this or any partition - is
not built again (the layer memo): its earlier index is published for this partition. The inputs
are the transform image (every byte of the package's code), the config's sources and policies,
the partition's freeze spec less its partition key (pinned objects, fences, parents, alias,
purpose) and the upstream layers' index digests of this partition; for packed_blocks also the
parent's packed layer digest when it packs incrementally (``packing.incremental.memo_part``). Any
change to one of them misses, so a memo hit is what a rebuild would produce; it only makes an
unchanged snapshot cheap. The manifest (it names the partition) and raw_snapshot (it re-verifies
the pinned objects) are always built.
"""

import json
from collections.abc import Callable
from dataclasses import asdict

from corpus_assets.core.dedup.dedup_clusters import build_dedup_clusters
from corpus_assets.core.ingest.freeze import build_raw_snapshot, freeze
from corpus_assets.core.publication.manifest import build_manifest
from corpus_assets.core.records.canonical_records import build_canonical_records
from corpus_assets.core.runtime.layer_index import LAYERS, LayerIndex, LayerResult, load_index
from corpus_assets.core.runtime.transform import transform_image
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.digests import json_digest
from corpus_assets.core.storage.fsio import DiskFullError
from corpus_assets.core.storage.memory import release_memory
from corpus_assets.core.storage.refs import declared_refs
from corpus_assets.core.training_view.mixing import build_mixed_samples
from corpus_assets.core.training_view.packing import build_packed_blocks, memo_part
from corpus_assets.core.training_view.splits import build_splits

Builder = Callable[[Workspace, str], LayerResult]
MEMOIZED = ("canonical_records", "dedup_clusters", "splits", "mixed_samples", "packed_blocks")


def memo_key(ws: Workspace, partition_key: str, layer: str) -> str:
    """The digest of everything that decides the layer's bytes for this partition."""
    _, spec = freeze(ws, partition_key)
    frozen = spec.model_dump(mode="json", by_alias=True)
    frozen.pop("partition")
    config = ws.config
    upstream = {
        up: ws.catalog.layer_output(partition_key, up) for up in LAYERS[: LAYERS.index(layer)]
    }
    return json_digest(
        {
            "layer": layer,
            "image": transform_image(),
            "sources": [s.model_dump(mode="json") for s in config.sources],
            "policies": config.policies.model_dump(mode="json"),
            "freeze": frozen,
            "upstream": upstream,
            **({"parent_packed": memo_part(ws, partition_key)} if layer == "packed_blocks" else {}),
        }
    )


def _refs(index: LayerIndex) -> list[str]:
    """Every CAS digest a layer index declares (``storage.refs``): inputs and outputs."""
    return [ref["digest"] for _, ref, _ in declared_refs(index.document())[0]]


def _reuse(ws: Workspace, partition_key: str, layer: str, key: str) -> LayerResult | None:
    """The remembered build for ``key``, published for this partition, if its objects exist."""
    hit = ws.catalog.memo(key)
    if hit is None:
        return None
    digest, saved = hit
    if not ws.cas.contains(digest):
        return None
    index = load_index(ws.cas, digest, layer)
    if not all(ws.cas.contains(d) for d in _refs(index)):
        return None
    ws.catalog.set_layer_output(partition_key, layer, digest, index.build_spec())
    result = json.loads(saved)
    return LayerResult(layer=layer, digest=digest, run_stats={"layer_reused": 1}, **result)


def memoized(layer: str, build: Builder) -> Builder:
    """``build`` behind the layer memo."""

    def run(ws: Workspace, partition_key: str) -> LayerResult:
        key = memo_key(ws, partition_key, layer)
        reused = _reuse(ws, partition_key, layer, key)
        if reused is not None:
            return reused
        result = build(ws, partition_key)
        if not load_index(ws.cas, result.digest, layer).build_spec().endswith("~partial"):
            saved = {
                k: v for k, v in asdict(result).items() if k not in ("layer", "digest", "run_stats")
            }
            ws.catalog.remember(key, layer, result.digest, json.dumps(saved, default=str))
        return result

    return run


DIRECT_BUILDERS: dict[str, Builder] = {
    "raw_snapshot": build_raw_snapshot,
    "canonical_records": build_canonical_records,
    "dedup_clusters": build_dedup_clusters,
    "splits": build_splits,
    "mixed_samples": build_mixed_samples,
    "packed_blocks": build_packed_blocks,
    "manifest": build_manifest,
}


def released(build: Builder) -> Builder:
    """``build``, then its freed memory handed back (``storage.memory``): a process running
    every layer starts each from its floor, not from the previous layer's high-water mark. A
    full disk's error names the data home as well as the file."""

    def run(ws: Workspace, partition_key: str) -> LayerResult:
        try:
            return build(ws, partition_key)
        except DiskFullError as error:  # the data home too: that is what needs the space
            raise DiskFullError(error.errno, f"{error.strerror} (data home {ws.home})") from None
        finally:
            release_memory(collect=True)

    return run


BUILDERS: dict[str, Builder] = {
    layer: released(memoized(layer, build) if layer in MEMOIZED else build)
    for layer, build in DIRECT_BUILDERS.items()
}
assert tuple(BUILDERS) == LAYERS


def build_all(ws: Workspace, partition_key: str) -> dict[str, LayerResult]:
    return {layer: build(ws, partition_key) for layer, build in BUILDERS.items()}
