"""Bench-only code location: the shipped definitions with Dagster's default multiprocess
executor, to measure what the in-process executor saves on a UI- or sensor-launched build."""

import dagster as dg

from corpus_assets import definitions
from corpus_assets.assets.layer_assets import LAYER_ASSETS
from corpus_assets.assets.sensors import publication, source_discovery

build_snapshot = dg.define_asset_job(
    "build_snapshot",
    selection=dg.AssetSelection.assets(*LAYER_ASSETS),
    executor_def=dg.multiprocess_executor,
)

defs = dg.Definitions(
    assets=definitions.defs.assets,
    asset_checks=definitions.defs.asset_checks,
    jobs=[build_snapshot],
    sensors=[source_discovery.with_updated_job(build_snapshot), publication],
    resources=definitions.defs.resources,
    executor=dg.multiprocess_executor,
)
