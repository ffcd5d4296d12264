"""The ``partition_key_guard`` sensor: removes snapshot partitions whose key breaks the rule.

The UI's "Add partition" (and GraphQL ``addDynamicPartition``) creates a key without calling any
project code, so this is the earliest place a mistyped key can be refused: within one sensor
interval of its creation it is deleted again, and the tick's skip reason (the Automation page)
names each key removed and the rule it breaks. A key with a run queued or running waits for that
run (which refuses it itself); one the catalog has frozen is never removed, only reported.
"""

import warnings

import dagster as dg

from corpus_assets.assets.partitions import snapshots
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.core.runtime.keys import invalid_keys

IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def _run_in_flight(instance: dg.DagsterInstance, key: str) -> str | None:
    """The id of a queued or running run of partition ``key``, of any job."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(tags={"dagster/partition": key}, statuses=IN_FLIGHT), limit=1
    )
    return runs[0].run_id if runs else None


def guard(context: dg.SensorEvaluationContext, corpus: CorpusResource) -> dg.SensorResult:
    """Delete every invalid key that nothing uses; the skip reason says what was done and why."""
    bad = invalid_keys(context.instance.get_dynamic_partitions(snapshots.name))
    if not bad:
        return dg.SensorResult(skip_reason="every snapshots partition key is valid")
    if (waiting := corpus.missing_config()) is not None:
        return dg.SensorResult(skip_reason=f"{len(bad)} invalid key(s) kept: {waiting}")
    with corpus.workspace() as ws:
        frozen = {key for key, _ in bad if ws.catalog.freeze_digest(key) is not None}
    removed, lines = [], []
    for key, why in bad:
        if key in frozen:
            lines.append(f"kept {why}: the catalog froze it")
        elif (run_id := _run_in_flight(context.instance, key)) is not None:
            lines.append(f"kept {why}: run {run_id} is queued or running")
        else:
            removed.append(key)
            lines.append(f"removed {why}")
    for line in lines:
        context.log.warning(line)
    return dg.SensorResult(
        dynamic_partitions_requests=[snapshots.build_delete_request(removed)] if removed else [],
        skip_reason="; ".join(lines),
    )


with warnings.catch_warnings():  # Dagster 1.13's decorators warn about `owners` unasked
    warnings.simplefilter("ignore", dg.BetaWarning)
    partition_key_guard = dg.sensor(
        name="partition_key_guard",
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Removes a snapshots partition whose key breaks the rule (1-64 characters "
        "from [a-z0-9._-], starting with a letter or digit), e.g. one typed into 'Add "
        "partition'; the tick's skip reason names each key and why.",
    )(guard)
