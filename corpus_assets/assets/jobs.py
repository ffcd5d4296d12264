"""Jobs: build every layer of one snapshot partition; activate one approved snapshot."""

from typing import Any

import dagster as dg

from corpus_assets.assets.layers import LAYER_ASSETS
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.core.release.publish import activate, approve
from corpus_assets.core.release.shadow import shadow_diff

build_snapshot = dg.define_asset_job(
    "build_snapshot",
    selection=dg.AssetSelection.assets(*LAYER_ASSETS),
    description="Freeze (or reuse the freeze of) a partition and materialize all seven layers.",
)


class ActivationConfig(dg.Config):
    """The snapshot to activate, by snapshotId or manifest digest."""

    snapshot_id: str


@dg.op(
    description="Re-apply every validity rule, then compare-and-swap the alias gate row to this "
    "APPROVED snapshot."
)
def activate_alias(
    context: dg.OpExecutionContext, config: ActivationConfig, corpus: CorpusResource
) -> None:
    with corpus.workspace() as ws:
        row = activate(ws, config.snapshot_id, actor=f"run:{context.run_id}")
    context.log.info(f"alias {row.alias} -> {row.active_snapshot} generation {row.generation}")
    context.log_event(
        dg.AssetObservation(
            asset_key="manifest",
            metadata={
                "alias": row.alias,
                "generation": row.generation,
                "active_snapshot": row.active_snapshot or "",
            },
        )
    )


@dg.job(
    description="Activate an APPROVED snapshot on its alias (requested by the publication sensor)."
)
def activate_snapshot() -> None:
    activate_alias()


class ApprovalConfig(dg.Config):
    """The snapshot to approve, by digest, and who approves it."""

    snapshot_id: str
    approved_by: str


@dg.op(description="Approve a snapshot bound to its digest, once every validity rule holds.")
def approve_digest(
    context: dg.OpExecutionContext, config: ApprovalConfig, corpus: CorpusResource
) -> None:
    with corpus.workspace() as ws:
        diff = shadow_diff(ws.cas, ws.catalog, config.snapshot_id)
        snapshot = approve(ws, config.snapshot_id, by=config.approved_by)
    context.log.info(f"{snapshot.snapshot_id} APPROVED by {snapshot.approved_by}")
    context.log_event(
        dg.AssetObservation(
            asset_key="manifest",
            partition=snapshot.partition_key,
            metadata={
                "approved": snapshot.snapshot_id,
                "approved_by": snapshot.approved_by or "",
                "shadow_diff": dg.MetadataValue.json(diff),
            },
        )
    )


@dg.job(description="Approve a snapshot digest (launch from the UI with the digest as config).")
def approve_snapshot() -> None:
    approve_digest()


def approval_run_config(snapshot_id: str, approved_by: str) -> dict[str, Any]:
    """Run config for ``approve_snapshot`` (the UI's launchpad takes the same)."""
    return {
        "ops": {
            "approve_digest": {"config": {"snapshot_id": snapshot_id, "approved_by": approved_by}}
        }
    }


def activation_run_config(snapshot_id: str) -> dict[str, Any]:
    """Run config for ``activate_snapshot``, as the publication sensor requests it."""
    return {"ops": {"activate_alias": {"config": {"snapshot_id": snapshot_id}}}}
