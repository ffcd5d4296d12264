"""The layer index: the one small JSON document each layer publishes per partition.

An index names the layer's code version, the policy digest it ran under, its inputs (upstream
indexes), the parent snapshot's index of the same layer when its bytes depend on it, and its
outputs (refs). It carries no partition key, so an unchanged layer of a new snapshot has the
same digest as before and nothing downstream of it is rewritten.
"""

from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corpus_assets.core.runtime.transform import transform_image
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage import failpoints
from corpus_assets.core.storage.artifacts import JSON, Ref, get_json, make_ref, put_json, put_table
from corpus_assets.core.storage.cas import ContentStore
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


class LayerIndexError(ValueError):
    """A stored layer index does not match the ``corpus.layer.v1`` model."""


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


class LayerIndex(BaseModel):
    """The index document (``corpus.layer.v1``); its canonical JSON digest names the layer."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    index_schema: Literal["corpus.layer.v1"] = Field(INDEX_SCHEMA, alias="schema")
    layer: str
    code: str
    policy: str | None
    inputs: list[Ref]  # this snapshot's upstream indexes (and the tokenizer): walked
    # A parent snapshot's index of the same layer, which the bytes depend on (splits inherit its
    # assignments, packing keeps its blocks): pinned by digest, but not walked, so a snapshot's
    # closure - what verify re-hashes and gc keeps - is its own, not every ancestor's
    parents: list[Ref] = Field(default_factory=list)
    outputs: dict[str, Any]  # per layer: refs and small facts, read through the layer's reader
    counts: dict[str, int]

    def document(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True)

    def output(self, name: str) -> Any:
        """One named output, or an error naming the layer and the output."""
        if name not in self.outputs:
            raise KeyError(f"{self.layer} index has no output {name!r}")
        return self.outputs[name]

    def build_spec(self) -> str:
        """What must determine a layer's bytes: code, transform image, policy and input digests.

        An index with open dead letters is marked ``~partial``: a retry that closes them may
        give other bytes from the same spec, and that is progress, not nondeterminism.
        """
        spec = json_digest(
            {
                "code": self.code,
                "image": transform_image(),
                "policy": self.policy,
                "inputs": [i["digest"] for i in self.inputs],
                "parents": [p["digest"] for p in self.parents],
            }
        )
        return spec + ("~partial" if self.outputs.get("dead_letters") else "")


def publish_index(
    ws: Workspace,
    partition_key: str,
    layer: str,
    code: str,
    policy: str | None,
    inputs: list[Ref],
    outputs: dict[str, Any],
    counts: dict[str, int],
    *,
    parents: list[Ref] | None = None,
) -> Ref:
    index = LayerIndex(
        layer=layer,
        code=code,
        policy=policy,
        inputs=inputs,
        parents=parents or [],
        outputs=outputs,
        counts=counts,
    )
    ref = put_json(ws.cas, index.document())
    failpoints.hit(f"layer/{layer}/indexed")
    ws.catalog.set_layer_output(partition_key, layer, ref["digest"], index.build_spec())
    failpoints.hit(f"layer/{layer}/published")
    return ref


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


def load_index(cas: ContentStore, ref: Ref | str, layer: str) -> LayerIndex:
    """A layer index from the CAS, verified on read and checked against its schema."""
    try:
        return LayerIndex.model_validate(get_json(cas, ref, f"{layer} index"))
    except ValidationError as error:
        digest = ref if isinstance(ref, str) else ref["digest"]
        raise LayerIndexError(f"{layer} index {digest} is malformed: {error}") from None


def read_layer_index(ws: Workspace, partition_key: str, layer: str) -> tuple[Ref, LayerIndex]:
    """The upstream layer's index for this partition, verified on read."""
    digest = ws.catalog.layer_output(partition_key, layer)
    if digest is None:
        raise LayerOrderError(
            f"{layer} has not been materialized for partition {partition_key!r}; "
            "materialize it (or the whole build job) first"
        )
    return make_ref(digest, JSON, ws.cas.size(digest)), load_index(ws.cas, digest, layer)
