"""Bench-only code location: the shipped definitions with Dagster's default multiprocess
executor, to measure what the in-process executor saves on a UI-launched build."""

import dagster as dg

from corpus_assets.assets.layers import LAYER_ASSETS
from corpus_assets.definitions import defs

build_snapshot = dg.define_asset_job(
    "build_snapshot",
    selection=dg.AssetSelection.assets(*LAYER_ASSETS),
    executor_def=dg.multiprocess_executor,
)

defs = dg.Definitions.merge(
    dg.Definitions(jobs=[build_snapshot]),
    dg.Definitions(
        assets=defs.assets,
        asset_checks=defs.asset_checks,
        resources=defs.resources,
        executor=dg.multiprocess_executor,
    ),
)
