"""What makes a snapshot valid (seed 001), defined once: ``snapshot_rules``, ``validate_snapshot``.

Every path that lets a snapshot move on - the blocking Dagster check, approval (CLI, job, demo)
and activation - calls ``validate_snapshot``; none of them picks rules. The rules: every digest
re-verified (``verify``), then the gates of ``gates``: fences equal to the freeze's, every pinned
source version readable, every source row accounted for, no open dead letters, member count
equal to the table, record ids unique and each in one known split, no unknown sources, lineage
complete, every canonical row explained, the dedup invariants and no leakage group across two
splits, tombstone and benchmark hits 0, the manifest's transform image this code's, and a canary
replay of a fixed subset of chunks from their pinned versions giving exactly the recorded
output. Separately, the freeze must have been a consistent boundary (no CDC gap, no late CDC
event); when it was not the snapshot becomes INCOMPLETE, since no rebuild of it can fix that.
"""

from dataclasses import dataclass

from corpus_assets.core.governance import states
from corpus_assets.core.ingest.pinning import late_changes
from corpus_assets.core.records.layer import canary_replay
from corpus_assets.core.release import gates
from corpus_assets.core.release.gates import Evidence, Gate, GateReport
from corpus_assets.core.release.verify import Report, load_manifest, resolve, verify
from corpus_assets.core.runtime import transform
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.cas import CasError
from corpus_assets.core.storage.catalog import Catalog


@dataclass(frozen=True)
class SnapshotRules:
    """The rule set, in report order. A ``gates`` finding keeps a snapshot from VALIDATED; a
    ``boundary`` finding means the freeze was not consistent and makes it INCOMPLETE."""

    gates: tuple[Gate, ...]
    boundary: tuple[Gate, ...]


def snapshot_rules(ws: Workspace) -> SnapshotRules:
    """Every rule, bound to this workspace's code, config and sources: the one place they are
    listed, so no caller can leave the canary, late CDC events or the image out."""
    return SnapshotRules(
        gates=(
            gates.fences_match,
            gates.pinned_versions_readable,
            gates.canonical_rows_accounted,
            gates.no_open_dead_letters,
            gates.member_count_matches,
            gates.record_ids_unique,
            gates.splits_known,
            gates.sources_known,
            gates.lineage_complete,
            gates.rows_explained,
            gates.dedup_invariants_hold,
            gates.no_tombstone_hits,
            gates.no_benchmark_hits,
            gates.transform_image_is(transform.transform_image()),
            gates.canary_replays(canary_replay(ws)),
            gates.build_latency,
        ),
        boundary=(gates.freeze_consistent, gates.no_late_changes(late_changes(ws))),
    )


def validate_snapshot(ws: Workspace, digest: str) -> Report:
    """Apply every rule of ``snapshot_rules`` to the snapshot ``digest`` (snapshotId or manifest
    digest); BUILDING -> VALIDATED when all hold, -> INCOMPLETE when the freeze was not consistent.

    The report's findings are verify's, then the gates', then the boundary's; ``report.gate`` is
    the typed gate report the blocking check shows.
    """
    report = verify(ws.cas, ws.catalog, digest)
    snapshot = resolve(ws.catalog, digest)
    rules = snapshot_rules(ws)
    try:
        evidence = Evidence.load(ws.cas, ws.catalog, load_manifest(ws.cas, snapshot))
    except CasError as error:  # already reported by verify, by object name
        findings, incomplete = [str(error)], []
    else:
        findings = _apply(rules.gates, evidence, report.gate)
        incomplete = _apply(rules.boundary, evidence, report.gate)
    report.findings.extend(dict.fromkeys(f for f in findings if f not in report.findings))
    report.findings.extend(incomplete)
    report.gate.incomplete = len(incomplete)
    _move(ws.catalog, snapshot, report, incomplete)
    return report


def _apply(rules: tuple[Gate, ...], evidence: Evidence, report: GateReport) -> list[str]:
    """Every rule's findings in order; a rule whose evidence is unreadable reports that."""
    findings: list[str] = []
    for rule in rules:
        try:
            findings += rule(evidence, report)
        except CasError as error:
            findings.append(str(error))
    return findings


def _move(
    catalog: Catalog, snapshot: states.Snapshot, report: Report, incomplete: list[str]
) -> None:
    """INCOMPLETE for an inconsistent freeze (even once approved); VALIDATED from BUILDING."""
    sid = snapshot.snapshot_id
    if incomplete and snapshot.state in (states.BUILDING, states.VALIDATED, states.APPROVED):
        detail = "; ".join(incomplete)
        states.transition(catalog, sid, snapshot.state, states.INCOMPLETE, "validator", detail)
    elif report.ok and snapshot.state == states.BUILDING:
        detail = f"{report.objects_checked} objects verified"
        states.transition(catalog, sid, states.BUILDING, states.VALIDATED, "validator", detail)
