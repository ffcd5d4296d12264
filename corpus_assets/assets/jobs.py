"""Jobs: build every layer of one snapshot partition; activate one approved snapshot."""

from collections.abc import Mapping
from typing import Any

import dagster as dg
from pydantic import Field, field_validator

from corpus_assets.assets.executor import pooled_in_process_executor
from corpus_assets.assets.layer_assets import LAYER_ASSETS
from corpus_assets.assets.lifecycle import observing
from corpus_assets.assets.partitions import snapshots
from corpus_assets.assets.refusals import refused_in_one_line
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.core.governance.audit_fields import audit_field
from corpus_assets.core.publication.publish import (
    NEWEST_VALIDATED,
    activate,
    approval_target,
    approve,
)
from corpus_assets.core.publication.review import (
    partition_review,
    preview_differ,
    refuse_changed_review,
)
from corpus_assets.core.publication.verify import resolve
from corpus_assets.core.runtime.workspace import open_workspace

BUILD_TAG = "corpus/build"

build_snapshot = dg.define_asset_job(
    "build_snapshot",
    selection=dg.AssetSelection.assets(*LAYER_ASSETS),
    description="Freeze (or reuse the freeze of) a partition and materialize all seven layers. "
    "Launched without a partition (confirm the UI's question), it adds a new partition and "
    "builds a new snapshot of the current sources.",
    # one process for the whole run: the multiprocess default re-imports the code in every step
    # (seconds each), which made a UI- or sensor-launched demo build take minutes; its steps
    # share one process pool (assets.executor)
    executor_def=pooled_in_process_executor,
    # every build run carries it, however launched: dagster.yaml's run queue starts one at a time
    tags={BUILD_TAG: "snapshot"},
)


class ActivationConfig(dg.Config):
    """The snapshot to activate, by snapshotId or manifest digest."""

    snapshot_id: str


@dg.op(
    description="Re-apply every validity rule, then compare-and-swap the alias gate row to this "
    "APPROVED snapshot; observes the alias and every snapshot whose standing changed."
)
def activate_alias(
    context: dg.OpExecutionContext, config: ActivationConfig, corpus: CorpusResource
) -> None:
    with corpus.workspace() as ws:
        target = resolve(ws.catalog, config.snapshot_id)
        # a refusal is in the alias's history too: the target's partition shows it
        with observing(ws, target.alias, context.log_event, [target.snapshot_id]):
            row = activate(ws, config.snapshot_id, actor=f"run:{context.run_id}")
    context.log.info(f"alias {row.alias} -> {row.active_snapshot} generation {row.generation}")


@dg.job(
    description="Activate an APPROVED snapshot on its alias (requested by the publication sensor)."
)
def activate_snapshot() -> None:
    activate_alias()


class ApprovalConfig(dg.Config):
    """What to approve, chosen by partition, never by pasting a digest; and who says so.
    Picking a partition in the Launchpad fills in its candidate, its shadow diff (``review``)
    and the diff's digest: read it before launching. Without a partition, ``newest-validated``
    is approved unreviewed here (the `alias` asset shows what it resolves to, with its diff)."""

    partition: str = Field(
        default=NEWEST_VALIDATED,
        description="The snapshot partition to approve (its newest snapshot), or "
        f"'{NEWEST_VALIDATED}' for the newest VALIDATED snapshot of the configured alias.",
    )
    snapshot_id: str = Field(
        default="",
        description="Optional: the snapshotId or manifest digest you reviewed (the `alias` "
        "asset's `newest_validated`, or `snapshotId` on the candidate's `manifest` partition, "
        "beside its `review`). If given, approval is refused unless the partition resolves to "
        "exactly that snapshot.",
    )
    approver: str = Field(
        default="",
        description="Your name. Recorded as a claim beside the identity Dagster gives the run "
        "(its run id, and the launching user where Dagster records one), never alone.",
    )
    review: list[str] = Field(
        default=[],
        description="Filled in when you pick a partition: the candidate's shadow diff against "
        "what its alias serves (members added, removed, split migrations, share shifts, example "
        "ids), or why there is nothing to approve. For reading; editing it changes nothing.",
    )
    review_digest: str = Field(
        default="",
        description="Filled in with `review`: the digest of that shadow diff. If given, approval "
        "is refused unless the diff computed at approval is still the one you read (a rebuild "
        "or an alias move since changes it). 'none': the partition had nothing to approve.",
    )

    @field_validator("approver")
    @classmethod
    def _one_line(cls, value: str) -> str:
        """An audit field: a line break or control character in it fails the run when it starts
        (Dagster builds the config here, after the launch), before anything is written."""
        return audit_field("approver", value)


def approver_identity(run_id: str, tags: Mapping[str, str], claimed: str) -> str:
    """``approved_by`` for a run: OSS Dagster records no user, Dagster+ tags ``dagster/user``.
    Both the tag and the claim are audit fields, checked as they enter."""
    user = audit_field("dagster/user", tags.get("dagster/user") or "")
    audit_field("approver", claimed)
    parts = [f"user:{user}"] if user else []
    parts.append(f"dagster-run:{run_id}")
    if claimed.strip():
        parts.append(f"claimed:{claimed.strip()}")
    return " ".join(parts)


@dg.op(description="Approve a snapshot bound to its digest, once every validity rule holds.")
def approve_digest(
    context: dg.OpExecutionContext, config: ApprovalConfig, corpus: CorpusResource
) -> None:
    with refused_in_one_line(), corpus.workspace() as ws:
        by = approver_identity(context.run_id, context.run.tags, config.approver)
        target = approval_target(
            ws.catalog, ws.config.alias, config.partition.strip(), config.snapshot_id.strip()
        )
        if config.review_digest.strip():
            refuse_changed_review(ws.cas, ws.catalog, target, config.review_digest.strip())
        alias = resolve(ws.catalog, target).alias
        with observing(ws, alias, context.log_event, [target]):
            snapshot = approve(ws, target, by=by)
    context.log.info(f"{snapshot.snapshot_id} APPROVED by {snapshot.approved_by}")


def approval_for_partition(partition_key: str) -> dict[str, Any]:
    """What picking ``partition_key`` in the Launchpad fills in: its candidate and the review
    (Dagster calls this in the code server, with no resources: the default corpus config, as
    ``CorpusResource()``). Cheap (stat-trusted tables), and a partition with nothing to approve
    gets a review saying why, never an error."""
    with open_workspace() as ws:
        review = partition_review(
            ws.catalog, ws.config.alias, partition_key, preview_differ(ws.cas, ws.catalog)
        )
    return approval_run_config(
        partition_key, review.snapshot_id, review=review.lines, review_digest=review.digest
    )


@dg.job(
    description="Approve a snapshot from the UI. Pick the candidate's partition in the "
    "Launchpad: the config then shows its shadow diff against what the alias serves (`review`: "
    "members added, removed, split migrations, share shifts, example ids) and binds the "
    "approval to that snapshot and that diff; read it, add your name as `approver`, launch. "
    "Without a partition, the default config (`partition: newest-validated`) approves the "
    "newest VALIDATED snapshot; Catalog -> `alias` shows which, with its diff.",
    # the partition picker, and the review filled in for the picked partition
    config=dg.PartitionedConfig(
        partitions_def=snapshots, run_config_for_partition_key_fn=approval_for_partition
    ),
)
def approve_snapshot() -> None:
    approve_digest()


def approval_run_config(
    partition: str = NEWEST_VALIDATED,
    snapshot_id: str = "",
    approver: str = "",
    review: list[str] | None = None,
    review_digest: str = "",
) -> dict[str, Any]:
    """Run config for ``approve_snapshot`` (the UI's launchpad takes the same)."""
    config: dict[str, Any] = {
        "partition": partition,
        "snapshot_id": snapshot_id,
        "approver": approver,
    }
    if review is not None or review_digest:
        config.update(review=review or [], review_digest=review_digest)
    return {"ops": {"approve_digest": {"config": config}}}


def activation_run_config(snapshot_id: str) -> dict[str, Any]:
    """Run config for ``activate_snapshot``, as the publication sensor requests it."""
    return {"ops": {"activate_alias": {"config": {"snapshot_id": snapshot_id}}}}
