"""The held-out search's stored state, and a child's start from its parent's.

Whether a pair is a candidate, estimated and above its threshold depends on its two records
only (their texts, and which of them is held out) under the spec and thresholds. The splits
layer stores, per global canonical row, its status and every pair it estimated with the exact
Jaccard (``heldout_state``); a child whose parent stored it under the same code, policy and
rule (``heldout_rule``) takes the pairs of two rows whose status is unchanged from there.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.dedup.heldout_search import HeldoutPairs
from corpus_assets.core.dedup.minhash import spec_payload
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.layer_index import LayerIndex
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.cas import CasError
from corpus_assets.core.storage.digests import json_digest
from corpus_assets.core.storage.table_lookup import TrustedFiles
from corpus_assets.core.training_view.splits.heldout_tasks import pair_order

if TYPE_CHECKING:
    from corpus_assets.core.training_view.splits.heldout import HeldoutScan

STATE_COLUMNS = pa.schema(
    [
        ("status", pa.int8()),
        ("partners", pa.list_(pa.int64())),
        ("jaccards", pa.list_(pa.float64())),
    ]
)

ParentSplits = tuple[LayerIndex | None, list[ChunkRecords], str]  # its splits, its chunks, a name


@dataclass(frozen=True)
class PriorSearch:
    """A parent's search state carried to this partition's rows (a chunk with the same
    records digest holds the same texts, so the same signatures and thresholds)."""

    to_child: np.ndarray  # per parent row, its global row here (-1: its chunk is gone)
    status: np.ndarray  # per parent row: UNSEARCHED, MEMBER or HELD
    a: np.ndarray  # every pair the parent estimated, parent rows a < b
    b: np.ndarray
    jaccard: np.ndarray

    def unchanged(self, status: np.ndarray) -> np.ndarray:
        """Per row here, whether the parent had it with this status (so every pair of two
        such rows was searched, estimated and verified as it would be now)."""
        same = np.zeros(len(status), dtype=bool)
        kept = self.to_child >= 0
        here = self.to_child[kept]
        same[here] = self.status[kept] == status[here]
        return same

    def pairs(self, same: np.ndarray, thresholds: np.ndarray) -> HeldoutPairs:
        """The parent's estimated pairs of two unchanged rows, in rows here, and those at or
        above their threshold."""
        x, y = self.to_child[self.a], self.to_child[self.b]
        kept = (x >= 0) & (y >= 0)
        kept[kept] = same[x[kept]] & same[y[kept]]
        x, y, jaccard = x[kept], y[kept], self.jaccard[kept]
        a, b = np.minimum(x, y), np.maximum(x, y)
        order = pair_order(a, b)
        a, b, jaccard = a[order], b[order], jaccard[order]
        hit = jaccard >= np.maximum(thresholds[a], thresholds[b])
        stats: dict[str, int | float] = {"reused": len(a)}
        return HeldoutPairs(a[hit], b[hit], jaccard[hit], stats, (a, b, jaccard))


def state_table(status: np.ndarray, a: np.ndarray, b: np.ndarray, jaccard: np.ndarray) -> pa.Table:
    """The search's state: per global row its status and the rows after it that it was
    estimated with, and their exact Jaccards (each pair once, partners ascending)."""
    a, b = a.astype(np.int64), b.astype(np.int64)
    order = pair_order(a, b)
    a, b, jaccard = a[order], b[order], jaccard[order]
    first = np.r_[True, (np.diff(a) != 0) | (np.diff(b) != 0)][: len(a)]
    a, b, jaccard = a[first], b[first], jaccard[first]
    offsets = pa.array(np.r_[0, np.cumsum(np.bincount(a, minlength=len(status)))], pa.int32())
    return pa.table(
        {
            "status": pa.array(status, pa.int8()),
            "partners": pa.ListArray.from_arrays(offsets, pa.array(b, pa.int64())),
            "jaccards": pa.ListArray.from_arrays(offsets, pa.array(jaccard, pa.float64())),
        },
        schema=STATE_COLUMNS,
    )


def rule_digest(scan: "HeldoutScan") -> str:
    """What a stored state's pairs depend on besides the texts and statuses: the signature
    spec and the thresholds by script (recorded as ``heldout_rule``)."""
    word, char = scan.rule.word, scan.rule.char
    return json_digest({"spec": spec_payload(scan.spec), "word": str(word), "char": str(char)})


def prior_search(
    ws: Workspace, scan: "HeldoutScan", parent: ParentSplits, code: str, policy: str | None
) -> tuple[PriorSearch | None, str]:
    """The parent's search state in this partition's rows, when its splits layer ran ``code``
    under ``policy`` and this rule and its state is still stored; else None and why not."""
    index, chunks, who = parent
    if index is None:
        return None, f"no {who}"
    if index.code != code or index.policy != policy:
        return None, f"{who} ran other splits code or policy"
    if (
        index.outputs.get("heldout_rule") != rule_digest(scan)
        or "heldout_state" not in index.outputs
    ):
        return None, f"{who} stored no search state under this spec and thresholds"
    to_child = row_map(chunks, scan.chunks)
    if to_child is None:
        return None, f"{who} or this partition names a records table twice"
    try:
        path = TrustedFiles(ws.cas, ws.catalog).path(
            index.output("heldout_state")["digest"], f"{who} heldout_state"
        )
    except CasError:  # collected or damaged: searched again, not failed on
        return None, f"{who}'s search state is gone from the store"
    state = pq.read_table(path)
    if state.num_rows != len(to_child):
        return None, f"{who}'s search state does not match its records"
    partners = state["partners"].combine_chunks()
    a = pc.list_parent_indices(partners).to_numpy().astype(np.int64)
    b = pc.list_flatten(partners).to_numpy()
    jaccard = pc.list_flatten(state["jaccards"].combine_chunks()).to_numpy()
    status = state["status"].to_numpy()
    return PriorSearch(to_child, status, a, b, jaccard), who


def row_map(parent: list[ChunkRecords], child: list[ChunkRecords]) -> np.ndarray | None:
    """Per parent global row, the child's global row of the same record (the same records
    table at the same position), -1 where the child has no such table."""
    starts = np.cumsum([0, *(c.count for c in child)])[:-1].tolist()
    where = {c.records["digest"]: start for c, start in zip(child, starts, strict=True)}
    if len(where) != len(child) or len({c.records["digest"] for c in parent}) != len(parent):
        return None
    parts = [
        np.arange(where[c.records["digest"]], where[c.records["digest"]] + c.count)
        if c.records["digest"] in where
        else np.full(c.count, -1)
        for c in parent
    ]
    return np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)


def union_pairs(first: HeldoutPairs, second: HeldoutPairs) -> HeldoutPairs:
    """The pairs of two searches once each, in (a, b) order, and their summed counts."""
    a, b, jaccard = (
        np.concatenate([x, y]) for x, y in zip(triple(first), triple(second), strict=True)
    )
    order = pair_order(a, b)
    first_of_pair = np.r_[True, (np.diff(a[order]) != 0) | (np.diff(b[order]) != 0)]
    keep = order[first_of_pair[: len(order)]]
    keys = dict.fromkeys([*first.stats, *second.stats])
    stats = {k: first.stats.get(k, 0) + second.stats.get(k, 0) for k in keys}
    verified = tuple(np.concatenate(x) for x in zip(first.verified, second.verified, strict=True))
    return HeldoutPairs(a[keep], b[keep], jaccard[keep], stats, verified)


def triple(pairs: HeldoutPairs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return pairs.a.astype(np.int64), pairs.b.astype(np.int64), pairs.jaccard
