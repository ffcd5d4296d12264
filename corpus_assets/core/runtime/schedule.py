"""``schedule:`` in ``corpus.yaml``: when the ``incremental_build`` schedule requests a build.

Not a policy (no output byte depends on it), so it is not hashed into any manifest. Absent, the
schedule exists but is off. The cron is checked here without Dagster (core never imports it);
the assets layer checks it again with Dagster's own parser when it defines the schedule.
"""

import re
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, field_validator

DEFAULT_CRON = (
    "0 3 * * *"  # daily at 03:00 in ``timezone``: what a schedule turned on in the UI uses
)
MACROS = ("@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually")
NAMES = {
    "month": ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
    "day of week": ["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
}
FIELDS = (  # name, lowest, highest
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
)
MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
ITEM = re.compile(r"^(\*|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/([0-9]+))?$")


def _value(text: str, name: str, low: int, high: int) -> int:
    names = NAMES.get(name, [])
    if text in names:
        return names.index(text) + low
    if not text.isdigit() or not low <= int(text) <= high:
        raise ValueError(f"{name} {text!r} is not in {low}-{high}")
    return int(text)


def check_cron(cron: str) -> str:
    """Five fields (minute hour day-of-month month day-of-week) of ``*``, values, ranges,
    steps and lists, or a macro such as ``@daily``; the error names the field at fault."""
    if cron.strip().lower() in MACROS:
        return cron
    parts = cron.lower().split()
    if len(parts) != len(FIELDS):
        raise ValueError(
            f"cron {cron!r} has {len(parts)} fields, not 5 (minute hour day-of-month month "
            "day-of-week, e.g. '0 3 * * *')"
        )
    for part, (name, low, high) in zip(parts, FIELDS, strict=True):
        for item in part.split(","):
            match = ITEM.match(item)
            if match is None or match.group(2) == "0":
                raise ValueError(f"cron {cron!r}: {name} field {part!r} is not valid")
            if match.group(1) == "*":
                continue
            try:
                bounds = [_value(v, name, low, high) for v in match.group(1).split("-")]
            except ValueError as error:
                raise ValueError(f"cron {cron!r}: {error}") from None
            if bounds[0] > bounds[-1]:
                raise ValueError(f"cron {cron!r}: {name} range {match.group(1)!r} is reversed")
    return _day_exists(cron, parts[2], parts[3])


def _day_exists(cron: str, day: str, month: str) -> str:
    """One day of one month must exist (``0 0 30 2 *`` never runs; Dagster refuses it)."""
    if day.isdigit() and (month.isdigit() or month in NAMES["month"]):
        number = _value(month, "month", 1, 12)
        if int(day) > MONTH_DAYS[number - 1]:
            raise ValueError(f"cron {cron!r}: month {month!r} has no day {day}")
    return cron


class Schedule(BaseModel):
    """Build on ``cron`` (in ``timezone``): ``when: changed`` only if the sources changed since
    the latest freeze, ``always`` every tick; never while a build of that state is pending."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    cron: str = DEFAULT_CRON
    when: Literal["changed", "always"] = "changed"
    timezone: str = "UTC"

    @field_validator("cron")
    @classmethod
    def _cron(cls, cron: str) -> str:
        return check_cron(cron)

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, name: str) -> str:
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone {name!r} is not an IANA time zone (e.g. UTC)") from None
        return name
