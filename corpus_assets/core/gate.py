"""The alias gate: one row per alias that activation and fence advances compete on.

Activation is a single conditional UPDATE that succeeds only if the tombstone watermark and the
benchmark fence still equal the manifest's and the generation has not moved since it was read.
Whichever of activation and a fence advance commits first wins; the other sees rowcount 0.
"""

import time
from dataclasses import dataclass

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from corpus_assets.core import states
from corpus_assets.core.catalog import Catalog, alias_history, gate


class GateError(RuntimeError):
    """Activation refused: a fence moved, the generation raced, or the snapshot is not APPROVED."""


@dataclass(frozen=True)
class Gate:
    alias: str
    tombstone_watermark: int
    benchmark_fence: int
    generation: int
    active_snapshot: str | None


def read_gate(catalog: Catalog, alias: str) -> Gate:
    """The alias's gate row, created at generation 0 with zero watermarks on first use."""
    with catalog.begin() as conn:
        row = conn.execute(select(gate).where(gate.c.alias == alias)).mappings().first()
    if row is None:
        try:
            with catalog.begin() as conn:
                conn.execute(
                    insert(gate).values(
                        alias=alias,
                        tombstone_watermark=0,
                        benchmark_fence=0,
                        generation=0,
                        active_snapshot=None,
                        updated_at=time.time(),
                    )
                )
        except IntegrityError:
            pass
        return read_gate(catalog, alias)
    return Gate(**{k: row[k] for k in Gate.__dataclass_fields__})


def activate(
    catalog: Catalog, snapshot_id: str, tombstone_watermark: int, benchmark_fence: int, actor: str
) -> Gate:
    """Compare-and-swap the alias to ``snapshot_id``; returns the gate row after the swap."""
    snapshot = states.get(catalog, snapshot_id)
    if snapshot.state != states.APPROVED:
        raise GateError(f"snapshot {snapshot_id} is {snapshot.state}; only APPROVED can activate")
    seen = read_gate(catalog, snapshot.alias)
    if (seen.tombstone_watermark, seen.benchmark_fence) != (tombstone_watermark, benchmark_fence):
        raise GateError(
            f"alias {snapshot.alias!r}: gate is at tombstone {seen.tombstone_watermark}, benchmark "
            f"fence {seen.benchmark_fence}; the manifest was built at {tombstone_watermark}, "
            f"{benchmark_fence}. Build a new snapshot."
        )
    now = time.time()
    with catalog.begin() as conn:
        swapped = conn.execute(
            update(gate)
            .where(gate.c.alias == snapshot.alias)
            .where(gate.c.tombstone_watermark == tombstone_watermark)
            .where(gate.c.benchmark_fence == benchmark_fence)
            .where(gate.c.generation == seen.generation)
            .values(generation=seen.generation + 1, active_snapshot=snapshot_id, updated_at=now)
        ).rowcount
        if swapped != 1:
            raise GateError(
                f"alias {snapshot.alias!r}: the gate moved while activating {snapshot_id} "
                "(a fence advanced or another activation won); nothing was changed"
            )
        conn.execute(
            insert(alias_history).values(
                alias=snapshot.alias,
                generation=seen.generation + 1,
                snapshot_id=snapshot_id,
                at=now,
            )
        )
        states.transition(
            catalog,
            snapshot_id,
            states.APPROVED,
            states.ACTIVE,
            actor,
            f"alias {snapshot.alias} generation {seen.generation + 1}",
            conn=conn,
        )
    return read_gate(catalog, snapshot.alias)
