"""Sensors: discover source changes (adds a partition + run), and gate publication."""

import json
import warnings

import dagster as dg

from corpus_assets.assets.jobs import activate_snapshot, activation_run_config, build_snapshot
from corpus_assets.assets.partitions import snapshots
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.core.governance.gate import read_gate
from corpus_assets.core.ingest.sources import fingerprint
from corpus_assets.core.release.publish import next_to_activate
from corpus_assets.core.runtime.keys import new_partition_key


def _last_request(cursor: str | None) -> dict[str, str]:
    """The discovery cursor: the source fingerprint last requested and the partition added for
    it. A cursor this code did not write (an older bare fingerprint) names no request."""
    try:
        last = json.loads(cursor or "{}")
    except ValueError:
        return {}
    return last if isinstance(last, dict) else {}


# Dagster 1.13 warns (BetaWarning: `owners`) from inside its own sensor decorator even when
# `owners` is not passed; silence exactly that category while the sensors are defined.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", dg.BetaWarning)

    @dg.sensor(
        job=build_snapshot,
        minimum_interval_seconds=60,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Adds a snapshot partition and requests a build when the sources' "
        "listing fingerprint differs from the last freeze.",
    )
    def source_discovery(
        context: dg.SensorEvaluationContext, corpus: CorpusResource
    ) -> dg.SensorResult:
        last = _last_request(context.cursor)
        with corpus.workspace() as ws:
            current = fingerprint(ws.loaded)
            latest = ws.catalog.latest_freeze()
            # requested for this state and not frozen yet: its build is queued or underway
            requested = last.get("partition") if last.get("fingerprint") == current else None
            pending = requested is not None and ws.catalog.freeze_digest(requested) is None
        if latest is not None and latest["fingerprint"] == current:
            return dg.SensorResult(skip_reason=f"sources unchanged since {latest['partition_key']}")
        if pending:
            return dg.SensorResult(
                skip_reason=f"partition {requested} is requested for this source state"
            )
        key = new_partition_key(set(context.instance.get_dynamic_partitions(snapshots.name)))
        # the run key names the partition: Dagster launches one run per run key, so a key
        # naming the source state would drop the build of a state the sources return to
        return dg.SensorResult(
            run_requests=[dg.RunRequest(partition_key=key, run_key=f"build:{key}")],
            dynamic_partitions_requests=[snapshots.build_add_request([key])],
            cursor=json.dumps({"fingerprint": current, "partition": key}, sort_keys=True),
        )

    @dg.sensor(
        job=activate_snapshot,
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Requests activation of the newest APPROVED snapshot of each alias, only "
        "if it is newer (a later freeze) than the one the alias serves: never a rollback.",
    )
    def publication(context: dg.SensorEvaluationContext, corpus: CorpusResource) -> dg.SensorResult:
        with corpus.workspace() as ws:
            ready = [
                (s, read_gate(ws.catalog, s.alias).generation) for s in next_to_activate(ws.catalog)
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
