"""Dagster entry point: wiring only."""

import warnings

import dagster as dg

from corpus_assets.assets.checks import LAYER_CHECKS, check_snapshot, snapshot_validates
from corpus_assets.assets.deletion_audit import tombstone_audit, tombstone_hits_job
from corpus_assets.assets.executor import pooled_in_process_executor
from corpus_assets.assets.governance_jobs import GOVERNANCE_JOBS
from corpus_assets.assets.jobs import activate_snapshot, approve_snapshot, build_snapshot
from corpus_assets.assets.layer_assets import LAYER_ASSETS
from corpus_assets.assets.lifecycle import alias_asset
from corpus_assets.assets.lineage_jobs import record_lineage
from corpus_assets.assets.partition_guard import partition_key_guard
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.assets.schedules import incremental_build
from corpus_assets.assets.scrub_job import scrub_job, scrub_schedule
from corpus_assets.assets.sensors import publication, source_discovery

# Dagster re-creates every sensor with its own internal `owners=` argument when it resolves the
# sensors' jobs, and warns about that beta parameter in each process that loads this module; we
# pass no owners to sensors, so this exact warning says nothing to a user.
warnings.filterwarnings(
    "ignore",
    message="Parameter `owners` of initializer `SensorDefinition.__init__`",
    category=dg.BetaWarning,
)

defs = dg.Definitions(
    assets=[*LAYER_ASSETS, alias_asset],
    asset_checks=[*LAYER_CHECKS, snapshot_validates],
    jobs=[
        build_snapshot,
        check_snapshot,
        approve_snapshot,
        activate_snapshot,
        tombstone_hits_job,
        record_lineage,
        scrub_job,
        *GOVERNANCE_JOBS,
    ],
    sensors=[source_discovery, publication, tombstone_audit, partition_key_guard],
    schedules=[incremental_build, scrub_schedule],
    resources={"corpus": CorpusResource()},
    # runs launched from the UI's Materialize button use this; jobs name it too (jobs.py)
    executor=pooled_in_process_executor,
)
