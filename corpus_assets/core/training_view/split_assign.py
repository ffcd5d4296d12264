"""The split assignment: inherit the parent's, hash only new components, resolve conflicts.

Inputs are Arrow tables (members: record_id, component, content_key, event_time; parent:
record_id, split); everything per record is a join or a group-by, and Python loops run only
over conflicts. A leakage component whose members had splits in the parent keeps that split. A
component with no parent member is hashed: ``u(k)`` is the first 8 bytes of
sha256(salt NUL k) scaled to [0, 100) without floats, and ``k`` is the smallest content key
(``dedup_key``) of its members, a name no new edge can change. A component whose parent members
sit in different splits is a conflict (a new edge bridged them); it is always listed and resolved
by ``policies.splits.on_conflict``:

* ``quarantine_new``: the component's records without a parent split are excluded (reason
  ``split.bridge``), parent members keep their splits. With no such record (an edge between two
  old records) the smaller sides move to the largest side's split.
* ``move_smaller``: every member of the smaller sides moves to the largest side's split, new
  records join it.
* ``new_eval_version``: nothing is inherited; every component is hashed again with the salt of
  the next evaluation version (``eval_version`` + 1) and every changed record is a listed move.

The largest side is the split holding most parent members, ties broken by split order. The time
boundary (``time_cutoff``, ``gap``) runs first: see ``split_time``.
"""

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.runtime.config import SplitPolicy
from corpus_assets.core.training_view.split_bridges import LeakageGraph
from corpus_assets.core.training_view.split_conflicts import Resolution, resolve_conflicts
from corpus_assets.core.training_view.split_time import time_phase
from corpus_assets.core.training_view.splits_schema import (
    EXCLUDED,
    MOVE_COLUMNS,
    NEW_VERSION,
    SPLIT_TABLE,
    SPLITS,
    UNLINKED,
    Conflict,
    Move,
    move_table,
)

MEMBER_SCHEMA = pa.schema(
    [
        ("record_id", pa.string()),
        ("component", pa.string()),  # the dedup layer's leakage_id
        ("content_key", pa.string()),  # dedup_key: stable however the component grows
        ("event_time", pa.string()),
    ]
)
_BATCH = 65536


@dataclass
class Assignment:
    table: pa.Table  # record_id, split: the members, in no particular order
    moves: pa.Table  # MOVE_COLUMNS, by record_id
    conflicts: list[Conflict] = field(default_factory=list)
    eval_version: int = 0

    @property
    def excluded(self) -> list[str]:
        moves = self.moves
        return moves.filter(pc.equal(moves.column("to"), EXCLUDED)).column("record_id").to_pylist()

    @property
    def unlinked(self) -> list[str]:
        """Removed newcomers that bridged two splits: taken out of the leakage graph."""
        moves = self.moves
        return moves.filter(pc.equal(moves.column("to"), UNLINKED)).column("record_id").to_pylist()

    def as_dict(self) -> dict[str, str]:
        """record id -> split (for tests and small tables only)."""
        ids, splits = self.table.column("record_id"), self.table.column("split")
        return dict(zip(ids.to_pylist(), splits.to_pylist(), strict=True))


def split_of(key: str, policy: SplitPolicy, version: int = 0) -> str:
    return SPLITS[int(split_indices(pa.array([key]), policy, version)[0])]


def split_indices(keys: pa.Array, policy: SplitPolicy, version: int = 0) -> np.ndarray:
    """Per key, 0/1/2 for train/validation/test, hashed a batch at a time."""
    salt = (policy.salt if version == 0 else f"{policy.salt}/eval-{version}").encode() + b"\x00"
    percent = np.empty(len(keys), np.uint8)
    for start in range(0, len(keys), _BATCH):
        batch = keys.slice(start, _BATCH).to_pylist()
        heads = [hashlib.sha256(salt + k.encode()).digest()[:8] for k in batch]
        u = np.frombuffer(b"".join(heads), ">u8")
        percent[start : start + len(batch)] = (u >> np.uint64(32)) * np.uint64(100) >> np.uint64(32)
    cuts = [policy.train_percent, policy.train_percent + policy.validation_percent]
    return np.searchsorted(cuts, percent, side="right").astype(np.int8)


def assign(
    members: pa.Table,
    parent: pa.Table,
    policy: SplitPolicy,
    evidence: Mapping[str, str] | None = None,
    parent_version: int = 0,
    graph: LeakageGraph | None = None,
) -> Assignment:
    """Split per member; moves by record id, conflicts by component. ``quarantine_new`` needs
    the ``graph`` to tell which newcomers bridge."""
    members = members.cast(MEMBER_SCHEMA)
    joined = members.join(
        parent.cast(SPLIT_TABLE).rename_columns(["record_id", "parent_split"]),
        "record_id",
        join_type="left outer",
    )  # in no particular order: every consumer of a row order sorts
    timed, joined, time_moves, time_conflicts = time_phase(joined, policy, evidence or {})
    per = _per_component(joined)
    wide = per.filter(pc.greater(per.column("sides"), 1))
    conflicted = joined.filter(pc.is_in(joined.column("component"), value_set=wide["component"]))
    if len(wide) and policy.on_conflict == "new_eval_version":
        return _new_version(
            joined, timed, time_moves, time_conflicts, policy, parent_version, evidence or {}
        )
    resolved, moves, conflicts = resolve_conflicts(
        conflicted, parent, Resolution(policy, evidence or {}, graph)
    )
    calm = per.filter(pc.less_equal(per.column("sides"), 1))
    table = pa.concat_tables([timed, _calm_splits(joined, calm, policy, parent_version), resolved])
    return Assignment(
        table,
        move_table([*time_moves, *moves]),
        sorted([*time_conflicts, *conflicts], key=lambda c: c.component),
        parent_version,
    )


def _per_component(joined: pa.Table) -> pa.Table:
    """component, smallest content key, number of distinct parent splits, a parent split."""
    per = joined.group_by("component").aggregate(
        [("content_key", "min"), ("parent_split", "count_distinct"), ("parent_split", "min")]
    )
    return per.rename_columns(["component", "key", "sides", "inherited"])


def _calm_splits(joined: pa.Table, calm: pa.Table, policy: SplitPolicy, version: int) -> pa.Table:
    """Members of components with at most one parent split: inherited, or hashed by key."""
    hashed = pa.array(SPLITS).take(
        pa.array(split_indices(calm["key"].combine_chunks(), policy, version))
    )
    split = pc.if_else(pc.is_valid(calm["inherited"]), calm["inherited"], hashed)
    targets = pa.table({"component": calm["component"], "split": split})
    rows = joined.select(["record_id", "component"]).join(targets, "component", join_type="inner")
    return rows.select(["record_id", "split"]).cast(SPLIT_TABLE)


def _new_version(
    joined: pa.Table,
    timed: pa.Table,
    time_moves: list[Move],
    time_conflicts: list[Conflict],
    policy: SplitPolicy,
    parent_version: int,
    evidence: Mapping[str, str],
) -> Assignment:
    """Every component hashed again under the next evaluation version; changes are moves."""
    version = parent_version + 1
    per = _per_component(joined)
    wide = per.filter(pc.greater(per.column("sides"), 1))
    conflicted = joined.filter(pc.is_in(joined["component"], value_set=wide["component"]))
    listing = Resolution(policy.model_copy(update={"on_conflict": "move_smaller"}), evidence, None)
    _, _, found = resolve_conflicts(conflicted, pa.table({}), listing)
    conflicts = [replace(c, resolution="new_eval_version") for c in found]
    fresh = joined.drop_columns(["parent_split"]).append_column(
        "parent_split", pa.nulls(len(joined), pa.string())
    )
    table = pa.concat_tables(
        [timed, _calm_splits(joined, _per_component(fresh), policy, version)]
    ).sort_by("record_id")
    before = joined.select(["record_id", "parent_split"]).join(table, "record_id")
    changed = before.filter(
        pc.fill_null(pc.not_equal(before["parent_split"], before["split"]), False)
    ).sort_by("record_id")
    n = len(changed)
    moves = pa.table(
        {
            "record_id": changed["record_id"],
            "from": changed["parent_split"],
            "to": changed["split"],
            "reason": pa.repeat(pa.scalar(NEW_VERSION), n),
            "evidence": pa.repeat(pa.scalar(f"eval version {version}"), n),
        },
        schema=MOVE_COLUMNS,
    )
    all_moves = pa.concat_tables([move_table(time_moves), moves]).sort_by("record_id")
    ordered = sorted([*time_conflicts, *conflicts], key=lambda c: c.component)
    return Assignment(table, all_moves, ordered, version)
