"""Partition keys name freezes. Dagster does not validate dynamic partition keys, so we do."""

import re
import time

PARTITION_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


class PartitionKeyError(ValueError):
    pass


def validate_partition_key(key: str) -> str:
    if not isinstance(key, str) or not PARTITION_KEY_RE.match(key):
        raise PartitionKeyError(
            f"partition key {key!r} is invalid: use 1-64 characters from [a-z0-9._-], "
            "starting with a letter or digit"
        )
    return key


def new_partition_key(taken: set[str], now: float | None = None) -> str:
    """``snap-YYYYMMDD-HHMMSS`` in UTC, with a numeric suffix if that second is already used;
    validated here too, since the sensor adds it as a partition before any run checks it."""
    base = time.strftime("snap-%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    key, n = base, 1
    while key in taken:
        n += 1
        key = f"{base}-{n}"
    return validate_partition_key(key)
