"""The split assignment as a pure function: inherit the parent's, hash only new components.

A leakage component whose members had splits in the parent snapshot keeps that split. A
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

The largest side is the split holding most parent members, ties broken by split order.
"""

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from corpus_assets.core.runtime.config import SplitPolicy

TRAIN, VALIDATION, TEST = "train", "validation", "test"
SPLITS = (TRAIN, VALIDATION, TEST)  # the split names, defined here only
EXCLUDED = "excluded"  # the ``to`` of a quarantined record's move: it is no member
BRIDGE, MOVED = "split.bridge", "split.conflict_move"


@dataclass(frozen=True)
class Member:
    record_id: str
    component: str  # the dedup layer's leakage_id
    content_key: str  # dedup_key: stable however the component grows


@dataclass(frozen=True)
class Move:
    record_id: str
    from_split: str  # "" for a record without a parent split
    to_split: str  # a split, or EXCLUDED
    reason: str
    evidence: str


@dataclass(frozen=True)
class Conflict:
    component: str
    record_a: str  # smallest parent member of the side the component resolves to
    split_a: str
    record_b: str  # smallest parent member of another side
    split_b: str
    evidence: str
    resolution: str  # "quarantine_new": newcomers excluded, else "move_smaller"


@dataclass
class Assignment:
    split: dict[str, str] = field(default_factory=dict)  # record id -> split, members only
    moves: list[Move] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)

    @property
    def excluded(self) -> list[str]:
        return [m.record_id for m in self.moves if m.to_split == EXCLUDED]


def split_of(key: str, policy: SplitPolicy) -> str:
    h = hashlib.sha256(policy.salt.encode() + b"\x00" + key.encode("utf-8")).digest()
    percent = (int.from_bytes(h[:8], "big") * 100) >> 64
    if percent < policy.train_percent:
        return TRAIN
    if percent < policy.train_percent + policy.validation_percent:
        return VALIDATION
    return TEST


def assign(
    members: Iterable[Member],
    parent: Mapping[str, str],
    policy: SplitPolicy,
    evidence: Mapping[str, str] | None = None,
) -> Assignment:
    """Split per record; moves and conflicts in component, then record id order."""
    components: dict[str, list[Member]] = {}
    for member in members:
        components.setdefault(member.component, []).append(member)
    out = Assignment()
    for name in sorted(components):
        group = sorted(components[name], key=lambda m: m.record_id)
        _assign_component(out, name, group, parent, policy, (evidence or {}).get(name, ""))
    return out


def _assign_component(
    out: Assignment,
    name: str,
    group: list[Member],
    parent: Mapping[str, str],
    policy: SplitPolicy,
    evidence: str,
) -> None:
    sides: dict[str, list[str]] = {}
    for m in group:
        if m.record_id in parent:
            sides.setdefault(parent[m.record_id], []).append(m.record_id)
    if not sides:
        target = split_of(min(m.content_key for m in group), policy)
        out.split.update((m.record_id, target) for m in group)
        return
    order = sorted(sides, key=lambda s: (-len(sides[s]), SPLITS.index(s) if s in SPLITS else 9, s))
    target = order[0]
    newcomers = [m.record_id for m in group if m.record_id not in parent]
    quarantine = policy.on_conflict == "quarantine_new" and bool(newcomers)
    resolution = "quarantine_new" if quarantine else "move_smaller"
    for other in order[1:]:
        out.conflicts.append(
            Conflict(name, sides[target][0], target, sides[other][0], other, evidence, resolution)
        )
    if len(order) > 1 and quarantine:
        for rid in newcomers:
            out.moves.append(Move(rid, "", EXCLUDED, BRIDGE, f"leakage {name}; {evidence}"))
        out.split.update((rid, parent[rid]) for s in order for rid in sides[s])
        return
    for m in group:
        before = parent.get(m.record_id, "")
        if before and before != target:
            out.moves.append(
                Move(m.record_id, before, target, MOVED, f"leakage {name}; {evidence}")
            )
        out.split[m.record_id] = target
