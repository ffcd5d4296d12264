"""The time boundary of the splits: what happened at or after ``time_cutoff`` is held out.

With ``policies.splits.time_cutoff`` set, a record whose ``event_time`` is at or after the cutoff
goes to ``test`` with its whole leakage component (training must never read anything joined to
the future); a record within ``gap`` before the cutoff is excluded (``split.time_gap``), so
near-in-time neighbours do not straddle the boundary. A component holding both late records and
records before the gap is a conflict like a bridge (resolution ``time_held_out``), listed. Records
without an event time follow the other rules. ``event_time`` is ISO 8601; without a zone it is
UTC. Config requires ``test_percent: 0`` then, so hashing never picks ``test``.
"""

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.runtime.config import SplitPolicy
from corpus_assets.core.training_view.splits.schema import (
    EXCLUDED,
    TEST,
    TIME_GAP,
    TIME_MOVED,
    Conflict,
    Move,
)

_ZONED = r"(Z|[+-]\d\d:?\d\d)$"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class EventTimeError(ValueError):
    """A record's event_time is not an ISO 8601 time."""


def event_micros(ids: pa.Array, times: pa.Array) -> pa.Array:
    """Microseconds since the epoch (UTC) per record; null where there is no event time."""
    zoned = pc.fill_null(pc.match_substring_regex(times, _ZONED), False)
    out = pa.nulls(len(times), pa.int64())
    for mask, kind in (
        (zoned, pa.timestamp("us", tz="UTC")),
        (pc.invert(zoned), pa.timestamp("us")),
    ):
        part = pc.if_else(mask, times, pa.scalar(None, pa.string()))
        try:
            micros = pc.cast(pc.cast(part, kind), pa.int64())
        except pa.ArrowInvalid:
            _raise_first_bad(ids, part, kind)
        out = pc.if_else(mask, micros, out)
    return out


def _raise_first_bad(ids: pa.Array, part: pa.Array, kind: pa.DataType) -> None:
    for rid, value in zip(ids.to_pylist(), part.to_pylist(), strict=True):
        if value is None:
            continue
        try:
            pc.cast(pa.array([value]), kind)
        except pa.ArrowInvalid:
            raise EventTimeError(
                f"record {rid!r}: event_time {value!r} is not an ISO 8601 time "
                "(YYYY-MM-DD[THH:MM:SS[.ffffff]][Z|+HH:MM]); the split time boundary needs it"
            ) from None
    raise AssertionError("a cast failed but no single value does")


def _micros(at: datetime) -> int:
    delta = at - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def time_phase(
    joined: pa.Table, policy: SplitPolicy, evidence: Mapping[str, str]
) -> tuple[pa.Table, pa.Table, list[Move], list[Conflict]]:
    """Held-out members (record_id, split), the members left for the other rules, and the
    moves and conflicts of the boundary. ``joined`` has record_id, component, event_time and
    parent_split."""
    empty = pa.table({"record_id": pa.array([], pa.string()), "split": pa.array([], pa.string())})
    if policy.time_cutoff is None:
        return empty, joined, [], []
    at = event_micros(joined["record_id"].combine_chunks(), joined["event_time"].combine_chunks())
    cutoff = _micros(policy.time_cutoff)
    gap_start = cutoff - policy.gap // timedelta(microseconds=1)
    late = pc.fill_null(pc.greater_equal(at, cutoff), False)
    early = pc.fill_null(pc.less(at, gap_start), False)
    gap = pc.and_(pc.is_valid(at), pc.invert(pc.or_(late, early)))
    moves = [
        Move(
            r["record_id"],
            r["parent_split"] or "",
            EXCLUDED,
            TIME_GAP,
            f"event_time {r['event_time']}",
        )
        for r in joined.filter(gap).to_pylist()
    ]
    kept = joined.filter(pc.invert(gap))
    kept_late, kept_early = late.filter(pc.invert(gap)), early.filter(pc.invert(gap))
    held = pc.is_in(kept["component"], value_set=pc.unique(kept.filter(kept_late)["component"]))
    timed = kept.filter(held)
    moves += _time_moves(timed)
    first_late = _first_per_component(timed.filter(kept_late.filter(held)))
    conflicts = _straddles(timed.filter(kept_early.filter(held)), first_late, evidence)
    split = pa.array(np.full(len(timed), TEST), pa.string())
    out = pa.table({"record_id": timed["record_id"], "split": split})
    return out, kept.filter(pc.invert(held)), moves, conflicts


def _time_moves(timed: pa.Table) -> list[Move]:
    moved = timed.filter(pc.fill_null(pc.not_equal(timed["parent_split"], TEST), False))
    return [
        Move(r["record_id"], r["parent_split"], TEST, TIME_MOVED, f"leakage {r['component']}")
        for r in moved.to_pylist()
    ]


def _first_per_component(rows: pa.Table) -> dict[str, str]:
    """component -> its smallest record id among ``rows``."""
    firsts = rows.group_by("component", use_threads=False).aggregate([("record_id", "min")])
    return dict(
        zip(firsts["component"].to_pylist(), firsts["record_id_min"].to_pylist(), strict=True)
    )


def _straddles(
    before: pa.Table, first_late: Mapping[str, str], evidence: Mapping[str, str]
) -> list[Conflict]:
    """One conflict per held-out component with a member before the gap (its first one)."""
    conflicts: dict[str, Conflict] = {}
    for row in before.sort_by("record_id").to_pylist():
        name = row["component"]
        if name not in conflicts:
            conflicts[name] = Conflict(
                name,
                first_late[name],
                TEST,
                row["record_id"],
                row["parent_split"] or "",
                f"event_time {row['event_time']} before the cutoff; {evidence.get(name, '')}",
                "time_held_out",
            )
    return [conflicts[name] for name in sorted(conflicts)]
