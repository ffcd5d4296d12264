"""The seven layer assets. Each is a thin wrapper: validate the key, call core, report metadata.

Each asset's Dagster ``code_version`` is its layer's code identity (the one its index names), so
the UI marks a layer stale when the code it runs changes, not when someone remembers to bump it.
"""

from collections.abc import Sequence
from typing import Any

import dagster as dg

from corpus_assets.assets.partitions import snapshots
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.core.dedup import layer as dedup_layer
from corpus_assets.core.ingest import freeze
from corpus_assets.core.pipeline import BUILDERS
from corpus_assets.core.records import layer as records_layer
from corpus_assets.core.release import manifest as release_manifest
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.keys import validate_partition_key
from corpus_assets.core.runtime.layers import LAYERS, LayerResult
from corpus_assets.core.training_view import mixing, packing
from corpus_assets.core.training_view import splits as splits_layer

DESCRIPTIONS = {
    "raw_snapshot": "Source objects pinned by sha256 at freeze time and copied into the CAS.",
    "canonical_records": "Envelope + document records (NFC text); bad lines quarantined by reason.",
    "dedup_clusters": (
        "Exact dedup, then MinHash/LSH near-dedup verified by real Jaccard (algorithm 18.1): "
        "a verdict, representative, direct match and leakage group for every record."
    ),
    "splits": "Each leakage component in train / validation / test: inherited from the parent "
    "snapshot, new components hashed; moves and conflicts listed; per-split report.",
    "mixed_samples": "The training stream: planned per-source mix, content-keyed picks and order.",
    "packed_blocks": "Cached tokens packed into fixed-length blocks (best-fit-decreasing by "
    "default) with segment ids, positions and label masks, in chunk-verified shards; spans "
    "map every block range to its record.",
    "manifest": "training.dataset.snapshot.v1: the digest a training run names.",
}


CODE_VERSIONS: dict[str, str] = {
    "raw_snapshot": freeze.CODE,
    "canonical_records": records_layer.CODE,
    "dedup_clusters": dedup_layer.CODE,
    "splits": splits_layer.CODE,
    "mixed_samples": mixing.CODE,
    "packed_blocks": packing.CODE,
    # the manifest's index is the snapshot itself; its code is the manifest module's closure
    "manifest": stage_code("manifest", release_manifest.__name__),
}
assert tuple(CODE_VERSIONS) == LAYERS


def to_materialize_result(result: LayerResult) -> dg.MaterializeResult:
    metadata: dict[str, Any] = {"index_digest": dg.MetadataValue.text(result.digest)}
    metadata.update({name: dg.MetadataValue.int(v) for name, v in result.counts.items()})
    metadata.update(
        {f"run.{name}": dg.MetadataValue.int(v) for name, v in result.run_stats.items()}
    )
    for name, digest in result.digests.items():  # a count of the same name keeps its label
        label = f"{name}_digest" if name in result.counts else name
        metadata[label] = dg.MetadataValue.text(digest)
    if result.preview:
        metadata["preview"] = preview_table(result.preview)
    for name, value in result.details.items():
        flat = isinstance(value, list) and value and all(_flat(row) for row in value)
        metadata[name] = preview_table(value) if flat else dg.MetadataValue.json(value)
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(result.digest))


def _flat(row: Any) -> bool:
    return isinstance(row, dict) and all(
        isinstance(v, str | int | bool) or v is None for v in row.values()
    )


def preview_table(rows: list[dict[str, Any]]) -> dg.TableMetadataValue:
    def cell(value: Any) -> Any:
        return value if isinstance(value, str | int | bool) or value is None else str(value)

    columns = list(rows[0])
    kinds = {bool: "bool", int: "int"}
    schema = dg.TableSchema(
        columns=[dg.TableColumn(c, kinds.get(type(rows[0][c]), "string")) for c in columns]
    )
    return dg.MetadataValue.table(
        records=[dg.TableRecord({c: cell(r[c]) for c in columns}) for r in rows], schema=schema
    )


def layer_asset(layer: str, deps: Sequence[str]) -> dg.AssetsDefinition:
    build = BUILDERS[layer]

    @dg.asset(
        name=layer,
        deps=list(deps),
        partitions_def=snapshots,
        group_name="corpus",
        description=DESCRIPTIONS[layer],
        kinds={"python", "parquet"},
        code_version=CODE_VERSIONS[layer],
    )
    def _layer(context: dg.AssetExecutionContext, corpus: CorpusResource) -> dg.MaterializeResult:
        key = validate_partition_key(context.partition_key)
        with corpus.workspace() as ws:
            result = build(ws, key)
        context.log.info(f"{layer} {key}: {result.digest} {result.counts}")
        return to_materialize_result(result)

    return _layer


raw_snapshot = layer_asset("raw_snapshot", [])
canonical_records = layer_asset("canonical_records", ["raw_snapshot"])
dedup_clusters = layer_asset("dedup_clusters", ["canonical_records"])
splits = layer_asset("splits", ["dedup_clusters", "canonical_records"])
mixed_samples = layer_asset("mixed_samples", ["splits", "dedup_clusters", "canonical_records"])
packed_blocks = layer_asset(
    "packed_blocks", ["mixed_samples", "canonical_records", "dedup_clusters"]
)
manifest = layer_asset(
    "manifest", ["packed_blocks", "splits", "dedup_clusters", "canonical_records"]
)

LAYER_ASSETS = [
    raw_snapshot,
    canonical_records,
    dedup_clusters,
    splits,
    mixed_samples,
    packed_blocks,
    manifest,
]
