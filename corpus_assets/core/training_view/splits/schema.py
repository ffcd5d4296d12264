"""The split names, reasons and the moves/conflicts records, defined here only."""

from collections.abc import Iterable
from dataclasses import astuple, dataclass

import pyarrow as pa

TRAIN, VALIDATION, TEST = "train", "validation", "test"
SPLITS = (TRAIN, VALIDATION, TEST)
EXCLUDED = "excluded"  # the ``to`` of a quarantined record's move: it is no member
BRIDGE, MOVED = "split.bridge", "split.conflict_move"
NEW_VERSION = "split.new_eval_version"
RESIDUAL = "split.residual_bridge"  # an edge that still joins two splits after quarantine
HELDOUT = "split.heldout_near"  # a near pair dedup missed, found by the held-out search
TIME_MOVED, TIME_GAP = "split.time_cutoff", "split.time_gap"
BRIDGE_COPY = "split.bridge_copy"  # a removed newcomer that bridged: out of the leakage graph
UNLINKED = "unlinked"  # the ``to`` of a bridge_copy move (it was never a member)

SPLIT_TABLE = pa.schema([("record_id", pa.string()), ("split", pa.string())])

MOVE_COLUMNS = pa.schema(
    [(c, pa.string()) for c in ("record_id", "from", "to", "reason", "evidence")]
)
CONFLICT_COLUMNS = pa.schema(
    [
        (c, pa.string())
        for c in (
            "component",
            "record_a",
            "split_a",
            "record_b",
            "split_b",
            "evidence",
            "resolution",
        )
    ]
)


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
    resolution: str  # quarantine_new, move_smaller, new_eval_version or time_held_out


def move_table(moves: Iterable[Move]) -> pa.Table:
    rows = sorted(astuple(m) for m in moves)
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(MOVE_COLUMNS)
    return pa.table(
        {
            name: pa.array(col, pa.string())
            for name, col in zip(MOVE_COLUMNS.names, columns, strict=True)
        },
        schema=MOVE_COLUMNS,
    )


def conflict_table(conflicts: Iterable[Conflict]) -> pa.Table:
    rows = [astuple(c) for c in conflicts]
    return pa.Table.from_pylist(
        [dict(zip(CONFLICT_COLUMNS.names, r, strict=True)) for r in rows], schema=CONFLICT_COLUMNS
    )
