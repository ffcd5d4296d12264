"""The benchmark registry: items no snapshot may train on, behind a fence on every alias.

The registry is one log of rows in one ``seq`` sequence (catalog table ``benchmark_items``): an
``add`` row registers an item, a ``remove`` row withdraws it, with who and when. An item is
*active* at a fence ``F`` when its ``add`` row is at or below ``F`` and no ``remove`` row of the
same item id lies between it and ``F`` (``active_items``): rows are never updated, so what a
build at ``F`` read can be read again. Registering or removing advances every alias's benchmark
fence to the change's last seq, so a snapshot built before it cannot activate (its exclusions no
longer match the registry); builds at or above the fence exclude exactly the active items.

Registration is idempotent: an id already active with the same text is one item (no row, no fence
advance); the same id with another text refuses the whole registration. Rows go in with one
executemany per batch, so thousands of items take one round trip per ``BATCH`` rows.
"""

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    and_,
    exists,
    func,
    insert,
    select,
)

from corpus_assets.core.governance import alias_gate
from corpus_assets.core.governance.audit_fields import audit_field
from corpus_assets.core.storage import failpoints
from corpus_assets.core.storage.catalog import Catalog, benchmark_items

ADD, REMOVE = "add", "remove"
BATCH = 1000  # rows per executemany, and item ids per ``IN`` list (SQLite allows 32766 variables)
COLUMNS = ("seq", "benchmark", "item_id", "text_digest", "dedup_key", "at", "actor")


class RegistryError(ValueError):
    """A registration or removal refused as a whole; nothing was written."""


@dataclass(frozen=True)
class BenchmarkItem:
    """One item, by the keys contamination checks match on (never its text inline)."""

    item_id: str
    text_digest: str  # the item's text in the CAS
    dedup_key: str
    where: str = field(default="", compare=False)  # e.g. "quiz.jsonl line 3", for errors


@dataclass(frozen=True)
class Change:
    """What a registration or removal did: rows written, ids already active, the last seq."""

    seq: int
    written: int
    unchanged: int = 0


def active_items(
    conn: Connection,
    fence: int | None,
    *,
    benchmark: str | None = None,
    item_ids: Sequence[str] | None = None,
) -> list[Row[Any]]:
    """The items active at ``fence`` (``None``: the head), in seq order, with ``COLUMNS``."""
    if item_ids is not None and len(item_ids) > BATCH:
        rows = [
            row
            for start in range(0, len(item_ids), BATCH)
            for row in active_items(
                conn, fence, benchmark=benchmark, item_ids=item_ids[start : start + BATCH]
            )
        ]
        return sorted(rows, key=lambda row: row.seq)
    items = benchmark_items
    query = select(*(items.c[name] for name in COLUMNS)).where(_active(fence))
    if fence is not None:
        query = query.where(items.c.seq <= fence)
    if benchmark is not None:
        query = query.where(items.c.benchmark == benchmark)
    if item_ids is not None:
        query = query.where(items.c.item_id.in_(item_ids))
    return list(conn.execute(query.order_by(items.c.seq)))


def _active(fence: int | None) -> ColumnElement[bool]:
    """An ``add`` row no ``remove`` row of its item id follows at or below ``fence``."""
    items, removal = benchmark_items, benchmark_items.alias("removal")
    removed = select(removal.c.seq).where(
        removal.c.action == REMOVE,
        removal.c.item_id == items.c.item_id,
        removal.c.seq > items.c.seq,
    )
    if fence is not None:
        removed = removed.where(removal.c.seq <= fence)
    return and_(items.c.action == ADD, ~exists(removed))


def add_benchmark_items(catalog: Catalog, benchmark: str, items: list[BenchmarkItem]) -> int:
    """``register`` for callers that want only the seq of the last new row (0: nothing new)."""
    change = register(catalog, benchmark, items)
    return change.seq if change.written else 0


def register(
    catalog: Catalog, benchmark: str, items: Iterable[BenchmarkItem], actor: str | None = None
) -> Change:
    """Register items (in item id order) and advance every alias's benchmark fence to the last
    new one; ids already active with the same text are skipped, another text is refused."""
    chosen = _one_per_id(items)
    _audit(benchmark, chosen, actor)
    failpoints.hit("fence/benchmark")  # the fault self-test races activation from here
    with catalog.begin() as conn:
        alias_gate.lock_registrations(conn)  # before reading what is active
        current = {row.item_id: row for row in active_items(conn, None, item_ids=sorted(chosen))}
        new = []
        for item_id in sorted(chosen):
            item, seen = chosen[item_id], current.get(item_id)
            if seen is None:
                new.append(item)
            elif seen.text_digest != item.text_digest or seen.benchmark != benchmark:
                where = f" ({item.where})" if item.where else ""
                raise RegistryError(
                    f"benchmark item {item_id!r}{where} is registered already (seq {seen.seq}, "
                    f"benchmark {seen.benchmark!r}) with another text; remove it first "
                    "(`corpus-assets benchmark remove`); nothing was registered"
                )
        rows = [_row(ADD, benchmark, i.item_id, i.text_digest, i.dedup_key, actor) for i in new]
        seq = _write(conn, rows)
    return Change(seq, len(new), len(chosen) - len(new))


def remove(
    catalog: Catalog, benchmark: str, item_ids: Sequence[str] | None = None, actor: str = ""
) -> Change:
    """Withdraw a whole benchmark, or the given item ids of it, and advance every fence."""
    _audit(benchmark, item_ids or (), actor)
    with catalog.begin() as conn:
        alias_gate.lock_registrations(conn)  # before reading what is active
        wanted = sorted(set(item_ids)) if item_ids is not None else None
        rows = active_items(conn, None, benchmark=benchmark, item_ids=wanted)
        missing = sorted(set(wanted or ()) - {row.item_id for row in rows})
        if missing or not rows:
            shown = ", ".join(map(repr, missing[:5])) + (" ..." if len(missing) > 5 else "")
            what = f"item(s) {shown}" if missing else "items"
            raise RegistryError(f"benchmark {benchmark!r} has no active {what}; nothing removed")
        removals = [
            _row(REMOVE, r.benchmark, r.item_id, r.text_digest, r.dedup_key, actor) for r in rows
        ]
        seq = _write(conn, removals)
    return Change(seq, len(removals))


def summary(catalog: Catalog) -> list[dict[str, Any]]:
    """Per benchmark with any row: its active items, their first and last seq and registration
    times, and how many removals it has had (``benchmark list``)."""
    items = benchmark_items
    with catalog.begin() as conn:
        active = {row.benchmark: row for row in _active_stats(conn)}
        history = conn.execute(
            select(
                items.c.benchmark,
                func.count().filter(items.c.action == REMOVE),
                func.max(items.c.seq),
            ).group_by(items.c.benchmark)
        ).all()
    out = []
    for name, removals, last_change in sorted(history):
        row = active.get(name)
        out.append(
            {
                "benchmark": name,
                "items": row.items if row else 0,
                "firstSeq": row.first_seq if row else None,
                "lastSeq": row.last_seq if row else None,
                "registeredAt": _iso(row.first_at) if row else None,
                "lastRegisteredAt": _iso(row.last_at) if row else None,
                "removals": int(removals or 0),
                "lastChangeSeq": last_change,
            }
        )
    return out


def _active_stats(conn: Connection) -> list[Row[Any]]:
    """(benchmark, items, first_seq, last_seq, first_at, last_at) of the active items at head,
    grouped in SQL so a large registry never comes into memory."""
    items = benchmark_items
    return list(
        conn.execute(
            select(
                items.c.benchmark,
                func.count().label("items"),
                func.min(items.c.seq).label("first_seq"),
                func.max(items.c.seq).label("last_seq"),
                func.min(items.c.at).label("first_at"),
                func.max(items.c.at).label("last_at"),
            )
            .where(_active(None))
            .group_by(items.c.benchmark)
        )
    )


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _one_per_id(items: Iterable[BenchmarkItem]) -> dict[str, BenchmarkItem]:
    """Items by id; an id given twice must carry the same text both times."""
    chosen: dict[str, BenchmarkItem] = {}
    for item in items:
        first = chosen.setdefault(item.item_id, item)
        if first.text_digest != item.text_digest:
            raise RegistryError(
                f"benchmark item {item.item_id!r} is given twice with different texts "
                f"({first.where or 'first'}, {item.where or 'second'}); nothing was registered"
            )
    return chosen


def _audit(benchmark: str, item_ids: Iterable[str], actor: str | None) -> None:
    """The registry's audit fields, checked before anything is written (``audit_fields``)."""
    audit_field("benchmark", benchmark, benchmark_items.c.benchmark)
    if actor is not None:
        audit_field("actor", actor, benchmark_items.c.actor)
    for item_id in item_ids:
        audit_field("item_id", item_id, benchmark_items.c.item_id)


def _row(
    action: str, benchmark: str, item_id: str, text: str, key: str, actor: str | None
) -> dict[str, Any]:
    return {
        "action": action,
        "benchmark": benchmark,
        "item_id": item_id,
        "text_digest": text,
        "dedup_key": key,
        "actor": actor,
        "at": time.time(),
    }


def _write(conn: Connection, rows: list[dict[str, Any]]) -> int:
    """Insert the rows a batch per executemany; fence every alias at the last seq written.
    Under ``alias_gate.lock_registrations`` no other writer interleaves: the highest seq is ours."""
    for start in range(0, len(rows), BATCH):
        conn.execute(insert(benchmark_items), rows[start : start + BATCH])
    seq = conn.scalar(select(func.coalesce(func.max(benchmark_items.c.seq), 0)))
    if rows:
        alias_gate.fence_every_alias(conn, "benchmark_fence", seq)
    return int(seq)
