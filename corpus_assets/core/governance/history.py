"""An alias's audit trail: every state move of its snapshots and every generation, in time order.

The facts are already in the catalog - ``snapshot_events`` (each move, who made it and why,
including refused activations and rollbacks) and ``alias_history`` (each generation the gate
swapped to) - and in each snapshot's manifest (the tombstone watermark and benchmark fence it
was built behind). This module joins them into one typed row per move, so the CLI
(``corpus-assets history``) and the UI show the same table.

A row's ``generation`` is the alias's generation in effect once the move committed: an
activation or rollback writes its ``alias_history`` row and its event in one transaction, the
history row first, so ordering by time gives the generation that move made. Its fences are the
snapshot's manifest's: an activation swaps only when the gate's fences equal them, and a refusal
names the gate's in its detail.
"""

import bisect
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import func, select

from corpus_assets.core.runtime.snapshot_manifest import ManifestError, read_manifest
from corpus_assets.core.storage.cas import CasError, ContentStore
from corpus_assets.core.storage.catalog import Catalog, alias_history, snapshot_events, snapshots


@dataclass(frozen=True)
class Move:
    """One row of an alias's history; ``generation`` 0 means the alias never served anything."""

    at: float
    snapshot_id: str
    partition_key: str
    from_state: str | None
    to_state: str
    actor: str
    generation: int
    tombstone_watermark: int | None  # the snapshot's manifest's (None: manifest unreadable)
    benchmark_fence: int | None
    detail: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def alias_moves(
    cas: ContentStore, catalog: Catalog, alias: str, last: int | None = None
) -> list[Move]:
    """Every move of ``alias``'s snapshots, oldest first (ties in catalog order); empty for an
    alias with no snapshot yet. ``last``: only the newest ``last`` moves, so a view refreshed
    on every state move reads a bounded number of events and manifests, however old the alias."""
    newest_first = (
        select(snapshot_events, snapshots.c.partition_key, snapshots.c.manifest_digest)
        .join(snapshots, snapshots.c.snapshot_id == snapshot_events.c.snapshot_id)
        .where(snapshots.c.alias == alias)
        .order_by(snapshot_events.c.at.desc(), snapshot_events.c.id.desc())
        .limit(last)
    )
    with catalog.begin() as conn:
        events = conn.execute(newest_first).all()[::-1]
        generations = conn.execute(
            select(alias_history.c.at, alias_history.c.generation)
            .where(alias_history.c.alias == alias)
            .order_by(alias_history.c.generation)
        ).all()
    swapped_at = [row.at for row in generations]
    fences: dict[str, tuple[int | None, int | None]] = {}
    moves = []
    for e in events:
        if e.manifest_digest not in fences:
            fences[e.manifest_digest] = _manifest_fences(cas, e.manifest_digest)
        done = bisect.bisect_right(swapped_at, e.at)  # generations committed by this move
        moves.append(
            Move(
                at=e.at,
                snapshot_id=e.snapshot_id,
                partition_key=e.partition_key,
                from_state=e.from_state,
                to_state=e.to_state,
                actor=e.actor,
                generation=generations[done - 1].generation if done else 0,
                tombstone_watermark=fences[e.manifest_digest][0],
                benchmark_fence=fences[e.manifest_digest][1],
                detail=e.detail or "",
            )
        )
    return moves


def count_moves(catalog: Catalog, alias: str) -> int:
    """How many moves ``alias_moves`` would list without ``last``."""
    with catalog.begin() as conn:
        return conn.scalar(
            select(func.count())
            .select_from(snapshot_events)
            .join(snapshots, snapshots.c.snapshot_id == snapshot_events.c.snapshot_id)
            .where(snapshots.c.alias == alias)
        )


def _manifest_fences(cas: ContentStore, digest: str) -> tuple[int | None, int | None]:
    """The fences a manifest names; (None, None) if its bytes are gone or do not verify, so the
    audit trail still shows every move (``corpus-assets verify`` names the broken object)."""
    try:
        manifest = read_manifest(cas, digest)
    except (CasError, ManifestError):
        return None, None
    return manifest.tombstone_seq, manifest.benchmark_seq


def served_generations(catalog: Catalog, alias: str) -> dict[str, int]:
    """Per snapshot of ``alias`` that ever served: the newest generation that pointed at it (an
    activation or a rollback to it). A fact of the snapshot that only its own moves change,
    unlike the alias's current generation, which every move of any snapshot changes."""
    with catalog.begin() as conn:
        rows = conn.execute(
            select(alias_history.c.snapshot_id, func.max(alias_history.c.generation))
            .where(alias_history.c.alias == alias)
            .group_by(alias_history.c.snapshot_id)
        ).all()
    return {sid: int(generation) for sid, generation in rows}
