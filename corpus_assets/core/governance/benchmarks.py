"""The benchmark registry: items no snapshot may train on, behind a fence on every alias.

Registering items advances every alias's benchmark fence to the last item's sequence number, so
a snapshot built before them cannot activate; builds at or above the fence exclude them.
"""

import time
from dataclasses import dataclass

from sqlalchemy import insert

from corpus_assets.core.governance import gate
from corpus_assets.core.storage.catalog import Catalog, benchmark_items


@dataclass(frozen=True)
class BenchmarkItem:
    """One item, by the keys contamination checks match on (never its text inline)."""

    item_id: str
    text_digest: str  # the item's text in the CAS
    dedup_key: str


def add_benchmark_items(catalog: Catalog, benchmark: str, items: list[BenchmarkItem]) -> int:
    """Register benchmark items (in item id order) and advance every alias's benchmark fence."""
    with catalog.begin() as conn:
        gate.lock_registrations(conn)  # an alias created meanwhile starts at or above ``seq``
        seq = 0
        for item in sorted(set(items), key=lambda i: i.item_id):
            seq = conn.execute(
                insert(benchmark_items)
                .values(
                    benchmark=benchmark,
                    item_id=item.item_id,
                    text_digest=item.text_digest,
                    dedup_key=item.dedup_key,
                    at=time.time(),
                )
                .returning(benchmark_items.c.seq)
            ).scalar_one()
        if seq:
            gate.fence_every_alias(conn, "benchmark_fence", seq)
    return seq
