"""The layer index: the one small JSON document each layer publishes per partition.

An index names the layer's code version, the policy digest it ran under, its inputs (upstream
indexes) and its outputs (refs). It carries no partition key, so an unchanged layer of a new
snapshot has the same digest as before and nothing downstream of it is rewritten.
"""

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from corpus_assets.core.runtime.transform import transform_image
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import JSON, Ref, get_json, make_ref, put_json, put_table
from corpus_assets.core.storage.digests import json_digest

LAYERS = (
    "raw_snapshot",
    "canonical_records",
    "dedup_clusters",
    "splits",
    "mixed_samples",
    "packed_blocks",
    "manifest",
)
INDEX_SCHEMA = "corpus.layer.v1"


class LayerOrderError(RuntimeError):
    """A layer ran before the layer it reads from was materialized for the same partition."""


@dataclass
class LayerResult:
    """What a layer build reports: index digest, hashed counts, preview rows and run-only stats.

    ``counts`` are part of the index (deterministic); ``run_stats`` describe this run only
    (for example how many chunks were reused) and are never hashed.
    """

    layer: str
    digest: str
    counts: dict[str, int]
    preview: list[dict[str, Any]] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)
    run_stats: dict[str, int] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


def publish_index(
    ws: Workspace,
    partition_key: str,
    layer: str,
    code: str,
    policy: str | None,
    inputs: list[Ref],
    outputs: dict[str, Any],
    counts: dict[str, int],
) -> Ref:
    index = {
        "schema": INDEX_SCHEMA,
        "layer": layer,
        "code": code,
        "policy": policy,
        "inputs": inputs,
        "outputs": outputs,
        "counts": counts,
    }
    ref = put_json(ws.cas, index)
    ws.catalog.set_layer_output(partition_key, layer, ref["digest"], build_spec(index))
    return ref


def build_spec(index: dict[str, Any]) -> str:
    """What must determine a layer's bytes: code, transform image, policy and input digests.

    An index with open dead letters is marked ``~partial``: a retry that closes them may give
    other bytes from the same spec, and that is progress, not nondeterminism.
    """
    spec = json_digest(
        {
            "code": index["code"],
            "image": transform_image(),
            "policy": index["policy"],
            "inputs": [i["digest"] for i in index["inputs"]],
        }
    )
    partial = index["outputs"].get("dead_letters") if isinstance(index["outputs"], dict) else None
    return spec + ("~partial" if partial else "")


def publish_table_layer(
    ws: Workspace,
    partition_key: str,
    *,
    layer: str,
    code: str,
    policy: str,
    inputs: list[Ref],
    name: str,
    table: pa.Table,
    counts: dict[str, int],
    preview: list[dict[str, Any]] | None = None,
) -> LayerResult:
    """Publish a layer whose single output is one Parquet table named ``name``."""
    out = put_table(ws.cas, table)
    ref = publish_index(
        ws, partition_key, layer, code, ws.config.policy_digest(policy), inputs, {name: out}, counts
    )
    return LayerResult(
        layer=layer,
        digest=ref["digest"],
        counts=counts,
        preview=table.slice(0, 10).to_pylist() if preview is None else preview,
        digests={name: out["digest"]},
    )


def read_index(ws: Workspace, partition_key: str, layer: str) -> tuple[Ref, dict[str, Any]]:
    """The upstream layer's index for this partition, verified on read."""
    digest = ws.catalog.layer_output(partition_key, layer)
    if digest is None:
        raise LayerOrderError(
            f"{layer} has not been materialized for partition {partition_key!r}; "
            "materialize it (or the whole build job) first"
        )
    index = get_json(ws.cas, digest, f"{layer} index")
    return make_ref(digest, JSON, ws.cas.size(digest)), index
