"""Snapshot state machine: BUILDING -> VALIDATED -> APPROVED -> ACTIVE, plus the endings
INCOMPLETE (the freeze was no boundary), REJECTED (a validity rule failed), SUPERSEDED (a
snapshot of a later freeze was activated on the alias first) and EXPIRED (gc removed its objects
under the alias's retention: from ACTIVE or SUPERSEDED, never served, approved or rolled back to
again).

States only move forward. Every move is one conditional UPDATE (``WHERE state = :expected``), so
two racing actors cannot both move a snapshot, and each move leaves an audit event. The one
re-entry is a new attempt: rebuilding a REJECTED snapshot's partition with the same content
(``register``) moves it REJECTED -> BUILDING, and validation ends that attempt again.

An alias's snapshots are ordered by ``Position``: the freeze's creation (``freezes.created_at``,
then the partition key), then the snapshot's own registration. The freeze row is written once per
partition and never updated, so a rebuild of an old partition stays old; this is also the order in
which ``Catalog.previous_freeze`` and the discovery sensor read freezes, so "later freeze" means one
thing everywhere. (A catalog-assigned sequence would not depend on the writers' clocks, but the
freezes table has none and the catalog has no column migrations; successive freezes are normally
a discovery tick or a build apart, far more than the skew of synchronised clocks.)
"""

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, insert, select, update

from corpus_assets.core.governance.audit_fields import audit_field
from corpus_assets.core.storage.catalog import Catalog, freezes, snapshot_events, snapshots

BUILDING, VALIDATED, APPROVED, ACTIVE = "BUILDING", "VALIDATED", "APPROVED", "ACTIVE"
INCOMPLETE, REJECTED, SUPERSEDED = "INCOMPLETE", "REJECTED", "SUPERSEDED"
EXPIRED = "EXPIRED"

ALLOWED: dict[str, set[str]] = {
    BUILDING: {VALIDATED, INCOMPLETE, REJECTED},
    VALIDATED: {APPROVED, INCOMPLETE, REJECTED, SUPERSEDED},
    APPROVED: {ACTIVE, INCOMPLETE, REJECTED, SUPERSEDED},
    ACTIVE: {EXPIRED},  # only gc, for a generation older than the alias's retention keeps
    INCOMPLETE: set(),
    REJECTED: {BUILDING},  # only ``register``: a rebuild of the same content is a new attempt
    SUPERSEDED: {EXPIRED},
    EXPIRED: set(),
}

# What activating a later snapshot of the alias supersedes: candidates that could still move on.
SUPERSEDABLE = (VALIDATED, APPROVED)


class StateError(RuntimeError):
    """A transition that the state machine forbids, or a snapshot that does not exist."""


@dataclass(frozen=True)
class Snapshot:
    """A snapshot's catalog row: its ids, alias, where it stands and who approved it."""

    snapshot_id: str
    partition_key: str
    manifest_digest: str
    alias: str
    state: str
    approved_by: str | None
    created_at: float
    build_id: str | None = None


@dataclass(frozen=True, order=True)
class Position:
    """Where a snapshot stands among its alias's snapshots; a greater one is newer.

    ``frozen_at`` is its freeze's creation time (its own registration time when the catalog
    holds no freeze for its partition, as for a hand-registered snapshot)."""

    frozen_at: float
    partition_key: str
    built_at: float
    snapshot_id: str

    def older_reason(self, newer: "Position") -> str:
        """Why this position is before ``newer``, in words."""
        if self.partition_key == newer.partition_key:
            return f"is an earlier build of its freeze (partition {self.partition_key})"
        return (
            f"was frozen before it (partition {self.partition_key}, before {newer.partition_key})"
        )


@dataclass(frozen=True)
class Event:
    """One audit row: a move of a snapshot, who made it and why."""

    from_state: str | None
    to_state: str
    actor: str
    detail: str | None
    at: float


def register(
    catalog: Catalog,
    snapshot_id: str,
    partition_key: str,
    manifest_digest: str,
    alias: str,
    build_id: str | None = None,
) -> Snapshot:
    """Record a new manifest as BUILDING; a rebuild of the same snapshot keeps its state, except
    that a REJECTED one starts a new attempt (REJECTED -> BUILDING, numbered in its history)."""
    now = time.time()
    with catalog.begin() as conn:
        row = _row(conn, snapshot_id)
        if row is not None and row["state"] == REJECTED:
            attempt = 1 + _count_events(conn, snapshot_id, BUILDING)
            detail = f"attempt {attempt}: partition {partition_key} rebuilt with the same content"
            _moved(conn, snapshot_id, REJECTED, BUILDING, "builder", detail)
        if row is None:
            conn.execute(
                insert(snapshots).values(
                    snapshot_id=snapshot_id,
                    partition_key=partition_key,
                    manifest_digest=manifest_digest,
                    build_id=build_id,
                    alias=alias,
                    state=BUILDING,
                    created_at=now,
                    updated_at=now,
                )
            )
            _event(conn, snapshot_id, None, BUILDING, "builder", f"partition {partition_key}")
    return get(catalog, snapshot_id)


def transition(
    catalog: Catalog,
    snapshot_id: str,
    expected: str,
    target: str,
    actor: str,
    detail: str | None = None,
    conn: Connection | None = None,
) -> None:
    """Move ``expected`` -> ``target`` or raise; ``conn`` joins the caller's transaction (so a
    gate swap and the state move commit together)."""
    if target not in ALLOWED[expected]:
        raise StateError(f"snapshot {snapshot_id}: {expected} -> {target} is not allowed")
    if conn is None:
        with catalog.begin() as own:
            _move(own, snapshot_id, expected, target, actor, detail)
    else:
        _move(conn, snapshot_id, expected, target, actor, detail)


def refuse_expired(snapshot: Snapshot, action: str) -> None:
    """An EXPIRED snapshot's objects are gone: refuse ``action`` on it naming the state, before
    anything reads its (missing) manifest."""
    if snapshot.state == EXPIRED:
        raise StateError(
            f"refusing to {action} {snapshot.snapshot_id}: it is EXPIRED (gc removed its objects "
            "under the alias's retention.keep_generations); build its partition again instead"
        )


def expire(conn: Connection, snapshot_id: str, detail: str) -> bool:
    """In gc's transaction, ACTIVE or SUPERSEDED -> EXPIRED; False if it is in neither state."""
    row = _row(conn, snapshot_id)
    if row is None or EXPIRED not in ALLOWED[row["state"]]:
        return False
    return _moved(conn, snapshot_id, row["state"], EXPIRED, "gc", detail)


def approve(catalog: Catalog, snapshot_id: str, by: str) -> Snapshot:
    """VALIDATED -> APPROVED, recording who approved (the rules are ``publish.approve``'s)."""
    if not by.strip():
        raise StateError("approval needs a non-empty --by name")
    audit_field("approved_by", by, snapshots.c.approved_by)
    with catalog.begin() as conn:
        _move(conn, snapshot_id, VALIDATED, APPROVED, by, "approved", approved_by=by)
    return get(catalog, snapshot_id)


def get(catalog: Catalog, snapshot_id: str) -> Snapshot:
    """The snapshot as the catalog has it now; StateError if unknown."""
    with catalog.begin() as conn:
        row = _row(conn, snapshot_id)
    if row is None:
        raise StateError(f"snapshot {snapshot_id} is not in the catalog")
    return Snapshot(**{k: row[k] for k in Snapshot.__dataclass_fields__})


def find(
    catalog: Catalog, state: str | None = None, partition_key: str | None = None
) -> list[Snapshot]:
    """Snapshots (in ``state``, of ``partition_key``, if given), oldest first."""
    query = select(snapshots).order_by(snapshots.c.created_at, snapshots.c.snapshot_id)
    if state:
        query = query.where(snapshots.c.state == state)
    if partition_key is not None:
        query = query.where(snapshots.c.partition_key == partition_key)  # indexed
    with catalog.begin() as conn:
        rows = conn.execute(query).mappings().all()
    return [Snapshot(**{k: r[k] for k in Snapshot.__dataclass_fields__}) for r in rows]


def for_partition(catalog: Catalog, partition_key: str) -> list[Snapshot]:
    """One partition's snapshots, oldest first (its rows only, not every snapshot's)."""
    return find(catalog, partition_key=partition_key)


def last_events(catalog: Catalog, snapshot_ids: list[str]) -> dict[str, Event]:
    """Each snapshot's newest audit event, in one query per 500 ids (``status`` shows why every
    ended snapshot ended: a query each grew with the home's history)."""
    found: dict[str, Event] = {}
    with catalog.begin() as conn:
        for at in range(0, len(snapshot_ids), 500):  # under any backend's bound-parameter limit
            rows = conn.execute(
                select(snapshot_events)
                .where(snapshot_events.c.snapshot_id.in_(snapshot_ids[at : at + 500]))
                .order_by(snapshot_events.c.id)
            ).mappings()
            for r in rows:  # oldest first: the newest stays
                found[r["snapshot_id"]] = Event(**{k: r[k] for k in Event.__dataclass_fields__})
    return found


def history(catalog: Catalog, snapshot_id: str) -> list[Event]:
    """The snapshot's audit events, oldest first."""
    with catalog.begin() as conn:
        rows = conn.execute(
            select(snapshot_events)
            .where(snapshot_events.c.snapshot_id == snapshot_id)
            .order_by(snapshot_events.c.id)
        ).mappings()
        return [Event(**{k: r[k] for k in Event.__dataclass_fields__}) for r in rows]


def positions(catalog: Catalog, alias: str) -> dict[str, Position]:
    """Every snapshot of ``alias`` by id, with its ``Position``."""
    with catalog.begin() as conn:
        return {sid: position for sid, (position, _state) in _ordered(conn, alias).items()}


def supersede_older(conn: Connection, alias: str, newer: str, actor: str, detail: str) -> list[str]:
    """In the caller's transaction, move every VALIDATED or APPROVED snapshot of ``alias`` older
    than ``newer`` to SUPERSEDED; returns their ids. One that moved meanwhile (approved, say) is
    re-read and superseded from its new state if that is still a candidate."""
    ordered = _ordered(conn, alias)
    done = []
    for sid, (position, state) in ordered.items():
        while position < ordered[newer][0] and state in SUPERSEDABLE:
            if _moved(conn, sid, state, SUPERSEDED, actor, detail):
                done.append(sid)
                break
            state = _row(conn, sid)["state"]
    return done


def _ordered(conn: Connection, alias: str) -> dict[str, tuple[Position, str]]:
    """Each snapshot of ``alias`` with its position and state, oldest first."""
    rows = conn.execute(
        select(
            snapshots.c.snapshot_id,
            snapshots.c.partition_key,
            snapshots.c.created_at,
            snapshots.c.state,
            freezes.c.created_at.label("frozen_at"),
        )
        .select_from(
            snapshots.outerjoin(freezes, freezes.c.partition_key == snapshots.c.partition_key)
        )
        .where(snapshots.c.alias == alias)
    ).all()
    ordered = {
        r.snapshot_id: (
            Position(
                r.created_at if r.frozen_at is None else r.frozen_at,
                r.partition_key,
                r.created_at,
                r.snapshot_id,
            ),
            r.state,
        )
        for r in rows
    }
    return dict(sorted(ordered.items(), key=lambda item: item[1][0]))


def _count_events(conn: Connection, snapshot_id: str, to_state: str) -> int:
    return conn.scalar(
        select(func.count())
        .select_from(snapshot_events)
        .where(snapshot_events.c.snapshot_id == snapshot_id)
        .where(snapshot_events.c.to_state == to_state)
    )


def _row(conn: Connection, snapshot_id: str) -> Any:
    return (
        conn.execute(select(snapshots).where(snapshots.c.snapshot_id == snapshot_id))
        .mappings()
        .first()
    )


def _move(
    conn: Connection,
    snapshot_id: str,
    expected: str,
    target: str,
    actor: str,
    detail: str | None,
    **extra: Any,
) -> None:
    if not _moved(conn, snapshot_id, expected, target, actor, detail, **extra):
        row = _row(conn, snapshot_id)
        if row is None:
            raise StateError(f"snapshot {snapshot_id} is not in the catalog")
        raise StateError(
            f"snapshot {snapshot_id} is {row['state']}, not {expected}; cannot move it to {target}"
        )


def _moved(
    conn: Connection,
    snapshot_id: str,
    expected: str,
    target: str,
    actor: str,
    detail: str | None,
    **extra: Any,
) -> bool:
    """The conditional UPDATE and its audit row; False (nothing written) if not ``expected``."""
    if target not in ALLOWED[expected]:
        raise StateError(f"snapshot {snapshot_id}: {expected} -> {target} is not allowed")
    moved = conn.execute(
        update(snapshots)
        .where(snapshots.c.snapshot_id == snapshot_id)
        .where(snapshots.c.state == expected)
        .values(state=target, updated_at=time.time(), **extra)
    ).rowcount
    if moved == 1:
        _event(conn, snapshot_id, expected, target, actor, detail)
    return moved == 1


def _event(
    conn: Connection,
    snapshot_id: str,
    source: str | None,
    target: str,
    actor: str,
    detail: str | None,
) -> None:
    audit_field("actor", actor, snapshot_events.c.actor)  # every state move writes it here
    conn.execute(
        insert(snapshot_events).values(
            snapshot_id=snapshot_id,
            from_state=source,
            to_state=target,
            actor=actor,
            detail=detail,
            at=time.time(),
        )
    )
