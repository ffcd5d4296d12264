"""The alias gate: one row per alias that activation and fence advances compete on.

Activation is a single conditional UPDATE that succeeds only if the tombstone watermark and the
benchmark fence still equal the manifest's and the generation has not moved since it was read.
Whichever of activation and a fence advance commits first wins; the other sees rowcount 0.
Tombstones (``tombstones``) and benchmark items (``benchmarks``) advance the fences through
``fence_every_alias``; this module owns the row and every write to it.
"""

import time
from dataclasses import dataclass

from sqlalchemy import Connection, false, func, insert, literal, null, select, update
from sqlalchemy.exc import IntegrityError

from corpus_assets.core.governance import states
from corpus_assets.core.storage import failpoints
from corpus_assets.core.storage.catalog import (
    Catalog,
    alias_history,
    benchmark_items,
    gate,
    snapshot_events,
    snapshots,
    tombstones,
)

FENCES = ("tombstone_watermark", "benchmark_fence")
# pg_advisory_xact_lock key that registrations and gate-row creation serialise on
REGISTRATION_LOCK = 0x636F7270_6761_7465  # "corp" "ga" "te"


class AliasGateError(RuntimeError):
    """Activation refused: a fence moved, the generation raced, or the snapshot is not APPROVED."""


@dataclass(frozen=True)
class AliasGate:
    """An alias's gate row as read: what a compare-and-swap expects still to be there."""

    alias: str
    tombstone_watermark: int
    benchmark_fence: int
    generation: int
    active_snapshot: str | None


def read_alias_gate(catalog: Catalog, alias: str) -> AliasGate:
    """The alias's gate row; on first use created at generation 0 with its fences at the
    registries' heads, so tombstones and benchmark items registered before it bind it too."""
    with catalog.begin() as conn:
        row = conn.execute(select(gate).where(gate.c.alias == alias)).mappings().first()
    if row is None:
        _create_at_heads(catalog, alias)
        return read_alias_gate(catalog, alias)
    return AliasGate(**{k: row[k] for k in AliasGate.__dataclass_fields__})


def lock_registrations(conn: Connection) -> None:
    """Serialise a registration with gate-row creation, first thing in its transaction.

    A registration fences the aliases that exist when it lists them; a row created meanwhile
    must start at or above its sequence number. On PostgreSQL both take this transaction-level
    advisory lock, so whichever comes second sees the other committed (READ COMMITTED reads per
    statement). SQLite writers are serial, but a transaction only takes the write lock at its
    first write, so it takes it here with an UPDATE of no row: whatever the caller reads next
    (the registry, the heads) no other writer changes before it commits.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_advisory_xact_lock(REGISTRATION_LOCK)))
    elif conn.dialect.name == "sqlite":
        conn.execute(update(benchmark_items).where(false()).values(at=benchmark_items.c.at))


def _create_at_heads(catalog: Catalog, alias: str) -> None:
    """Insert the alias's row at the newest tombstone and benchmark item, read in the insert
    itself under ``lock_registrations``; a concurrent creator of the same alias wins quietly."""
    heads = select(
        literal(alias),
        select(func.coalesce(func.max(tombstones.c.seq), 0)).scalar_subquery(),
        select(func.coalesce(func.max(benchmark_items.c.seq), 0)).scalar_subquery(),
        literal(0),
        null(),
        literal(time.time()),
    )
    columns = ["alias", *FENCES, "generation", "active_snapshot", "updated_at"]
    try:
        with catalog.begin() as conn:
            lock_registrations(conn)
            conn.execute(insert(gate).from_select(columns, heads))
    except IntegrityError:
        pass


def _swap(conn: Connection, seen: AliasGate, **values: object) -> bool:
    """The one conditional UPDATE everything competes with: succeeds only on the row ``seen``."""
    return (
        conn.execute(
            update(gate)
            .where(gate.c.alias == seen.alias)
            .where(gate.c.tombstone_watermark == seen.tombstone_watermark)
            .where(gate.c.benchmark_fence == seen.benchmark_fence)
            .where(gate.c.generation == seen.generation)
            .values(updated_at=time.time(), **values)
        ).rowcount
        == 1
    )


_MOVES = (
    ("tombstone_watermark", "tombstone watermark", "a tombstone"),
    ("benchmark_fence", "benchmark fence", "a benchmark registration"),
    ("generation", "generation", "another activation or rollback"),
)


def _moved(conn: Connection, seen: AliasGate) -> str:
    """What changed on the gate row since ``seen``, and what kind of change did it: the loser
    of a race is told which fence (or activation) won."""
    now = conn.execute(select(gate).where(gate.c.alias == seen.alias)).mappings().one()
    moved = [
        (f"{label} {getattr(seen, column)} -> {now[column]}", cause)
        for column, label, cause in _MOVES
        if now[column] != getattr(seen, column)
    ]
    return "; ".join(what for what, _ in moved) + ": " + " and ".join(c for _, c in moved)


def _point(conn: Connection, seen: AliasGate, snapshot_id: str, actor: str, detail: str) -> None:
    """Swap the alias to ``snapshot_id`` at the next generation and record it in the history."""
    generation = seen.generation + 1
    if not _swap(conn, seen, generation=generation, active_snapshot=snapshot_id):
        raise AliasGateError(
            f"alias {seen.alias!r}: the gate moved while {detail} {snapshot_id} "
            f"({_moved(conn, seen)} committed first); nothing was changed"
        )
    conn.execute(
        insert(alias_history).values(
            alias=seen.alias, generation=generation, snapshot_id=snapshot_id, at=time.time()
        )
    )


def activate(
    catalog: Catalog,
    snapshot_id: str,
    tombstone_watermark: int,
    benchmark_fence: int,
    actor: str,
    seen: AliasGate | None = None,
) -> AliasGate:
    """Compare-and-swap the alias to ``snapshot_id``; returns the gate row after the swap.

    ``seen`` is the gate row the caller decided on (read now if not given); if anything moved
    since - a tombstone, the benchmark fence, another activation - nothing changes. A snapshot
    older than the one ``seen`` serves is refused (``refuse_backwards``); the swap also makes every
    VALIDATED or APPROVED snapshot of the alias older than this one SUPERSEDED, in the same
    transaction, so none of them can be activated after it.
    """
    snapshot = states.get(catalog, snapshot_id)
    seen = seen or read_alias_gate(catalog, snapshot.alias)
    refuse_backwards(catalog, snapshot, seen.active_snapshot)
    if snapshot.state != states.APPROVED:
        raise AliasGateError(
            f"snapshot {snapshot_id} is {snapshot.state}; only APPROVED can activate"
        )
    where = f"alias {snapshot.alias} generation {seen.generation + 1}"
    try:
        if (seen.tombstone_watermark, seen.benchmark_fence) != (
            tombstone_watermark,
            benchmark_fence,
        ):
            raise AliasGateError(
                f"alias {snapshot.alias!r}: gate is at tombstone {seen.tombstone_watermark}, "
                f"benchmark fence {seen.benchmark_fence}; the manifest was built at "
                f"{tombstone_watermark}, {benchmark_fence}. Build a new snapshot."
            )
        failpoints.hit("gate/activate-read")  # watermarks read, swap not yet tried
        with catalog.begin() as conn:
            _point(conn, seen, snapshot_id, actor, "activating")
            states.transition(
                catalog, snapshot_id, states.APPROVED, states.ACTIVE, actor, where, conn=conn
            )
            superseded_by = (
                f"superseded by {snapshot_id} (partition {snapshot.partition_key}, {where})"
            )
            states.supersede_older(conn, snapshot.alias, snapshot_id, actor, superseded_by)
    except AliasGateError as error:
        _refused(catalog, snapshot, actor, "activation", error)
        raise
    return read_alias_gate(catalog, snapshot.alias)


def _refused(
    catalog: Catalog, snapshot: states.Snapshot, actor: str, action: str, error: AliasGateError
) -> None:
    """Leave a refused activation or rollback in the snapshot's audit trail (its state does not
    move: from and to are the same), so the alias's history shows who tried and which fence or
    race stopped it."""
    with catalog.begin() as conn:
        conn.execute(
            insert(snapshot_events).values(
                snapshot_id=snapshot.snapshot_id,
                from_state=snapshot.state,
                to_state=snapshot.state,
                actor=actor,
                detail=f"{action} refused: {error}",
                at=time.time(),
            )
        )


def refuse_backwards(
    catalog: Catalog, snapshot: states.Snapshot, active: str | None, action: str = "activate"
) -> None:
    """An alias only moves to a later freeze (``states.Position``): refuse ``snapshot`` if it is
    older than ``active``, what the alias serves now. Going back is ``rollback``'s alone."""
    if active is None or active == snapshot.snapshot_id:
        return
    order = states.positions(catalog, snapshot.alias)
    mine, served = order[snapshot.snapshot_id], order.get(active)
    if served is not None and mine < served:
        raise AliasGateError(
            f"refusing to {action} {snapshot.snapshot_id} ({snapshot.state}): alias "
            f"{snapshot.alias!r} serves {active}, and this snapshot {mine.older_reason(served)}; "
            "an alias only moves to a later freeze (only `corpus-assets rollback` goes back, to "
            "a snapshot that was active)"
        )


def rollback(
    catalog: Catalog, snapshot_id: str, tombstone_watermark: int, benchmark_fence: int, actor: str
) -> AliasGate:
    """Point the alias back at an earlier ACTIVE snapshot under a new, higher generation.

    Refused if the snapshot was built before the gate's tombstone watermark or benchmark fence:
    a rollback must never resurrect revoked or benchmark-contaminated data.
    """
    snapshot = states.get(catalog, snapshot_id)
    states.refuse_expired(snapshot, "roll back to")
    seen = read_alias_gate(catalog, snapshot.alias)
    with catalog.begin() as conn:
        was_active = conn.scalar(
            select(alias_history.c.generation)
            .where(alias_history.c.alias == snapshot.alias)
            .where(alias_history.c.snapshot_id == snapshot_id)
            .limit(1)
        )
    if was_active is None or snapshot.state != states.ACTIVE:
        raise AliasGateError(f"snapshot {snapshot_id} was never active on {snapshot.alias!r}")
    if seen.active_snapshot == snapshot_id:
        raise AliasGateError(f"alias {snapshot.alias!r} already points at {snapshot_id}")
    try:
        _roll_back(catalog, snapshot, seen, (tombstone_watermark, benchmark_fence), actor)
    except AliasGateError as error:
        _refused(catalog, snapshot, actor, "rollback", error)
        raise
    return read_alias_gate(catalog, snapshot.alias)


def _roll_back(
    catalog: Catalog,
    snapshot: states.Snapshot,
    seen: AliasGate,
    built_at: tuple[int, int],
    actor: str,
) -> None:
    """The fence checks and the swap of ``rollback``; AliasGateError if either refuses."""
    snapshot_id = snapshot.snapshot_id
    if built_at[0] < seen.tombstone_watermark:
        raise AliasGateError(
            f"rollback to {snapshot_id} refused: it was built at tombstone watermark "
            f"{built_at[0]}, the gate is at {seen.tombstone_watermark}; it may hold "
            "revoked records"
        )
    if built_at[1] < seen.benchmark_fence:
        raise AliasGateError(
            f"rollback to {snapshot_id} refused: it was built at benchmark fence "
            f"{built_at[1]}, the gate is at {seen.benchmark_fence}"
        )
    with catalog.begin() as conn:
        still_active = conn.execute(  # locks the row: a gc expiring it meanwhile waits or wins
            update(snapshots)
            .where(snapshots.c.snapshot_id == snapshot_id)
            .where(snapshots.c.state == states.ACTIVE)
            .values(updated_at=time.time())
        ).rowcount
        if still_active != 1:
            raise AliasGateError(f"rollback to {snapshot_id} refused: gc expired it meanwhile")
        _point(conn, seen, snapshot_id, actor, "rolling back to")
        conn.execute(
            insert(snapshot_events).values(
                snapshot_id=snapshot_id,
                from_state=states.ACTIVE,
                to_state=states.ACTIVE,
                actor=actor,
                detail=f"rollback: alias {snapshot.alias} generation {seen.generation + 1}",
                at=time.time(),
            )
        )


def fence_every_alias(conn: Connection, fence: str, value: int) -> None:
    """Raise ``fence`` to at least ``value`` on every alias, inside the caller's transaction."""
    column = _fence_column(fence)
    for alias in conn.scalars(select(gate.c.alias)).all():
        _raise_fence(conn, alias, column, value)


def _raise_fence(conn: Connection, alias: str, column: str, value: int) -> None:
    """Compare-and-swap until it lands: losing to an activation re-reads the row and tries
    again, so the fence always lands and an activation that read the old value cannot commit."""
    while True:
        row = conn.execute(select(gate).where(gate.c.alias == alias)).mappings().one()
        seen = AliasGate(**{k: row[k] for k in AliasGate.__dataclass_fields__})
        if row[column] >= value or _swap(conn, seen, **{column: value}):
            return


def _fence_column(fence: str) -> str:
    """The column name, checked: a fence name becomes SQL, so only the two known ones pass."""
    if fence not in FENCES:
        raise AliasGateError(f"{fence!r} is not a gate fence ({', '.join(FENCES)})")
    return fence
