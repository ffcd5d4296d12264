"""``corpus-assets partition list|delete``: the ``snapshots`` dynamic partitions of the Dagster
instance beside what the catalog holds for them, and removal of one typed by mistake in the UI's
"Add partition" (a run of an invalid key fails, pointing here). ``corpus_assets.cli`` parses the
command line and passes the instance opener as ``args.instance``.
"""

import argparse
import shlex
from dataclasses import dataclass

from corpus_assets.cli.common import CliError, opened
from corpus_assets.core.governance import states
from corpus_assets.core.runtime.keys import is_valid_partition_key

PARTITIONS = "snapshots"  # the DynamicPartitionsDefinition's name (assets.partitions)
IN_FLIGHT = ("QUEUED", "NOT_STARTED", "STARTING", "STARTED")


@dataclass(frozen=True)
class PartitionRow:
    partition: str
    in_dagster: bool
    frozen: bool
    snapshots: list[str]  # "snapshotId STATE" of each build of its freeze

    def line(self) -> str:
        where = "dagster" if self.in_dagster else "catalog-only"
        line = f"{self.partition}  {where}  {'frozen' if self.frozen else 'not-frozen'}  "
        line += ", ".join(self.snapshots) or "no-snapshot"
        if not is_valid_partition_key(self.partition):
            line += f"  INVALID KEY: corpus-assets partition delete {shlex.quote(self.partition)}"
        return line


def partition_rows(dagster_keys: list[str]) -> list[PartitionRow]:
    """Every partition of the instance, then every one only the catalog knows (built with
    another Dagster instance), with its freeze and snapshots."""
    with opened() as home:
        frozen = home.catalog.partition_keys()
        found = states.find(home.catalog)
    snapshots: dict[str, list[str]] = {}
    for snap in found:
        snapshots.setdefault(snap.partition_key, []).append(f"{snap.snapshot_id} {snap.state}")
    keys = dagster_keys + [k for k in frozen if k not in dagster_keys]
    return [
        PartitionRow(key, key in dagster_keys, key in frozen, snapshots.get(key, []))
        for key in keys
    ]


def cmd_partition_list(args: argparse.Namespace) -> int:
    """One line per partition: key, where it exists, frozen or not, its snapshots."""
    rows = partition_rows(list(args.instance().get_dynamic_partitions(PARTITIONS)))
    for row in rows:
        print(row.line())
    if not rows:
        print("no partitions")
    return 0


def cmd_partition_delete(args: argparse.Namespace) -> int:
    """Delete a partition from the Dagster instance only; the catalog is never touched. Refused
    while a build of it is queued or running, and, without ``--force``, once it froze (its
    snapshots stay valid, but the UI would no longer show their materializations)."""
    from dagster import DagsterRunStatus, RunsFilter

    instance, key = args.instance(), args.key
    if key not in instance.get_dynamic_partitions(PARTITIONS):
        raise CliError(
            f"partition {key!r} is not in the Dagster instance ({instance.root_directory})"
        )
    running = instance.get_runs(
        filters=RunsFilter(
            tags={"dagster/partition": key},
            statuses=[DagsterRunStatus(s) for s in IN_FLIGHT],
        )
    )
    if running:
        raise CliError(
            f"partition {key!r} has a run queued or running ({running[0].run_id}): "
            "let it finish or terminate it first"
        )
    with opened() as home:
        frozen = home.catalog.freeze_digest(key) is not None
        built = [s.snapshot_id for s in states.for_partition(home.catalog, key)]
    if frozen and not args.force:
        raise CliError(
            f"partition {key!r} is frozen in the catalog (snapshots: "
            f"{', '.join(built) or 'none'}); "
            "deleting it keeps them but hides their materializations in the UI: pass --force"
        )
    instance.delete_dynamic_partition(PARTITIONS, key)
    print(f"deleted partition {key!r} from the Dagster instance")
    return 0
