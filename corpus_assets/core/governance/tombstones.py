"""Tombstones: revoking a record, source object or group, fenced through every alias's gate.

The tombstones are one log of rows in one ``seq`` sequence (catalog table ``tombstones``): an
``add`` row revokes a target, a ``lift`` row withdraws one earlier ``add`` row (a revocation
made in error, or a legal hold released), with who, why and when. A tombstone is *in force* at
a watermark ``W`` when its ``add`` row is at or below ``W`` and no ``lift`` row of it is: rows
are never updated or deleted, so what a build at ``W`` excluded can be read again, and the
audit trail keeps both the revocation and its lifting.

Recording either raises every alias's tombstone watermark to the new row's seq in the same
transaction: a snapshot built before it can no longer activate, and builds from then on
exclude exactly the tombstones in force. A lifted target stays out of every snapshot built
before the lift (they are immutable); rollback never crosses the latest watermark, so it cannot
return to them either.
"""

import time
from dataclasses import dataclass

from sqlalchemy import Connection, and_, exists, insert, select

from corpus_assets.core.governance import alias_gate
from corpus_assets.core.governance.audit_fields import audit_field
from corpus_assets.core.storage import failpoints
from corpus_assets.core.storage.catalog import Catalog, tombstones

TOMBSTONE_KINDS = ("record", "object", "group")
ADD, LIFT = "add", "lift"


@dataclass(frozen=True)
class Tombstone:
    """One ``add`` row: what it revokes."""

    seq: int
    kind: str
    target: str
    reason: str


def add_tombstone(
    catalog: Catalog, kind: str, target: str, reason: str, actor: str | None = None
) -> int:
    """Record a revocation and fence every alias at its sequence number, in one transaction."""
    if kind not in TOMBSTONE_KINDS:
        raise alias_gate.AliasGateError(
            f"tombstone kind {kind!r} is not one of {', '.join(TOMBSTONE_KINDS)}"
        )
    audit_field("target", target, tombstones.c.record_id)
    audit_field("reason", reason)
    failpoints.hit("fence/tombstone")  # the fault self-test races activation from here
    with catalog.begin() as conn:
        alias_gate.lock_registrations(conn)  # an alias created meanwhile starts at or above ``seq``
        return _append(conn, kind=kind, record_id=target, reason=reason, actor=actor)


def lift_tombstone(catalog: Catalog, seq: int, reason: str, actor: str | None = None) -> int:
    """Withdraw tombstone ``seq`` and fence every alias at the lift's own seq, in one
    transaction. Refused (nothing written) when ``seq`` is not a tombstone in force."""
    audit_field("reason", reason)
    failpoints.hit("fence/tombstone")
    with catalog.begin() as conn:
        alias_gate.lock_registrations(conn)  # before reading what is in force
        lifted = _in_force(conn, seq)
        return _append(
            conn,
            kind=lifted.kind,
            record_id=lifted.target,
            reason=reason,
            actor=actor,
            action=LIFT,
            lifts=seq,
        )


def lift_said(seq: int, lifted: int) -> str:
    """What a lift did, in the words the CLI and the UI job both print."""
    return (
        f"tombstone {seq} lifts tombstone {lifted}; every alias is fenced at tombstone watermark "
        f"{seq}: snapshots built from now on may hold its target again, earlier ones never do"
    )


def in_force(catalog: Catalog, watermark: int) -> list[Tombstone]:
    """The tombstones in force at ``watermark`` (added at or below it, not lifted at or below
    it), in seq order: what a build frozen at that watermark excludes."""
    lift = tombstones.alias("lift")
    lifted = exists().where(
        and_(lift.c.action == LIFT, lift.c.lifts == tombstones.c.seq, lift.c.seq <= watermark)
    )
    query = (
        select(tombstones.c.seq, tombstones.c.kind, tombstones.c.record_id, tombstones.c.reason)
        .where(tombstones.c.action == ADD, tombstones.c.seq <= watermark, ~lifted)
        .order_by(tombstones.c.seq)
    )
    with catalog.begin() as conn:
        return [Tombstone(*row) for row in conn.execute(query)]


def entry(catalog: Catalog, seq: int) -> dict[str, object] | None:
    """Row ``seq`` as the audit shows it: what it revokes or lifts, why, by whom, and for an
    ``add`` row the lift that withdrew it (None while it is in force)."""
    with catalog.begin() as conn:
        row = conn.execute(select(tombstones).where(tombstones.c.seq == seq)).mappings().first()
        if row is None:
            return None
        shown: dict[str, object] = {
            "tombstone": seq,
            "action": row["action"],
            "kind": row["kind"],
            "target": row["record_id"],
            "reason": row["reason"],
            "actor": row["actor"],
        }
        if row["action"] == LIFT:
            return {**shown, "lifts": row["lifts"]}
        return {**shown, "lifted_by": _lifted_by(conn, seq)}


def _lifted_by(conn: Connection, seq: int) -> int | None:
    return conn.scalar(
        select(tombstones.c.seq).where(tombstones.c.action == LIFT, tombstones.c.lifts == seq)
    )


def _in_force(conn: Connection, seq: int) -> Tombstone:
    row = conn.execute(select(tombstones).where(tombstones.c.seq == seq)).mappings().first()
    if row is None:
        raise alias_gate.AliasGateError(f"there is no tombstone {seq}; nothing lifted")
    if row["action"] != ADD:
        raise alias_gate.AliasGateError(
            f"tombstone {seq} is itself the lift of tombstone {row['lifts']}; nothing lifted"
        )
    if (lifted_by := _lifted_by(conn, seq)) is not None:
        raise alias_gate.AliasGateError(
            f"tombstone {seq} was lifted already by {lifted_by}; nothing lifted"
        )
    return Tombstone(seq, row["kind"], row["record_id"], row["reason"])


def _append(conn: Connection, **values: object) -> int:
    """Insert one row and fence every alias at its seq (the caller holds the registration
    lock, so no other writer interleaves)."""
    seq = conn.execute(
        insert(tombstones).values(at=time.time(), **values).returning(tombstones.c.seq)
    ).scalar_one()
    alias_gate.fence_every_alias(conn, "tombstone_watermark", seq)
    return seq
