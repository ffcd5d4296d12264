"""Approval and activation, each bound to a manifest digest.

Both re-apply every validity rule (``validate_snapshot``) first, so nobody approves or activates
bytes that no longer verify, a snapshot whose canary no longer replays, or one whose freeze a
late CDC event has overtaken (which makes it INCOMPLETE instead). Activation then takes the
manifest's own watermarks to the gate's compare-and-swap.

Approval re-hashes every byte the snapshot names, trusting no stat: what a human approves has
been read whole by the approving command. Activation, which follows it (the publication sensor,
seconds later, or a deferred ``activate``), trusts a file unchanged on disk since it last hashed
right (``storage.trust``: any write through the filesystem moves its stat, so it is hashed again),
as the build's check does: a second full re-hash cost as much as the approval (~3 CPU-s for a
600 MB snapshot, ten times that at 1.1 GB of raw text) and guarded only against corruption
beneath the filesystem in between, which ``corpus-assets scrub`` (every snapshot an alias can
serve, APPROVED ones too) and every training read's own hashing find.
"""

from corpus_assets.core.governance import alias_gate, states
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.publication.verify import load_manifest, resolve
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog


class PublishError(RuntimeError):
    """Approval or activation refused: the snapshot does not (or no longer) validate."""


def approve(ws: Workspace, digest: str, by: str) -> states.Snapshot:
    """Record ``by`` as approver once every rule holds now (a BUILDING snapshot validates first).

    A REJECTED snapshot is not re-judged here: a rebuild of its partition is the new attempt.
    One older than what its alias serves is refused too: it could never be activated."""
    candidate = resolve(ws.catalog, digest)
    states.refuse_expired(candidate, "approve")
    active = alias_gate.read_alias_gate(ws.catalog, candidate.alias).active_snapshot
    alias_gate.refuse_backwards(ws.catalog, candidate, active, action="approve")
    if candidate.state == states.REJECTED:
        raise PublishError(
            f"refusing to approve {candidate.snapshot_id}: it is REJECTED (its failed rules are "
            "in its history); after a fix, `corpus-assets build --partition "
            f"{candidate.partition_key}` makes a new attempt"
        )
    report = validate_snapshot(ws, digest)
    if not report.ok:
        raise PublishError(f"refusing to approve {report.snapshot_id}: {report.findings[0]}")
    return states.approve(ws.catalog, report.snapshot_id, by)


NEWEST_VALIDATED = "newest-validated"


def approval_target(catalog: Catalog, alias: str, partition: str, expected: str = "") -> str:
    """The snapshotId an approval of ``partition`` means, so nobody pastes a digest in the UI.

    ``NEWEST_VALIDATED`` is the newest VALIDATED snapshot of ``alias``; a partition key is the
    newest snapshot built for it. ``expected`` (a snapshotId or manifest digest the approver
    reviewed) must be that snapshot: approval stays bound to the bytes someone looked at."""
    if partition == NEWEST_VALIDATED:
        order = states.positions(catalog, alias)
        validated = [s for s in states.find(catalog, states.VALIDATED) if s.alias == alias]
        if not validated:
            raise PublishError(
                f"no VALIDATED snapshot of alias {alias} to approve: "
                "build one, or name its partition"
            )
        chosen = max(validated, key=lambda s: order[s.snapshot_id])
    else:
        built = states.for_partition(catalog, partition)
        if not built:
            raise PublishError(
                f"partition {partition} has no snapshot in the catalog: build it first"
            )
        chosen = max(built, key=lambda s: s.created_at)
    if expected and expected not in (chosen.snapshot_id, chosen.manifest_digest):
        raise PublishError(
            f"refusing to approve: {partition} resolves to {chosen.snapshot_id}, "
            f"not the reviewed {expected}"
        )
    return chosen.snapshot_id


def activate(ws: Workspace, digest: str, actor: str) -> alias_gate.AliasGate:
    """Compare-and-swap the alias to this APPROVED snapshot once every rule holds now.

    A snapshot older than the alias's active one is refused before the (costly) validation;
    ``alias_gate.activate`` checks it again against the gate row it swaps."""
    candidate = resolve(ws.catalog, digest)
    states.refuse_expired(candidate, "activate")
    alias_gate.refuse_backwards(
        ws.catalog,
        candidate,
        alias_gate.read_alias_gate(ws.catalog, candidate.alias).active_snapshot,
    )
    report = validate_snapshot(ws, digest, trust_unchanged=True)  # approval hashed every byte
    snapshot = states.get(ws.catalog, report.snapshot_id)
    if not report.ok:
        raise PublishError(
            f"{snapshot.snapshot_id} is {snapshot.state}; refusing to activate it: "
            f"{report.findings[0]}"
        )
    manifest = load_manifest(ws.cas, snapshot)
    return alias_gate.activate(
        ws.catalog,
        snapshot.snapshot_id,
        tombstone_watermark=manifest.tombstone_seq,
        benchmark_fence=manifest.benchmark_seq,
        actor=actor,
    )


def next_to_activate(catalog: Catalog) -> list[states.Snapshot]:
    """What the publication sensor should activate: per alias at most one snapshot, the newest
    APPROVED (``states.Position``), and only if it is newer than what the alias serves now."""
    approved = states.find(catalog, states.APPROVED)
    chosen = []
    for alias in sorted({s.alias for s in approved}):
        order = states.positions(catalog, alias)
        newest = max((s for s in approved if s.alias == alias), key=lambda s: order[s.snapshot_id])
        active = alias_gate.read_alias_gate(catalog, alias).active_snapshot
        if active not in order or order[active] < order[newest.snapshot_id]:
            chosen.append(newest)
    return chosen


def rollback(cas: ContentStore, catalog: Catalog, digest: str, actor: str) -> alias_gate.AliasGate:
    """Point the alias back at an earlier active snapshot, under the manifest's own watermarks."""
    snapshot = resolve(catalog, digest)
    states.refuse_expired(snapshot, "roll back to")
    manifest = load_manifest(cas, snapshot)
    return alias_gate.rollback(
        catalog,
        snapshot.snapshot_id,
        tombstone_watermark=manifest.tombstone_seq,
        benchmark_fence=manifest.benchmark_seq,
        actor=actor,
    )
