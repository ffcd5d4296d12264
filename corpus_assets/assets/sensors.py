"""Sensors: discover source changes (adds a partition + run), and gate publication.

``in_flight_builds`` and ``build_request`` are shared with the ``incremental_build`` schedule:
both decide with ``discovery.build_skip`` over the same queued or running runs, so neither
requests a source state the other already requested.
"""

import warnings

import dagster as dg

from corpus_assets.assets.jobs import activate_snapshot, activation_run_config, build_snapshot
from corpus_assets.assets.partitions import snapshots
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.core.governance.alias_gate import read_alias_gate
from corpus_assets.core.ingest.discovery import (
    FINGERPRINT_TAG,
    DiscoveryCursor,
    PendingBuild,
    build_run_key,
    discovery_skip,
)
from corpus_assets.core.publication.publish import next_to_activate
from corpus_assets.core.runtime.keys import new_partition_key

IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def in_flight_builds(instance: dg.DagsterInstance) -> list[PendingBuild]:
    """Queued or running ``build_snapshot`` runs, each with the source state it was requested
    for (None for a run launched by hand): whoever requested them, the sensor or the schedule."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(job_name=build_snapshot.name, statuses=IN_FLIGHT), limit=1000
    )
    return [
        PendingBuild(run.tags["dagster/partition"], run.tags.get(FINGERPRINT_TAG))
        for run in runs
        if "dagster/partition" in run.tags
    ]


def build_request(key: str, current: str) -> dg.RunRequest:
    """The build of a new partition: its run key names the partition, its tag the source state."""
    return dg.RunRequest(
        partition_key=key, run_key=build_run_key(key), tags={FINGERPRINT_TAG: current}
    )


# Dagster 1.13 warns (BetaWarning: `owners`) from inside its own sensor decorator even when
# `owners` is not passed; silence exactly that category while the sensors are defined.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)

    @dg.sensor(
        job=build_snapshot,
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Adds a snapshot partition and requests a build when the sources' "
        "listing fingerprint differs from the last freeze and no build of that state is queued "
        "or running (also one the incremental_build schedule requested).",
    )
    def source_discovery(
        context: dg.SensorEvaluationContext, corpus: CorpusResource
    ) -> dg.SensorResult:
        if (waiting := corpus.missing_config()) is not None:
            return dg.SensorResult(skip_reason=waiting)
        cursor = DiscoveryCursor.parse(context.cursor)
        in_flight = in_flight_builds(context.instance)
        with corpus.workspace() as ws:
            current, skip = discovery_skip(ws, cursor, in_flight)
        if skip is not None:
            return dg.SensorResult(skip_reason=skip)
        key = new_partition_key(set(context.instance.get_dynamic_partitions(snapshots.name)))
        return dg.SensorResult(
            run_requests=[build_request(key, current)],
            dynamic_partitions_requests=[snapshots.build_add_request([key])],
            cursor=DiscoveryCursor(current, key).dump(),
        )

    @dg.sensor(
        job=activate_snapshot,
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Requests activation of the newest APPROVED snapshot of each alias, only "
        "if it is newer (a later freeze) than the one the alias serves: never a rollback.",
    )
    def publication(context: dg.SensorEvaluationContext, corpus: CorpusResource) -> dg.SensorResult:
        if (waiting := corpus.missing_config()) is not None:
            return dg.SensorResult(skip_reason=waiting)
        with corpus.workspace() as ws:
            ready = [
                (s, read_alias_gate(ws.catalog, s.alias).generation)
                for s in next_to_activate(ws.catalog)
            ]
        if not ready:
            return dg.SensorResult(skip_reason="no APPROVED snapshot waiting")
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=f"activate:{s.snapshot_id}:generation:{generation}",
                    run_config=activation_run_config(s.snapshot_id),
                    tags={"corpus/snapshot": s.snapshot_id, "corpus/alias": s.alias},
                )
                for s, generation in ready
            ]
        )
