"""Snapshot state machine: BUILDING -> VALIDATED -> APPROVED -> ACTIVE, plus INCOMPLETE/REJECTED.

States only move forward. Every move is one conditional UPDATE (``WHERE state = :expected``), so
two racing actors cannot both move a snapshot, and each move leaves an audit event.
"""

import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, insert, select, update

from corpus_assets.core.storage.catalog import Catalog, snapshot_events, snapshots

BUILDING, VALIDATED, APPROVED, ACTIVE = "BUILDING", "VALIDATED", "APPROVED", "ACTIVE"
INCOMPLETE, REJECTED = "INCOMPLETE", "REJECTED"

ALLOWED: dict[str, set[str]] = {
    BUILDING: {VALIDATED, INCOMPLETE, REJECTED},
    VALIDATED: {APPROVED, INCOMPLETE, REJECTED},
    APPROVED: {ACTIVE, INCOMPLETE, REJECTED},
    ACTIVE: set(),
    INCOMPLETE: set(),
    REJECTED: set(),
}


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


def register(
    catalog: Catalog,
    snapshot_id: str,
    partition_key: str,
    manifest_digest: str,
    alias: str,
    build_id: str | None = None,
) -> Snapshot:
    """Record a new manifest as BUILDING; a rebuild of the same snapshot keeps its state."""
    now = time.time()
    with catalog.begin() as conn:
        if _row(conn, snapshot_id) is None:
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


def approve(catalog: Catalog, snapshot_id: str, by: str) -> Snapshot:
    """VALIDATED -> APPROVED, recording who approved (the rules are ``publish.approve``'s)."""
    if not by.strip():
        raise StateError("approval needs a non-empty --by name")
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


def find(catalog: Catalog, state: str | None = None) -> list[Snapshot]:
    """Snapshots (in ``state``, if given), oldest first."""
    query = select(snapshots).order_by(snapshots.c.created_at, snapshots.c.snapshot_id)
    if state:
        query = query.where(snapshots.c.state == state)
    with catalog.begin() as conn:
        rows = conn.execute(query).mappings().all()
    return [Snapshot(**{k: r[k] for k in Snapshot.__dataclass_fields__}) for r in rows]


def for_partition(catalog: Catalog, partition_key: str) -> list[Snapshot]:
    return [s for s in find(catalog) if s.partition_key == partition_key]


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
    if target not in ALLOWED[expected]:
        raise StateError(f"snapshot {snapshot_id}: {expected} -> {target} is not allowed")
    moved = conn.execute(
        update(snapshots)
        .where(snapshots.c.snapshot_id == snapshot_id)
        .where(snapshots.c.state == expected)
        .values(state=target, updated_at=time.time(), **extra)
    ).rowcount
    if moved != 1:
        row = _row(conn, snapshot_id)
        if row is None:
            raise StateError(f"snapshot {snapshot_id} is not in the catalog")
        raise StateError(
            f"snapshot {snapshot_id} is {row['state']}, not {expected}; cannot move it to {target}"
        )
    _event(conn, snapshot_id, expected, target, actor, detail)


def _event(
    conn: Connection,
    snapshot_id: str,
    source: str | None,
    target: str,
    actor: str,
    detail: str | None,
) -> None:
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
