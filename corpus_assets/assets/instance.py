"""The project's Dagster instance (``instance_class`` in ``dagster.yaml``): a launch of
``build_snapshot`` without a partition means "a new snapshot of the current sources".

The UI lets a partitioned job be launched without a partition (after an "Are you sure?"). Such a
run used to fail inside Dagster, and since Dagster records which assets a run will materialize
when it creates the run, all seven layers then showed as failed. The decision is therefore taken
where the run is created, before anything is recorded: the run gets a new, validated partition
(the key the discovery sensor would choose), added like the sensor adds it, and the tags of a
requested build. It is then an ordinary ``build_snapshot`` run of that partition: same job as
CLI and sensor builds, counted by the sensor as in flight, queued behind any other build.

A run naming a partition key that breaks the rule (``keys.launch_refusal``; typed into the UI's
"Add partition", which calls no project code) is refused here too, with that one line, before
Dagster records anything of it: no run, no planned materialization, so nothing is drawn red.
Every partitioned job and asset of this code location is partitioned by ``snapshots``, so this
holds for every job (``build_snapshot``, ``check_snapshot``, ``approve_snapshot``, the UI's
Materialize button) and for a re-execution of an old run of such a key.
"""

from collections.abc import Mapping
from typing import Any

import dagster as dg
from dagster._core.instance.ref import InstanceRef
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    BACKFILL_ID_TAG,
    PARTITION_NAME_TAG,
)

from corpus_assets.assets.event_log import shared_engine_event_log
from corpus_assets.assets.partitions import snapshots
from corpus_assets.core.runtime.keys import PartitionKeyError, launch_refusal, new_partition_key

BUILD_JOB = "build_snapshot"
NEW_SNAPSHOT_TAG = "corpus/new-snapshot"  # the run added its own partition at launch
PARTITION_TAGS = (PARTITION_NAME_TAG, ASSET_PARTITION_RANGE_START_TAG, BACKFILL_ID_TAG)
KEY_TAGS = (PARTITION_NAME_TAG, ASSET_PARTITION_RANGE_START_TAG, ASSET_PARTITION_RANGE_END_TAG)


def names_partitions(tags: Mapping[str, Any] | None) -> bool:
    """Whether a run's tags already say which partition(s) it builds (or a backfill does)."""
    return any(tag in (tags or {}) for tag in PARTITION_TAGS)


def refuse_invalid_keys(tags: Mapping[str, Any] | None) -> None:
    """PartitionKeyError, its message the one line of ``launch_refusal``, if the run's tags
    name a partition key that breaks the rule."""
    for tag in KEY_TAGS:
        refusal = launch_refusal((tags or {}).get(tag))
        if refusal is not None:
            raise PartitionKeyError(refusal)


def add_new_snapshot(instance: dg.DagsterInstance) -> str:
    """Add the partition a new snapshot is built in, as the discovery sensor names it."""
    key = new_partition_key(set(instance.get_dynamic_partitions(snapshots.name)))
    instance.add_dynamic_partitions(snapshots.name, [key])
    return key


class CorpusInstance(dg.DagsterInstance):
    """Dagster's instance, except that a partitionless ``build_snapshot`` run gets a new
    partition before it is created, a run of an invalid partition key is not created, and a
    SQLite event log keeps one engine per database file (``event_log``)."""

    def __init__(self, *args: Any, event_storage: Any, **kwargs: Any) -> None:
        super().__init__(*args, event_storage=shared_engine_event_log(event_storage), **kwargs)

    @classmethod
    def config_schema(cls) -> dict[str, Any]:
        """No settings of its own (Dagster asks a custom instance class for them)."""
        return {}

    @staticmethod
    def config_defaults(base_dir: str) -> Mapping[str, Any]:
        return InstanceRef.config_defaults(base_dir)

    def new_snapshot_tags(self, job_name: str, tags: Mapping[str, Any] | None) -> Any:
        """``tags`` with a new partition added when a build names none."""
        if job_name != BUILD_JOB or names_partitions(tags):
            return tags
        key = add_new_snapshot(self)
        return {**(tags or {}), PARTITION_NAME_TAG: key, NEW_SNAPSHOT_TAG: "true"}

    def create_run(self, *, job_name: str, tags: Mapping[str, Any] | None, **kwargs: Any) -> Any:
        """Every launch goes through here: the UI, sensors, schedules, backfills."""
        refuse_invalid_keys(tags)
        tags = self.new_snapshot_tags(job_name, tags)
        return super().create_run(job_name=job_name, tags=tags, **kwargs)

    def create_run_for_job(self, job_def: Any, *args: Any, **kwargs: Any) -> Any:
        """In-process execution (``execute_in_process``, ``dagster job execute``)."""
        refuse_invalid_keys(kwargs.get("tags"))
        kwargs["tags"] = self.new_snapshot_tags(job_def.name, kwargs.get("tags"))
        return super().create_run_for_job(job_def, *args, **kwargs)
