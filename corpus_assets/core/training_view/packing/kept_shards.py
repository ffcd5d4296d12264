"""The parent's block shards a child keeps: whole shards named again, and the short last one a
child's shard goes on past started from its bytes (``KeptPrefix``), never rebuilt from tokens."""

import numpy as np

from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.storage.shards import CHUNK_HASH, ShardIndex, little_endian
from corpus_assets.core.storage.shards import load_index as load_shard_index
from corpus_assets.core.training_view.packing.incremental import ParentPack
from corpus_assets.core.training_view.packing.plan import PackPlan
from corpus_assets.core.training_view.packing.shards import KINDS, KeptPrefix, ShardOutcome


def reused_shards(
    ws: Workspace,
    parent: ParentPack,
    parent_id: np.ndarray,
    plan: PackPlan,
    code: str,
    fields: dict,
    per_shard: int,
) -> dict[int, ShardOutcome | KeptPrefix]:
    """The parent's shards the child has unchanged, by number: every block of the shard kept
    at its own id, the shard the same size, written by this very code (``code``) in the same
    shard layout, its counts recorded (``shard_counts``) and its bytes still in the store; one
    the child's shard goes on past (the parent's last, when blocks are added): a ``KeptPrefix``."""
    theirs = parent.index.outputs
    if parent.index.code != code or "shard_counts" not in theirs:
        return {}
    index = load_shard_index(ws.cas, theirs["shard_index"]["digest"])
    mine = {name: little_endian(dtype).str for name, dtype in fields.items()}
    if (index.shard_blocks, index.chunk_hash, fields_of(index)) != (per_shard, CHUNK_HASH, mine):
        return {}
    counts = get_table(ws.cas, theirs["shard_counts"], "parent shard counts").to_pylist()
    same = np.append(parent_id == np.arange(parent_id.size), False)
    out: dict[int, ShardOutcome | KeptPrefix] = {}
    for number, entry in enumerate(index.shards):
        first, last = entry.first_block, entry.first_block + entry.blocks
        mine, path = min(first + per_shard, plan.blocks), ws.cas.local_path(entry.digest)
        if first != number * per_shard or last > mine or not same[first:last].all():
            continue
        accounting = {kind: int(counts[number][f"{kind}_tokens"]) for kind in KINDS}
        if last == mine and ws.cas.contains(entry.digest):
            out[number] = ShardOutcome(entries=(entry,), accounting=accounting)
        elif last < mine and path.is_file():  # copied by path: a local file only
            offsets = index.field_offsets(entry.blocks)
            out[number] = KeptPrefix(entry.digest, str(path), entry.blocks, offsets, accounting)
    return out


def fields_of(index: ShardIndex) -> dict[str, str]:
    """The index's per-token fields and their dtypes."""
    return {f.name: f.dtype for f in index.fields}
