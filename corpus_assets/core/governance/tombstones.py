"""Tombstones: revoking a record, source object or group, fenced through every alias's gate.

A tombstone is a row with a sequence number; recording it raises every alias's tombstone
watermark to that number in the same transaction, so a snapshot built before it can no longer
activate and later builds exclude what it revokes.
"""

import time

from sqlalchemy import insert

from corpus_assets.core.governance import alias_gate
from corpus_assets.core.governance.audit_fields import audit_field
from corpus_assets.core.storage import failpoints
from corpus_assets.core.storage.catalog import Catalog, tombstones

TOMBSTONE_KINDS = ("record", "object", "group")


def add_tombstone(catalog: Catalog, kind: str, target: str, reason: str) -> int:
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
        seq = conn.execute(
            insert(tombstones)
            .values(kind=kind, record_id=target, reason=reason, at=time.time())
            .returning(tombstones.c.seq)
        ).scalar_one()
        alias_gate.fence_every_alias(conn, "tombstone_watermark", seq)
    return seq
