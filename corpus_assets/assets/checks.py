"""Asset checks: each layer's own invariants, and the blocking gate on the manifest.

Every check is a one-spec ``multi_asset_check`` with ``can_subset``: launched without a partition
(the UI's "Execute all" on a Checks tab does that), it yields nothing and Dagster records the
check as skipped, with the reason in the run log, instead of failing it red.

``check_snapshot`` runs every check, and nothing else, for one partition: Dagster 1.13's Checks
tab refuses to execute partitioned checks on their own, so the job is how a user re-checks one
snapshot from the UI (Jobs -> check_snapshot -> Launchpad, pick the partition) without
rebuilding a layer.
"""

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import dagster as dg

from corpus_assets.assets.executor import pooled_in_process_executor
from corpus_assets.assets.lifecycle import observing
from corpus_assets.assets.partitions import snapshots
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.core.governance import states
from corpus_assets.core.publication.layer_checks import ERROR, RULES, check_layer
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.publication.verify import resolve
from corpus_assets.core.runtime.keys import validate_partition_key

CHECK_JOB = "check_snapshot"
NO_PARTITION = (
    "skipped: {check} was launched without a snapshot partition; to check one, launch "
    "check_snapshot from its Launchpad with the partition picked"
)

CHECK_DESCRIPTIONS = {
    "raw_snapshot": "At least one object pinned; a freeze that was no consistent boundary warns.",
    "canonical_records": "Accounting: rows in = records + quarantined (by reason) + rejected.",
    "dedup_clusters": "Dedup invariant: one verdict per canonical record; clusters = kept.",
    "splits": "Split leakage: every kept record in one split, no unresolved conflict.",
    "mixed_samples": "Samples and tokens add up per source, drawn from a non-empty train split.",
    "packed_blocks": "Packing: blocks exactly full of content + padding; no sample lost.",
}
assert set(CHECK_DESCRIPTIONS) == set(RULES)


def _partition(context: dg.AssetCheckExecutionContext, check: str) -> str | None:
    """The run's partition key, validated; None (logged) when the run has none."""
    run_context = context.op_execution_context
    if not run_context.has_partition_key:
        context.log.warning(NO_PARTITION.format(check=check))
        return None
    return validate_partition_key(run_context.partition_key)


def _partitioned_check(
    asset: str, name: str, description: str, body: Callable[..., Iterator[dg.AssetCheckResult]]
) -> dg.AssetChecksDefinition:
    # A partitioned check is a Dagster preview feature; it is what lets the UI show the verdict
    # per snapshot partition, so we opt in knowingly and keep the warning out of every import.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        spec = dg.AssetCheckSpec(
            name, asset=asset, blocking=True, description=description, partitions_def=snapshots
        )
        return dg.multi_asset_check(specs=[spec], name=name, can_subset=True)(body)


def layer_check(layer: str) -> dg.AssetChecksDefinition:
    name = f"{layer}_invariants"

    def _check(
        context: dg.AssetCheckExecutionContext, corpus: CorpusResource
    ) -> Iterator[dg.AssetCheckResult]:
        key = _partition(context, name)
        if key is None:
            return
        with corpus.workspace() as ws:
            findings = check_layer(ws, key, layer)
        if findings is None:
            context.log.warning(f"skipped: {layer} is not built for partition {key}")
            return
        errors = [f for f in findings if f.severity == ERROR]
        yield dg.AssetCheckResult(
            asset_key=layer,
            check_name=name,
            passed=not findings,
            severity=dg.AssetCheckSeverity.ERROR if errors else dg.AssetCheckSeverity.WARN,
            description="; ".join(f.text for f in findings) or "all invariants hold",
            metadata={"findings": len(findings), "errors": len(errors)},
        )

    return _partitioned_check(layer, name, CHECK_DESCRIPTIONS[layer], _check)


def _gate_metadata(report: Any, state: str) -> dict[str, Any]:
    gate_report = report.gate.serialized()
    return {
        "snapshotId": report.snapshot_id,
        "state": state,
        "objects_checked": report.objects_checked,
        "bytes_checked": report.bytes_checked,
        "objects_trusted": report.objects_trusted,
        "rules_reused": len(report.rules_reused),
        "findings": len(report.findings),
        "gate_report": dg.MetadataValue.json(gate_report),
        **{f"gate.{k}": v for k, v in gate_report.items() if isinstance(v, int | str)},
    }


def _snapshot_validates(
    context: dg.AssetCheckExecutionContext, corpus: CorpusResource
) -> Iterator[dg.AssetCheckResult]:
    """The verdict per partition, with the gate report as metadata for the UI."""
    key = _partition(context, "snapshot_validates")
    if key is None:
        return
    with corpus.workspace() as ws:
        manifest_digest = ws.catalog.layer_output(key, "manifest")
        if manifest_digest is None:  # never in a build (the check follows the manifest's step)
            context.log.warning(f"skipped: manifest is not built for partition {key}")
            return
        run = context.op_execution_context
        snapshot = resolve(ws.catalog, manifest_digest)
        # the build's own check trusts tables unchanged since they last hashed right
        # (storage.trust); a re-check asked for by hand, approval and activation re-hash every byte
        rechecked = run.job_name == CHECK_JOB
        # the verdict moves the snapshot: its partition and its alias are observed (with the
        # shadow diff a reviewer reads before approving), in this code path
        with observing(ws, snapshot.alias, run.log_event, [snapshot.snapshot_id]):
            report = validate_snapshot(ws, manifest_digest, trust_unchanged=not rechecked)
        state = states.get(ws.catalog, report.snapshot_id).state
    yield dg.AssetCheckResult(
        asset_key="manifest",
        check_name="snapshot_validates",
        passed=report.ok,
        description="; ".join(report.findings[:5]) if report.findings else "all digests verified",
        metadata=_gate_metadata(report, state),
    )


snapshot_validates = _partitioned_check(
    "manifest",
    "snapshot_validates",
    "Recompute every digest and apply the gate rules; "
    "the snapshot moves BUILDING -> VALIDATED, or REJECTED naming the failed rules.",
    _snapshot_validates,
)

LAYER_CHECKS = [layer_check(layer) for layer in RULES]


def _no_config(_partition_key: str) -> dict[str, Any]:
    return {}


check_snapshot = dg.define_asset_job(
    CHECK_JOB,
    selection=dg.AssetSelection.checks(*LAYER_CHECKS, snapshot_validates),
    description="Run every check of one snapshot partition again, materializing nothing: pick "
    "the partition in the Launchpad. snapshot_validates re-hashes every byte here. Without a "
    "partition, each check is skipped.",
    # a job selecting only checks infers no partitions (Dagster 1.13 reads them off the selected
    # assets, and `partitions_def=` is deprecated and ignored here); a PartitionedConfig gives
    # the Launchpad its partition picker and the run its `dagster/partition` tag
    config=dg.PartitionedConfig(
        partitions_def=snapshots, run_config_for_partition_key_fn=_no_config
    ),
    executor_def=pooled_in_process_executor,
)
