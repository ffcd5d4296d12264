"""splits: salted hash of the leakage group into train/validation/test.

The unit is the dedup layer's leakage group: records sharing a group id, an exact cluster or a
verified near-duplicate edge (even through a removed record) never straddle two splits. A group
with no such links is its own leakage group (named by its group id), so the map is group ->
split and stable as data grows: a group's new records land where the group already is.
``u(g)`` is the first 8 bytes of sha256(salt NUL group) scaled to [0, 100) without floats.
"""

import hashlib

import pyarrow as pa

from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.config import SplitPolicy
from corpus_assets.core.runtime.layers import LayerResult, publish_table_layer, read_layer_index
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import get_table

CODE = stage_code("splits.leakage-group-hash.v2", __name__)  # its closure, hashed at import
TRAIN, VALIDATION, TEST = "train", "validation", "test"
SPLITS = (TRAIN, VALIDATION, TEST)  # the split names, defined here only
SPLIT_COLUMNS = pa.schema(
    [
        ("record_id", pa.string()),
        ("group_id", pa.string()),
        ("leakage_id", pa.string()),
        ("split", pa.string()),
    ]
)


def split_of(group_id: str, policy: SplitPolicy) -> str:
    h = hashlib.sha256(policy.salt.encode() + b"\x00" + group_id.encode("utf-8")).digest()
    percent = (int.from_bytes(h[:8], "big") * 100) >> 64
    if percent < policy.train_percent:
        return TRAIN
    if percent < policy.train_percent + policy.validation_percent:
        return VALIDATION
    return TEST


def build_splits(ws: Workspace, partition_key: str) -> LayerResult:
    dedup_ref, dedup = read_layer_index(ws, partition_key, "dedup_clusters")
    clusters = get_table(ws.cas, dedup.output("clusters"), "dedup clusters")
    members = clusters.filter(clusters.column("is_representative")).select(
        ["record_id", "group_id", "leakage_id"]
    )
    members = members.sort_by("record_id")
    policy = ws.config.policies.splits
    groups = members.column("leakage_id").to_pylist()
    table = pa.Table.from_pydict(
        {
            "record_id": members.column("record_id"),
            "group_id": members.column("group_id"),
            "leakage_id": groups,
            "split": [split_of(g, policy) for g in groups],
        },
        schema=SPLIT_COLUMNS,
    )
    assigned = table.column("split").to_pylist()
    counts = {name: assigned.count(name) for name in SPLITS}
    counts["records"] = table.num_rows
    counts["groups"] = len(set(members.column("group_id").to_pylist()))
    counts["leakage_groups"] = len(set(groups))
    return publish_table_layer(
        ws,
        partition_key,
        layer="splits",
        code=CODE,
        policy="splits",
        inputs=[dedup_ref],
        name="splits",
        table=table,
        counts=counts,
    )
