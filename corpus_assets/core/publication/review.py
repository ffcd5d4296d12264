"""What an approver reviews before approving a partition's snapshot, and the proof they did.

Dagster's Launchpad shows run config, nothing else, so the review travels as config: picking a
partition fills in the candidate's snapshotId, its shadow diff as plain lines and the diff's
digest (``partition_review``). The approval re-computes the diff and refuses unless its digest
is still the reviewed one (``refuse_changed_review``): a new build of the partition, or a move
of the alias (the diff is against what it serves), since the Launchpad loaded is caught.
"""

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corpus_assets.core.governance import alias_gate, states
from corpus_assets.core.publication.publish import PublishError, approval_target
from corpus_assets.core.publication.shadow import shadow_diff
from corpus_assets.core.runtime.keys import launch_refusal
from corpus_assets.core.storage.cas import CasError, ContentStore
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.trust import StatTrust

NOT_REVIEWED = "none"  # the digest of a review that found nothing to approve: never matches
REVIEWABLE = (states.BUILDING, states.VALIDATED)  # what approval may still move to APPROVED

Differ = Callable[[str], dict[str, Any]]  # snapshotId -> its shadow diff now


@dataclass(frozen=True)
class Review:
    """A partition's candidate as the Launchpad shows it; ``digest`` binds the approval."""

    partition: str
    snapshot_id: str  # "" when the partition has no snapshot
    lines: list[str]
    digest: str  # NOT_REVIEWED when there is nothing to approve


def diff_digest(diff: dict[str, Any]) -> str:
    """``sha256:`` of the diff's canonical JSON: equal digests, equal diffs."""
    text = json.dumps(diff, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def review_lines(
    diff: dict[str, Any], gate_row: alias_gate.AliasGate, partitions: dict[str, str]
) -> list[str]:
    """The shadow diff as short plain lines (the Launchpad's editor shows YAML, no Markdown)."""
    against = diff.get("active")
    lines = [
        (
            f"against: {against} (partition {partitions.get(against, '?')}), what alias "
            f"{gate_row.alias} serves at generation {gate_row.generation}"
            if against
            else f"against: nothing; this would be the first snapshot alias {gate_row.alias} serves"
        ),
        f"+{diff['added']:,} added, -{diff['removed']:,} removed, "
        f"{diff['split_migrations']:,} split migrations",
    ]
    new, old = diff["candidate_profile"], diff.get("active_profile") or {}
    lines.append("shares, served now -> candidate:")
    for kind in ("source_share", "split_share"):
        for name, share in new[kind].items():
            was = old.get(kind, {}).get(name, "-")
            lines.append(f"{kind.removesuffix('_share')} {name}: {was} -> {share}")
    for what, ids in sorted((diff.get("examples") or {}).items()):
        if ids:
            lines.append(f"{what}, e.g.: " + ", ".join(ids))
    return lines


def _not_reviewed(partition: str, snapshot_id: str, why: str) -> Review:
    return Review(partition, snapshot_id, [why], NOT_REVIEWED)


def partition_review(catalog: Catalog, alias: str, partition: str, differ: Differ) -> Review:
    """The review of ``partition``'s newest snapshot; for anything that is no candidate (an
    invalid key, nothing built, approved already, ...), one line saying why and no digest."""
    refusal = launch_refusal(partition)
    if refusal is not None:
        return _not_reviewed(partition, "", refusal)
    try:
        snapshot = states.get(catalog, approval_target(catalog, alias, partition))
    except PublishError as error:
        return _not_reviewed(partition, "", f"nothing to approve: {error}")
    if snapshot.state not in REVIEWABLE:
        return _not_reviewed(
            partition,
            snapshot.snapshot_id,
            f"nothing to approve: partition {partition}'s newest snapshot "
            f"{snapshot.snapshot_id} is {snapshot.state}",
        )
    try:
        diff = differ(snapshot.snapshot_id)
    except CasError as error:
        return _not_reviewed(partition, snapshot.snapshot_id, f"not reviewable: {error}")
    partitions = {s.snapshot_id: s.partition_key for s in states.find(catalog)}
    head = f"candidate: {snapshot.snapshot_id} (partition {partition}, {snapshot.state})"
    lines = review_lines(diff, alias_gate.read_alias_gate(catalog, snapshot.alias), partitions)
    return Review(partition, snapshot.snapshot_id, [head, *lines], diff_digest(diff))


def preview_differ(cas: ContentStore, catalog: Catalog) -> Differ:
    """Diffs for the Launchpad: members tables unchanged since they last hashed are trusted."""
    trust = StatTrust(cas, catalog)
    return lambda snapshot_id: shadow_diff(cas, catalog, snapshot_id, trust)


def refuse_changed_review(
    cas: ContentStore, catalog: Catalog, snapshot_id: str, reviewed: str
) -> None:
    """PublishError (one line) unless the snapshot's shadow diff, re-hashed and re-computed now,
    has the ``reviewed`` digest."""
    if reviewed == NOT_REVIEWED:
        raise PublishError(
            f"refusing to approve {snapshot_id}: when the Launchpad loaded, its partition had "
            "nothing to approve (see `review`); pick the partition again to review it"
        )
    now = diff_digest(shadow_diff(cas, catalog, snapshot_id))
    if now != reviewed:
        raise PublishError(
            f"refusing to approve {snapshot_id}: its shadow diff changed since it was reviewed "
            f"(review_digest {reviewed}, now {now}); pick the partition again to review it"
        )
