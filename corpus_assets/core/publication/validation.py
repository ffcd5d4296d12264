"""What makes a snapshot valid, defined once: ``snapshot_rules``, ``validate_snapshot``.

Every path that lets a snapshot move on - the blocking Dagster check, approval (CLI, job, demo)
and activation - calls ``validate_snapshot``; none of them picks rules. The rules: every digest
re-verified (``verify``), then the rules of ``rules``: fences equal to the freeze's, every pinned
source version readable, every source row accounted for, no open dead letters, member count
equal to the table, record ids unique and each in one known split, no unknown sources, lineage
complete, every canonical row explained, per source every record counted in its layer's table
(``counts_add_up``: records = members + duplicates + repeated ids + tombstoned + split
quarantine), the dedup invariants and no leakage group across two splits, tombstone and
benchmark hits 0, the manifest's transform image this code's, and a canary
replay of a fixed subset of chunks from their pinned versions giving exactly the recorded
output. Separately, the freeze must have been a consistent boundary (no CDC gap, no late CDC
event); when it was not the snapshot becomes INCOMPLETE, since no rebuild of it can fix that.
A snapshot whose first validation fails any other rule becomes REJECTED, its history naming each
failed rule; only a rebuild of its partition starts a new attempt (``states.register``).
``corpus-assets verify`` applies ``verify`` and these boundary rules (``verify_snapshot``), so a
late CDC event fails it as it fails approval and activation.

What a check repeats is bounded without weakening it: the rules that are functions of the
snapshot's content (all but ``SnapshotRules.live``) reuse a passing outcome recorded for the same
content, code and config (``gate_memo``), the rules in ``live`` always run, and the build's check
(``trust_unchanged``) does not re-read a table whose file is unchanged since it last hashed right
(``storage.trust``), nor does activation (``publish``); ``verify`` and approval still hash every
byte.
"""

from dataclasses import dataclass

from corpus_assets.core.governance import states
from corpus_assets.core.ingest.freeze_spec import ChangelogSourceSpec, FreezeSpec
from corpus_assets.core.ingest.pinning import late_changes
from corpus_assets.core.publication import gate_memo, rules
from corpus_assets.core.publication.heldout_check import heldout_near_apart
from corpus_assets.core.publication.rules import Evidence, RuleReport, ValidationRule
from corpus_assets.core.publication.verify import Report, load_manifest, resolve, verify
from corpus_assets.core.records.canary import canary_replay
from corpus_assets.core.runtime import transform
from corpus_assets.core.runtime.snapshot_manifest import ManifestError
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage import failpoints
from corpus_assets.core.storage.cas import CasError, ContentStore
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.memory import release_memory
from corpus_assets.core.storage.trust import StatTrust

Failure = tuple[str, str]  # (the rule's name, one finding)
SHOWN = 20  # failed rules written into a REJECTED event's detail; the check shows them all


@dataclass(frozen=True)
class SnapshotRules:
    """The rule set, in report order. A ``gates`` finding keeps a snapshot from VALIDATED; a
    ``boundary`` finding means the freeze was not consistent and makes it INCOMPLETE. ``live``
    are the gates that read state which moves after a build (the catalog's tombstones, benchmark
    items, dead letters, the CAS's pinned objects, the clock): they run on every check, while
    the others' passing outcome is reused for the same content (``gate_memo``)."""

    gates: tuple[ValidationRule, ...]
    boundary: tuple[ValidationRule, ...]
    live: tuple[ValidationRule, ...]


def snapshot_rules(ws: Workspace) -> SnapshotRules:
    """Every rule, bound to this workspace's code, config and sources: the one place they are
    listed, so no caller can leave the canary, late CDC events or the image out."""
    live = (
        rules.pinned_versions_readable,
        rules.no_open_dead_letters,
        rules.no_tombstone_hits,
        rules.no_benchmark_hits,
        rules.build_latency,
    )
    return SnapshotRules(
        gates=(
            rules.fences_match,
            rules.pinned_versions_readable,
            rules.canonical_rows_accounted,
            rules.no_open_dead_letters,
            rules.member_count_matches,
            rules.record_ids_unique,
            rules.splits_known,
            rules.sources_known,
            rules.lineage_complete,
            rules.rows_explained,
            rules.counts_add_up,
            rules.dedup_invariants_hold,
            heldout_near_apart(ws),
            rules.split_conflicts_resolved,
            rules.packing_invariants_hold,
            rules.no_tombstone_hits,
            rules.no_benchmark_hits,
            rules.transform_image_is(transform.transform_image()),
            rules.canary_replays(canary_replay(ws)),
            rules.build_latency,
        ),
        boundary=(rules.freeze_consistent, rules.no_late_changes(late_changes(ws))),
        live=live,
    )


def validate_snapshot(ws: Workspace, digest: str, trust_unchanged: bool = False) -> Report:
    """Apply every rule of ``snapshot_rules`` to the snapshot ``digest`` (snapshotId or manifest
    digest). A BUILDING snapshot leaves BUILDING here: VALIDATED when all hold, INCOMPLETE when the
    freeze was not consistent, REJECTED (naming each failed rule in its history) otherwise.

    The report's findings are verify's, then the gates', then the boundary's; ``report.gate`` is
    the typed gate report the blocking check shows, ``report.rules_reused`` the rules whose
    recorded passing outcome stood in for running them, ``report.rules_narrowed`` those that
    checked only what changed since a parent whose check passed them (or only the members
    parts no checked snapshot shares, ``report.parts_checked`` counting those read).
    ``trust_unchanged`` (the build's check, activation) lets verify skip tables unchanged on
    disk since they last hashed right.
    """
    trust = StatTrust(ws.cas, ws.catalog) if trust_unchanged else None
    report = verify(ws.cas, ws.catalog, digest, trust=trust)
    snapshot = resolve(ws.catalog, digest)
    rule_set = snapshot_rules(ws)
    failed = [("verify", finding) for finding in report.findings]
    try:
        evidence = Evidence.load(
            ws.cas,
            ws.catalog,
            load_manifest(ws.cas, snapshot),
            verified=report.verified,  # re-hashed once, by verify
        )
    except (CasError, ManifestError) as error:  # already reported by verify, by object name
        failed.append(("evidence", str(error)))
        incomplete: list[str] = []
    else:
        with evidence:
            failed += _apply_gates(ws, rule_set, evidence, report, snapshot.manifest_digest)
            report.rules_narrowed = list(evidence.narrowed)
            report.parts_checked = dict(evidence.parts_checked)
            incomplete = [f for _rule, f in _apply(rule_set.boundary, evidence, report.gate)]
    report.findings.extend(dict.fromkeys(f for _rule, f in failed if f not in report.findings))
    report.findings.extend(incomplete)
    report.gate.incomplete = len(incomplete)
    failpoints.hit("validate/state-read")  # the state was read; another validation may move it
    _move(ws.catalog, snapshot, report, incomplete, failed)
    return report


def verify_snapshot(
    cas: ContentStore, catalog: Catalog, digest: str, ws: Workspace | None
) -> Report:
    """What ``corpus-assets verify`` checks: every digest (``verify``, every byte re-hashed),
    then the boundary rules of ``snapshot_rules`` - a CDC gap, a late CDC event - as the gate
    applies them. It moves no state (approval and activation do). Without a workspace no change
    log can be re-read: each changelog source is a finding saying so, never a silent pass."""
    report = verify(cas, catalog, digest)
    if ws is not None:
        boundary = snapshot_rules(ws).boundary
    else:
        boundary = (rules.freeze_consistent, rules.no_late_changes(_unreadable_change_logs))
    try:
        evidence = Evidence.load(
            cas, catalog, load_manifest(cas, resolve(catalog, digest)), verified=report.verified
        )
    except (CasError, ManifestError):  # already reported by verify, by object name
        return report
    with evidence:
        found = [f for _rule, f in _apply(boundary, evidence, report.gate)]
    report.findings.extend(f for f in dict.fromkeys(found) if f not in report.findings)
    return report


def _unreadable_change_logs(spec: FreezeSpec) -> list[str]:
    """The late-CDC finding when no config names where the change logs are."""
    return [
        f"source {source.id!r}: late CDC events not checked: no config names its change log "
        "(set CORPUS_CONFIG, or put corpus.yaml in the data home)"
        for source in spec.sources
        if isinstance(source, ChangelogSourceSpec)
    ]


def _apply(
    chosen: tuple[ValidationRule, ...], evidence: Evidence, report: RuleReport
) -> list[Failure]:
    """Every rule's findings in order, each with the rule's name; a rule whose evidence is
    unreadable reports that."""
    failed: list[Failure] = []
    for rule in chosen:
        failpoints.hit(f"validate/{rule.__name__}")  # a kill here: the check left mid-way
        try:
            failed += [(rule.__name__, finding) for finding in rule(evidence, report)]
        except CasError as error:
            failed.append((rule.__name__, str(error)))
        evidence.evict()  # a rule's DuckDB buffers and Python tables, before the next one
        release_memory()
    return failed


def _apply_gates(
    ws: Workspace, rule_set: SnapshotRules, evidence: Evidence, report: Report, manifest: str
) -> list[Failure]:
    """The gates' findings in order: ``live`` ones run; each other one reuses its passing outcome
    recorded for this content and rule set (when verify found nothing), else runs, and its
    passing outcome is recorded at once, so a check killed part-way resumes where it was."""
    content = [rule.__name__ for rule in rule_set.gates if rule not in rule_set.live]
    keys = {} if report.findings else gate_memo.rule_keys(ws, evidence, content)
    recalled = gate_memo.recall(ws.catalog, keys)
    failed: list[Failure] = []
    for rule in rule_set.gates:
        name = rule.__name__
        if name in content and name in recalled:
            report.rules_reused.append(name)
            metrics = recalled[name]
        else:
            own = RuleReport()  # the metrics this rule sets, to record with its outcome
            found = _apply((rule,), evidence, own)
            failed += found
            metrics = own.serialized()
            if name in content and not found and not report.findings:
                gate_memo.remember(ws.catalog, keys[name], manifest, metrics)
            if not report.findings:  # the parts this rule found holding (``part_memo``)
                for key, facts in evidence.proven.items():
                    gate_memo.remember(ws.catalog, key, manifest, facts)
            evidence.proven.clear()
        for metric, value in metrics.items():
            setattr(report.gate, metric, value)
    return failed


def _move(
    catalog: Catalog,
    snapshot: states.Snapshot,
    report: Report,
    incomplete: list[str],
    failed: list[Failure],
) -> None:
    """INCOMPLETE for an inconsistent freeze, even once approved (no rebuild fixes a freeze).
    Otherwise only BUILDING moves: VALIDATED when every rule holds, else REJECTED naming the
    failed rules. A snapshot that validated once and fails later (changed code or config, say)
    keeps its state; approval and activation refuse it."""
    sid = snapshot.snapshot_id
    if incomplete and snapshot.state in (states.BUILDING, states.VALIDATED, states.APPROVED):
        detail = "; ".join(incomplete)
        states.transition(catalog, sid, snapshot.state, states.INCOMPLETE, "validator", detail)
    elif snapshot.state != states.BUILDING:
        return
    elif report.ok:
        _settle(catalog, sid, states.VALIDATED, f"{report.objects_checked} objects verified")
    else:
        _settle(catalog, sid, states.REJECTED, _why(failed))


def _settle(catalog: Catalog, sid: str, target: str, detail: str) -> None:
    """BUILDING -> ``target``. A concurrent validation of the same snapshot (two runs of one
    build) that moved it first has decided; only BUILDING moves here, so losing is no error."""
    try:
        states.transition(catalog, sid, states.BUILDING, target, "validator", detail)
    except states.StateError:
        if states.get(catalog, sid).state == states.BUILDING:
            raise


def _why(failed: list[Failure]) -> str:
    """The REJECTED event's detail: each failed rule with its finding, the first ``SHOWN``."""
    shown = "; ".join(f"{rule}: {finding}" for rule, finding in failed[:SHOWN])
    more = f"; and {len(failed) - SHOWN} more" if len(failed) > SHOWN else ""
    return f"failed rules: {shown}{more}"
