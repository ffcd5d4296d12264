"""The incremental_build schedule: its cron from corpus.yaml, off by default, and one rule with
the discovery sensor so that neither builds a source state the other already requested.

A requested run is recorded as the daemon records it (a run in the instance, tagged as Dagster
tags it, NOT_STARTED as the default run coordinator creates it before launching; QUEUED would need
a code-location origin); "running" it builds the partition with the real build_snapshot job and
removes that record, which stops counting as in flight as the finished run would.
"""

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
import pytest

from corpus_assets.assets.schedules import configured_schedule, define_schedule, incremental_build
from corpus_assets.core.ingest.discovery import FINGERPRINT_TAG
from corpus_assets.core.runtime.config import ConfigError, load_config
from corpus_assets.core.runtime.schedule import DEFAULT_CRON, Schedule
from corpus_assets.definitions import defs
from corpus_assets_tests.assets.test_dagster import RESOURCES, _discover, _requested

if TYPE_CHECKING:  # what evaluate_tick returns; Dagster does not export the name
    from dagster._core.definitions.schedule_definition import ScheduleExecutionData

TICK = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)


def _configure(home: Path, schedule: str) -> None:
    with (home / "corpus.yaml").open("a") as config:
        config.write(f"schedule: {schedule}\n")


def _tick(instance: dg.DagsterInstance) -> "ScheduleExecutionData":
    """One daemon-less tick of the schedule against the real instance and definitions."""
    context = dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=TICK,
        resources=RESOURCES,
        repository_def=defs.get_repository_def(),
    )
    return incremental_build.evaluate_tick(context)


def _scheduled(data: "ScheduleExecutionData", instance: dg.DagsterInstance) -> dg.RunRequest:
    """The one run the tick requested; the tick itself added its (valid) partition."""
    assert data.skip_message is None, data.skip_message
    (request,) = data.run_requests
    assert request.partition_key in instance.get_dynamic_partitions("snapshots")
    assert request.run_key == f"build:{request.partition_key}"
    assert request.partition_key.startswith("snap-")
    return request


def _queue(instance: dg.DagsterInstance, request: dg.RunRequest) -> dg.DagsterRun:
    """What the daemon does with a request: the partition exists and a run waits for it."""
    instance.add_dynamic_partitions("snapshots", [request.partition_key])
    return instance.create_run_for_job(
        job_def=defs.resolve_job_def("build_snapshot"),
        tags={**request.tags, "dagster/partition": request.partition_key},
        status=dg.DagsterRunStatus.NOT_STARTED,
    )


def _run(instance: dg.DagsterInstance, queued: dg.DagsterRun) -> None:
    """The queued run runs: the real job builds (and freezes) its partition."""
    result = defs.resolve_job_def("build_snapshot").execute_in_process(
        partition_key=queued.tags["dagster/partition"], instance=instance, tags=queued.tags
    )
    assert result.success
    instance.delete_run(queued.run_id)


def test_a_sensor_request_blocks_the_schedule_until_it_froze(demo_home: Path) -> None:
    _configure(demo_home, "{cron: '0 3 * * *', when: changed}")
    with dg.instance_for_test() as instance:
        found = _discover(instance, None)
        request = _requested(found)
        queued = _queue(instance, request)
        assert queued.tags[FINGERPRINT_TAG].startswith("sha256:")

        waiting = _tick(instance)  # the schedule cannot see the sensor's cursor, only the run
        assert not waiting.run_requests
        assert f"partition {request.partition_key} is requested" in str(waiting.skip_message)

        _run(instance, queued)
        after = _tick(instance)
        assert not after.run_requests and "unchanged" in str(after.skip_message)
        unchanged = _discover(instance, found.cursor)
        assert not unchanged.run_requests and "unchanged" in str(unchanged.skip_reason)
        assert instance.get_dynamic_partitions("snapshots") == [request.partition_key]


def test_a_scheduled_build_blocks_the_sensor_for_its_state_only(demo_home: Path) -> None:
    _configure(demo_home, "{cron: '0 3 * * *'}")
    with dg.instance_for_test() as instance:
        request = _scheduled(_tick(instance), instance)
        assert request.tags["dagster/schedule_name"] == "incremental_build"
        _queue(instance, request)

        blocked = _discover(instance, None)  # a fresh cursor: only the queued run tells
        assert not blocked.run_requests
        assert f"partition {request.partition_key} is requested" in str(blocked.skip_reason)
        again = _tick(instance)
        assert not again.run_requests and request.partition_key in str(again.skip_message)

        late = demo_home / "demo-sources" / "essays" / "essays-00002.jsonl"
        late.write_text('{"id": "late", "text": "A late essay arrives."}\n')
        changed = _requested(_discover(instance, blocked.cursor))  # another state: built
        assert changed.partition_key != request.partition_key
        assert changed.tags[FINGERPRINT_TAG] != request.tags[FINGERPRINT_TAG]


def test_a_build_launched_by_hand_counts_as_the_current_state(demo_home: Path) -> None:
    """A run without a source-state tag (the UI's Materialize) will freeze the sources as they
    are: neither the sensor nor the schedule requests them again meanwhile."""
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("snapshots", ["by-hand"])
        instance.create_run_for_job(
            job_def=defs.resolve_job_def("build_snapshot"),
            tags={"dagster/partition": "by-hand"},
            status=dg.DagsterRunStatus.STARTED,
        )
        assert "partition by-hand" in str(_discover(instance, None).skip_reason)
        assert "partition by-hand" in str(_tick(instance).skip_message)


def test_when_always_builds_unchanged_sources_but_never_two_at_once(demo_home: Path) -> None:
    _configure(demo_home, "{cron: '0 3 * * *', when: always}")
    with dg.instance_for_test() as instance:
        first = _scheduled(_tick(instance), instance)
        queued = _queue(instance, first)
        busy = _tick(instance)
        assert not busy.run_requests
        assert f"build of partition {first.partition_key} is queued or running" in str(
            busy.skip_message
        )
        _run(instance, queued)
        assert "unchanged" in str(_discover(instance, None).skip_reason)  # the sensor: no build
        second = _scheduled(_tick(instance), instance)  # always: unchanged, built again
        assert second.partition_key != first.partition_key
        assert second.tags[FINGERPRINT_TAG] == first.tags[FINGERPRINT_TAG]


def test_the_schedule_is_defined_off_without_a_schedule_section(
    demo_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = define_schedule(*configured_schedule())
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert (schedule.cron_schedule, schedule.execution_timezone) == (DEFAULT_CRON, "UTC")
    monkeypatch.setenv("CORPUS_CONFIG", str(demo_home / "missing.yaml"))
    assert define_schedule(*configured_schedule()).default_status.name == "STOPPED"
    loaded = defs.resolve_schedule_def("incremental_build")
    assert loaded.job_name == "build_snapshot"


def test_a_schedule_section_turns_it_on_with_its_cron(demo_home: Path) -> None:
    _configure(demo_home, "{cron: '*/30 6-18 * * mon-fri', timezone: Europe/Paris}")
    schedule = define_schedule(*configured_schedule())
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    assert schedule.cron_schedule == "*/30 6-18 * * mon-fri"
    assert schedule.execution_timezone == "Europe/Paris"


def test_a_cron_dagster_refuses_leaves_it_off_and_says_so(demo_home: Path) -> None:
    """The guard behind core's lighter check: a section built without validation."""
    refused = Schedule.model_construct(cron="0 0 30 2 *", when="changed", timezone="UTC")
    schedule = define_schedule(refused, True, "on")
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert schedule.cron_schedule == DEFAULT_CRON
    assert "Dagster refuses schedule.cron '0 0 30 2 *'" in str(schedule.description)


def test_an_invalid_config_does_not_break_loading(demo_home: Path) -> None:
    _configure(demo_home, "{cron: '0 3 * *'}")
    section, on, why = configured_schedule()
    assert (section, on) == (Schedule(), False)
    assert "schedule.cron: cron '0 3 * *' has 4 fields" in why
    assert define_schedule(section, on, why).default_status == dg.DefaultScheduleStatus.STOPPED


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("{cron: '0 25 * * *'}", "schedule.cron: cron '0 25 * * *': hour '25' is not in 0-23"),
        ("{cron: '0 3 * *'}", "schedule.cron: cron '0 3 * *' has 4 fields, not 5"),
        ("{cron: '*/0 * * * *'}", "schedule.cron: cron '*/0 * * * *': minute field '*/0'"),
        ("{cron: '0 3 * * fri-mon'}", "day of week range 'fri-mon' is reversed"),
        ("{cron: '0 0 30 feb *'}", "schedule.cron: cron '0 0 30 feb *': month 'feb' has no day 30"),
        ("{when: sometimes}", "schedule.when: Input should be 'changed' or 'always'"),
        ("{timezone: Mars/Base}", "schedule.timezone: timezone 'Mars/Base' is not an IANA"),
        ("{cron: '0 3 * * *', every: day}", "schedule.every: Extra inputs are not permitted"),
    ],
)
def test_a_bad_schedule_section_names_the_field_and_value(
    demo_home: Path, section: str, message: str
) -> None:
    _configure(demo_home, section)
    with pytest.raises(ConfigError, match=r"corpus\.yaml: ") as info:
        load_config()
    assert message in str(info.value)
