"""When the discovery sensor should ask for a new snapshot build, decided without Dagster.

The sensor's cursor remembers the source state it last requested a build for and the partition
it added for it. A state is skipped when the latest freeze already holds it, or when a build
was requested for it and that partition has not frozen yet (queued or running). Anything else
gets a new partition, whose run key names the partition, never the state: Dagster launches one
run per run key, so a key naming the state would drop the build of a state the sources return
to (A -> B -> A).
"""

import json
from dataclasses import dataclass

from corpus_assets.core.ingest.sources import fingerprint
from corpus_assets.core.runtime.workspace import Workspace


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


def build_run_key(partition_key: str) -> str:
    return f"build:{partition_key}"


def discovery_skip(ws: Workspace, cursor: DiscoveryCursor) -> tuple[str, str | None]:
    """The sources' current fingerprint, and why no build is needed for it (None: build one)."""
    current = fingerprint(ws.loaded)
    latest = ws.catalog.latest_freeze()
    if latest is not None and latest["fingerprint"] == current:
        return current, f"sources unchanged since {latest['partition_key']}"
    requested = cursor.partition if cursor.fingerprint == current else None
    if requested is not None and ws.catalog.freeze_digest(requested) is None:
        return current, f"partition {requested} is requested for this source state"
    return current, None
