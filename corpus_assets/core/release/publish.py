"""Approval and activation, each bound to a manifest digest (seed 001).

Approval re-verifies the snapshot before recording the approver, so nobody approves bytes that no
longer match. Activation takes the manifest's own watermarks to the gate's compare-and-swap.
"""

import json
from collections.abc import Callable
from typing import Any

from corpus_assets.core.governance import gate, states
from corpus_assets.core.release.verify import load_manifest, resolve, verify
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog


class PublishError(RuntimeError):
    pass


def approve(cas: ContentStore, catalog: Catalog, digest: str, by: str) -> states.Snapshot:
    snapshot = resolve(catalog, digest)
    report = verify(cas, catalog, snapshot.snapshot_id)
    if not report.ok:
        raise PublishError(f"refusing to approve {snapshot.snapshot_id}: {report.findings[0]}")
    return states.approve(catalog, snapshot.snapshot_id, by)


def activate(
    cas: ContentStore,
    catalog: Catalog,
    digest: str,
    actor: str,
    late_changes: Callable[[dict[str, Any]], list[str]] | None = None,
) -> gate.Gate:
    """Activate after a last look for late source changes (which make it INCOMPLETE instead)."""
    snapshot = resolve(catalog, digest)
    manifest = load_manifest(cas, snapshot)
    if late_changes is not None:
        late = late_changes(json.loads(cas.get_bytes(manifest["freeze"]["digest"], "freeze spec")))
        if late:
            states.transition(
                catalog,
                snapshot.snapshot_id,
                snapshot.state,
                states.INCOMPLETE,
                actor,
                "; ".join(late),
            )
            raise PublishError(f"{snapshot.snapshot_id} is INCOMPLETE: {late[0]}")
    return gate.activate(
        catalog,
        snapshot.snapshot_id,
        tombstone_watermark=int(manifest["tombstoneWatermark"]),
        benchmark_fence=int(manifest["benchmarkFence"]),
        actor=actor,
    )


def next_to_activate(catalog: Catalog) -> list[states.Snapshot]:
    """Per alias, the newest APPROVED snapshot: what the publication sensor should activate."""
    newest: dict[str, states.Snapshot] = {}
    for snapshot in states.find(catalog, states.APPROVED):
        newest[snapshot.alias] = snapshot
    return sorted(newest.values(), key=lambda s: s.alias)


def rollback(cas: ContentStore, catalog: Catalog, digest: str, actor: str) -> gate.Gate:
    """Point the alias back at an earlier active snapshot, under the manifest's own watermarks."""
    snapshot = resolve(catalog, digest)
    manifest = load_manifest(cas, snapshot)
    return gate.rollback(
        catalog,
        snapshot.snapshot_id,
        tombstone_watermark=int(manifest["tombstoneWatermark"]),
        benchmark_fence=int(manifest["benchmarkFence"]),
        actor=actor,
    )
