"""The ``incremental_build`` schedule: a snapshot build on a cron from ``corpus.yaml``.

Dagster needs the cron when the definitions load, so it is read from the corpus config then
(found as the ``CorpusResource`` finds it: ``CORPUS_CONFIG``, else ``$CORPUS_HOME/corpus.yaml``).
Without a config or a ``schedule:`` section the schedule still exists, on ``DEFAULT_CRON`` and
stopped, so it can be turned on in the UI; loading never fails because of it. Each tick decides
with the discovery sensor's rule (``discovery.build_skip``) over the same queued or running runs,
so the two never build one source state twice, and requests the run the sensor would request.
"""

import warnings

import dagster as dg

from corpus_assets.assets.jobs import build_snapshot
from corpus_assets.assets.partitions import snapshots
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.assets.sensors import build_request, in_flight_builds
from corpus_assets.core.ingest.discovery import build_skip
from corpus_assets.core.runtime.config import ConfigError, config_path, load_config
from corpus_assets.core.runtime.keys import new_partition_key
from corpus_assets.core.runtime.schedule import Schedule

OFF = "off by default: add a `schedule:` section to corpus.yaml to run it, or start it here"


def configured_schedule() -> tuple[Schedule, bool, str]:
    """The ``schedule:`` section (or the defaults), whether it is configured, and why not."""
    if not config_path().is_file():
        return Schedule(), False, OFF
    try:
        section = load_config().config.schedule
    except ConfigError as error:  # every run and tick fails naming it too; the UI must load
        return Schedule(), False, f"off: {error}"
    if section is None:
        return Schedule(), False, OFF
    return section, True, f"on from corpus.yaml (when: {section.when})"


def tick(
    context: dg.ScheduleEvaluationContext, corpus: CorpusResource
) -> dg.RunRequest | dg.SkipReason:
    """One tick: skip with the reason, or add a new partition and request its build. A schedule
    cannot return partition requests (a sensor can), so the tick adds the partition itself."""
    if (waiting := corpus.missing_config()) is not None:
        return dg.SkipReason(waiting)
    in_flight = in_flight_builds(context.instance)
    with corpus.workspace() as ws:
        when = ws.config.schedule.when if ws.config.schedule else "changed"
        current, skip = build_skip(ws, in_flight, when)
    if skip is not None:
        return dg.SkipReason(skip)
    key = new_partition_key(set(context.instance.get_dynamic_partitions(snapshots.name)))
    context.instance.add_dynamic_partitions(snapshots.name, [key])
    return build_request(key, current)


def _schedule(section: Schedule, on: bool, why: str) -> dg.ScheduleDefinition:
    with warnings.catch_warnings():  # Dagster 1.13's decorators warn about `owners` unasked
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.schedule(
            name="incremental_build",
            job=build_snapshot,
            cron_schedule=section.cron,
            execution_timezone=section.timezone,
            default_status=dg.DefaultScheduleStatus.RUNNING
            if on
            else dg.DefaultScheduleStatus.STOPPED,
            description="Builds a new snapshot when the sources changed since the latest freeze "
            "(when: changed) or on every tick (when: always), never while a build of that "
            f"state is queued or running; {why}.",
        )(tick)


def define_schedule(section: Schedule, on: bool, why: str) -> dg.ScheduleDefinition:
    """RUNNING only when configured. A cron Dagster's own parser refuses (one core's lighter
    check let through) falls back to the default, stopped, saying why in its description; no
    warning, since the CLI imports these definitions and prints one line per error."""
    try:
        return _schedule(section, on, why)
    except dg.DagsterInvalidDefinitionError:
        return _schedule(Schedule(), False, f"off: Dagster refuses schedule.cron {section.cron!r}")


incremental_build = define_schedule(*configured_schedule())
