"""Partition keys name freezes. Dagster does not validate dynamic partition keys, so we do.

A key is checked where it is created (the sensor, the schedule, ``build --partition``) and again
where a run uses it: the UI's "Add partition" accepts any text, so a mistyped key reaches the
layer assets as an existing partition, and its error must say how to delete that partition.
Dagster calls no project code when the UI (or GraphQL ``addDynamicPartition``) adds a key, so
the earliest refusals there are the ``partition_key_guard`` sensor (``invalid_keys``, then a
delete) and a launch check (``launch_refusal``).
"""

import re
import shlex
import time
from collections.abc import Iterable

PARTITION_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
RULE = "use 1-64 characters from [a-z0-9._-], starting with a letter or digit"


class PartitionKeyError(ValueError):
    """A partition key breaks the rule; the message names the key, the rule and the remedy."""


def is_valid_partition_key(key: object) -> bool:
    return isinstance(key, str) and PARTITION_KEY_RE.match(key) is not None


def delete_instructions(key: str) -> str:
    """How to remove a partition that exists in Dagster (the same text for every path)."""
    return (
        f"Delete the partition: in the Dagster UI open any layer asset (Assets > raw_snapshot), "
        f"open the menu next to Materialize, choose 'Delete partitions', select {key!r} and "
        f"delete; or run `corpus-assets partition delete {shlex.quote(key)}`. "
        "Then add a valid key (or let the source_discovery sensor add one)."
    )


def check_new_partition_key(key: str) -> str:
    """A key about to be created: refused naming the rule, before anything is created."""
    if not is_valid_partition_key(key):
        raise PartitionKeyError(f"partition key {key!r} is invalid: {RULE}")
    return key


def validate_partition_key(key: str) -> str:
    """A key a run was launched for, so it already exists as a Dagster partition (typically
    typed into the UI's "Add partition"): the error also says how to delete it, since every
    asset of that partition shows as failed until it is gone."""
    if not is_valid_partition_key(key):
        raise PartitionKeyError(
            f"partition key {key!r} is invalid: {RULE}. Nothing was built for it. "
            + delete_instructions(key)
        )
    return key


def launch_refusal(key: str | None) -> str | None:
    """One line refusing a run of partition ``key`` before it starts (for a run launcher or a
    run-status check); None when the key is valid or the run has no partition."""
    if key is None or is_valid_partition_key(key):
        return None
    how = (
        f"`corpus-assets partition delete {shlex.quote(key)}`"
        if key.isprintable()  # a line break in the key would break the line and the command
        else "'Delete partitions' in the UI"
    )
    return (
        f"refused: partition key {key!r} is invalid: {RULE}; nothing was started. "
        f"Delete it: {how} (the partition_key_guard sensor also removes it)"
    )


def invalid_keys(keys: Iterable[str]) -> list[tuple[str, str]]:
    """Each invalid key with the line saying why, in the order given."""
    return [
        (key, f"partition key {key!r} is invalid: {RULE}")
        for key in keys
        if not is_valid_partition_key(key)
    ]


def new_partition_key(taken: set[str], now: float | None = None) -> str:
    """``snap-YYYYMMDD-HHMMSS`` in UTC, with a numeric suffix if that second is already used;
    checked here too, since the sensor and the schedule add it before any run checks it."""
    base = time.strftime("snap-%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    key, n = base, 1
    while key in taken:
        n += 1
        key = f"{base}-{n}"
    return check_new_partition_key(key)
