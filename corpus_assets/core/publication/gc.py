"""Garbage collection of the CAS: remove the objects nothing retained can reach.

Live objects are the closure, by ``verify.reachable`` (the walk ``verify`` does: declared refs of
typed documents only, ``storage.refs``), of these roots:

- the manifest of every retained snapshot. A snapshot is dropped only when the alias's
  ``retention.keep_generations`` is set and it is SUPERSEDED, or ACTIVE in state but neither the
  alias's active snapshot nor one of its last N generations; never when a training permit names
  it. BUILDING/VALIDATED/APPROVED (not superseded yet) and REJECTED/INCOMPLETE snapshots (the
  quarantine: the evidence of why a snapshot was refused) are always kept, as are the
  snapshots of other aliases, whose retention this config does not set;
- the freeze spec and current layer indexes of every partition with a retained snapshot or with
  none yet (an open build: its finished layers are referenced by ``layer_outputs`` only);
- the outputs of successful chunk tasks finished since the earliest open build's freeze (chunk
  tasks name no partition, so all of them from then on: an open build resumes with them);
- benchmark item texts;
- the deletion index (``governance.deletion_index``) of every retained snapshot, when whole.

Memo rows (``layer_memo``) and older chunk tasks are not roots: every reader checks that their
objects are present and rebuilds otherwise, so removing them costs time, never correctness.

The lock: ``storage.cas_lock`` (gc holds it exclusive from listing the CAS to the last delete).

An S3 CAS: gc lists the store under its prefix (sizes from the listing); keys that are not
``sha256/ab/cd/<hex>`` objects are reported and left alone. Before deleting (``DeleteObjects``,
1,000 keys a call) it writes the list to the store's gc log; every writer, once it holds the
lock, drops from its node's cache what the logs since its last look name. Without that, a
node's cached copy of a removed object would pass ``contains`` and a memo or chunk-task check
there, and a build would name an object the store no longer has. Left open: a reader that
holds no lock (``verify``, ``read``) downloading an object while gc removes it may cache it
after its node's writer looked at the log.
"""

import contextlib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from corpus_assets.core.governance import deletion_index, states
from corpus_assets.core.publication.verify import reachable
from corpus_assets.core.storage import failpoints
from corpus_assets.core.storage.artifacts import BINARY, JSON, Ref, make_ref
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_s3 import S3ContentStore
from corpus_assets.core.storage.catalog import (
    Catalog,
    alias_history,
    benchmark_items,
    chunk_tasks,
    freezes,
    gate,
    layer_outputs,
    permits,
)
from corpus_assets.core.storage.refs import kind_of

KEPT_STATES = (
    states.BUILDING,
    states.VALIDATED,
    states.APPROVED,
    states.REJECTED,
    states.INCOMPLETE,
)
SMALL_JSON = 1 << 20  # a catalog-named object this small, if a typed document, is walked
FOREIGN_SHOWN = 100  # foreign keys named in the report (all are counted)


class GcError(RuntimeError):
    """gc cannot tell what is live, so it removes nothing."""


@dataclass
class Plan:
    """What gc keeps and what it would remove (digest, bytes), in digest order; the entries in
    the store that are not CAS objects (left alone: counted, the first ``FOREIGN_SHOWN`` named)."""

    retained: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    live: int = 0
    garbage: list[tuple[str, int]] = field(default_factory=list)
    foreign: list[tuple[str, int]] = field(default_factory=list)
    foreign_count: int = 0
    foreign_bytes: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "retained_snapshots": self.retained,
            "dropped_snapshots": self.dropped,
            "live_objects": self.live,
            "objects": [{"digest": d, "bytes": n} for d, n in self.garbage],
            "bytes": sum(n for _, n in self.garbage),
            "foreign": {
                "count": self.foreign_count,
                "bytes": self.foreign_bytes,
                "shown": [{"key": k, "bytes": n} for k, n in self.foreign],
            },
        }

    def add_foreign(self, where: str, size: int) -> None:
        self.foreign_count += 1
        self.foreign_bytes += size
        if len(self.foreign) < FOREIGN_SHOWN:
            self.foreign.append((where, size))


def retained_snapshots(
    catalog: Catalog, alias: str, keep: int | None
) -> tuple[list[str], list[str]]:
    """(retained, dropped) snapshot ids by the alias's retention policy (module docstring).
    EXPIRED snapshots are in neither: their objects are garbage already."""
    with catalog.begin() as conn:
        served = set(conn.scalars(select(gate.c.active_snapshot)))  # of every alias
        history = conn.scalars(
            select(alias_history.c.snapshot_id)
            .where(alias_history.c.alias == alias)
            .order_by(alias_history.c.generation.desc())
        ).all()
        permitted = set(conn.scalars(select(permits.c.snapshot_id)))
    held = (set(history[:keep]) if keep is not None else set()) | permitted | served
    retained, dropped = [], []
    for snap in states.find(catalog):
        if snap.state == states.EXPIRED:
            continue
        keeps = (
            keep is None
            or snap.alias != alias
            or snap.state in KEPT_STATES
            or snap.snapshot_id in held
        )
        (retained if keeps else dropped).append(snap.snapshot_id)
    return sorted(retained), sorted(dropped)


def expire(catalog: Catalog, planned: Plan) -> None:
    """Before any delete, in one transaction: move every dropped snapshot to EXPIRED, so no
    state names a snapshot whose objects are going (a gc killed after this commit leaves them
    EXPIRED with their objects; the rerun removes those). GcError, nothing changed, if one of them
    became what an alias serves or a permit names since the plan (a rollback meanwhile)."""
    if not planned.dropped:
        return
    detail = "removed by gc: older than the alias's retention.keep_generations"
    with catalog.begin() as conn:
        for snapshot_id in planned.dropped:
            states.expire(conn, snapshot_id, detail)  # locks the row against a rollback
        served = set(conn.scalars(select(gate.c.active_snapshot)))
        permitted = set(conn.scalars(select(permits.c.snapshot_id)))
        taken = sorted((served | permitted) & set(planned.dropped))
        if taken:
            raise GcError(
                f"snapshot {taken[0]} was served or permitted while gc planned; gc removes "
                "nothing, run it again"
            )
    failpoints.hit("gc/expired")  # marked EXPIRED, nothing deleted yet


def _named(cas: ContentStore, digests: list[str]) -> tuple[list[Ref], list[Ref]]:
    """Catalog-named objects as (typed documents, leaves): a small JSON document of a declared
    kind (``storage.refs``: freeze specs, layer indexes, chunk and token descriptors) is walked;
    anything else the catalog names (a task's table or array) is kept as it is, never read for
    references."""
    typed, leaves = [], []
    for digest in digests:
        size = cas.size(digest)
        document = None
        if size <= SMALL_JSON:
            with contextlib.suppress(ValueError):
                document = json.loads(cas.get_bytes(digest))
        declared = kind_of(document) is not None
        (typed if declared else leaves).append(make_ref(digest, JSON if declared else BINARY, size))
    return typed, leaves


def _partition_roots(catalog: Catalog, retained: set[str]) -> tuple[list[str], float | None]:
    """Freeze specs and layer indexes of kept partitions; when the earliest open build froze."""
    roots: list[str] = []
    earliest_open: float | None = None
    with catalog.begin() as conn:
        frozen = conn.execute(
            select(freezes.c.partition_key, freezes.c.spec_digest, freezes.c.created_at)
        ).all()
        layers = conn.execute(
            select(layer_outputs.c.partition_key, layer_outputs.c.index_digest)
        ).all()
    # one pass over each table: per partition, a query of every snapshot and a scan of every
    # layer row made gc quadratic in a home's history (a daily build's gc grew ~5 ms a day)
    by_partition: dict[str, list[states.Snapshot]] = defaultdict(list)
    for snapshot in states.find(catalog):
        by_partition[snapshot.partition_key].append(snapshot)
    indexes: dict[str, list[str]] = defaultdict(list)
    for part, digest in layers:
        indexes[part].append(digest)
    for key, spec, created in frozen:
        snaps = by_partition.get(key, [])
        if snaps and not any(s.snapshot_id in retained for s in snaps):
            continue
        roots.append(spec)
        roots += indexes.get(key, [])
        if not snaps or any(s.state == states.BUILDING for s in snaps):
            earliest_open = created if earliest_open is None else min(earliest_open, created)
    return roots, earliest_open


def _task_outputs(catalog: Catalog, since: float | None) -> list[str]:
    if since is None:
        return []
    with catalog.begin() as conn:
        return list(
            conn.scalars(
                select(chunk_tasks.c.output_digest)
                .where(chunk_tasks.c.status == "SUCCESS")
                .where(chunk_tasks.c.output_digest.is_not(None))
                .where(chunk_tasks.c.updated_at >= since)
            )
        )


def live_objects(cas: ContentStore, catalog: Catalog, retained: list[str]) -> set[str]:
    """Every digest a root reaches; GcError if a document on the way is missing or corrupt."""
    keep = set(retained)
    manifests = [s.manifest_digest for s in states.find(catalog) if s.snapshot_id in keep]
    named, earliest_open = _partition_roots(catalog, keep)
    named += [d for d in _task_outputs(catalog, earliest_open) if cas.contains(d)]
    roots = [make_ref(d, JSON, cas.size(d) if cas.contains(d) else 0) for d in manifests]
    missing = [d for d in named if not cas.contains(d)]
    if missing:
        raise GcError(f"catalog-named objects are missing, gc removes nothing: {missing[:5]}")
    typed, leaves = _named(cas, named)
    live, findings = reachable(cas, roots + typed, leaves)
    if findings:
        raise GcError("cannot walk every retained object, gc removes nothing: " + findings[0])
    with catalog.begin() as conn:
        live |= set(conn.scalars(select(benchmark_items.c.text_digest)))
    return live | deletion_index.stored_objects(cas, catalog, manifests)


def plan(cas: ContentStore, catalog: Catalog, alias: str, keep: int | None) -> Plan:
    """What gc would remove now (call under ``cas_lock(exclusive=True)``): every object in the
    store's listing (sizes from the listing itself) that no root reaches."""
    retained, dropped = retained_snapshots(catalog, alias, keep)
    live = live_objects(cas, catalog, retained)
    planned = Plan(retained=retained, dropped=dropped, live=len(live))
    for digest, where, size in cas.listing():
        if digest is None:
            planned.add_foreign(where, size)
        elif digest not in live:
            planned.garbage.append((digest, size))
    planned.garbage.sort()
    return planned


def collect(cas: ContentStore, planned: Plan) -> None:
    """Remove every planned object (still under the exclusive lock ``plan`` ran under). From an
    object store: logged first (so every node's cache drops them), then deleted in batches."""
    digests = [digest for digest, _ in planned.garbage]
    if not isinstance(cas, S3ContentStore):
        for digest in digests:
            cas.local_path(digest).unlink(missing_ok=True)
    elif digests:
        cas.record_removal(digests)
        cas.remove(digests)
