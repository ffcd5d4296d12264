"""Whether the discovery sensor or the incremental schedule should ask for a snapshot build,
decided by one rule without Dagster, so the two never request the same source state twice.

A build is pending when its partition has not frozen yet and either its run is queued or running
(the Dagster side passes these in, each with the source state it was requested for, from the
run's ``corpus/fingerprint`` tag) or it is the one the sensor's cursor requested (the sensor's
own requests before Dagster has created their runs). With ``when="changed"`` (the sensor, and the
schedule's default) a state is skipped when the latest freeze already holds it or a pending build
was requested for it; a pending build of unknown state (launched by hand) will freeze the sources
as they are, so it counts as this state's. With ``when="always"`` (the schedule only) a build is
requested every time unless one is queued or running at all.

Anything else gets a new partition, whose run key names the partition, never the state: Dagster
launches one run per run key, so a key naming the state would drop the build of a state the
sources return to (A -> B -> A).
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from corpus_assets.core.ingest.sources import fingerprint
from corpus_assets.core.runtime.workspace import Workspace

FINGERPRINT_TAG = "corpus/fingerprint"  # the run tag naming the source state a build is for
When = Literal["changed", "always"]


@dataclass(frozen=True)
class PendingBuild:
    """A requested build: its partition and the source fingerprint it was requested for (None:
    unknown, e.g. launched by hand in the UI)."""

    partition: str
    fingerprint: str | None = None


@dataclass(frozen=True)
class DiscoveryCursor:
    """The source fingerprint last requested and the partition added for it."""

    fingerprint: str | None = None
    partition: str | None = None

    @classmethod
    def parse(cls, cursor: str | None) -> "DiscoveryCursor":
        """A cursor this code did not write (an older bare fingerprint) names no request."""
        try:
            last = json.loads(cursor or "{}")
        except ValueError:
            return cls()
        if not isinstance(last, dict):
            return cls()
        return cls(last.get("fingerprint"), last.get("partition"))

    def dump(self) -> str:
        return json.dumps(
            {"fingerprint": self.fingerprint, "partition": self.partition}, sort_keys=True
        )

    def requested(self) -> list[PendingBuild]:
        """The build this cursor remembers requesting, as a pending build (if it names one)."""
        if self.partition is None or self.fingerprint is None:
            return []
        return [PendingBuild(self.partition, self.fingerprint)]


def build_run_key(partition_key: str) -> str:
    return f"build:{partition_key}"


def build_skip(
    ws: Workspace, pending: Iterable[PendingBuild], when: When = "changed"
) -> tuple[str, str | None]:
    """The sources' current fingerprint, and why no build is needed for it (None: build one).
    ``pending``: builds requested and not finished (queued or running runs, and the sensor's
    last request); for ``always`` any of them blocks, for ``changed`` only an unfrozen one of
    this state (or of an unknown one)."""
    current = fingerprint(ws.loaded)
    pending = list(pending)
    if when == "always":
        if pending:
            return current, f"the build of partition {pending[0].partition} is queued or running"
        return current, None
    latest = ws.catalog.latest_freeze()
    if latest is not None and latest["fingerprint"] == current:
        return current, f"sources unchanged since {latest['partition_key']}"
    for build in pending:
        if build.fingerprint not in (current, None):
            continue
        if ws.catalog.freeze_digest(build.partition) is None:
            return current, f"partition {build.partition} is requested for this source state"
    return current, None


def discovery_skip(
    ws: Workspace, cursor: DiscoveryCursor, in_flight: Iterable[PendingBuild] = ()
) -> tuple[str, str | None]:
    """The sensor's decision: ``build_skip`` over the queued or running builds (whoever asked
    for them, the schedule included) and the build its cursor requested."""
    return build_skip(ws, [*in_flight, *cursor.requested()], "changed")
