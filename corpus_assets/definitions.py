"""Dagster entry point: wiring only."""

import dagster as dg

from corpus_assets.assets.checks import snapshot_validates
from corpus_assets.assets.jobs import activate_snapshot, approve_snapshot, build_snapshot
from corpus_assets.assets.layers import LAYER_ASSETS
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.assets.schedules import incremental_build
from corpus_assets.assets.sensors import publication, source_discovery

defs = dg.Definitions(
    assets=LAYER_ASSETS,
    asset_checks=[snapshot_validates],
    jobs=[build_snapshot, approve_snapshot, activate_snapshot],
    sensors=[source_discovery, publication],
    schedules=[incremental_build],
    resources={"corpus": CorpusResource()},
)
