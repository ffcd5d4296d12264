"""One CDC event line, parsed and canonicalized; kept apart so every reader refuses alike.

An event is refused unless it can be interpreted exactly (CDC state must never be silently
wrong): bad JSON, duplicate member names, NaN, a missing or non-decimal ``source.lsn``, an unknown
op, or a row image without its key all name the source, segment and line. The canonical bytes
of an event are what the fold hashes, so ``57`` and ``"57"`` as an lsn are one event.
"""

import json
import re
from dataclasses import dataclass
from typing import Any

import rfc8785

from corpus_assets.core.storage.digests import canonical_foreign_json

OPS = frozenset({"c", "u", "d", "r"})
_DECIMAL = re.compile(r"[0-9]+")


class ChangelogError(RuntimeError):
    """The changelog cannot be folded faithfully; the message names source, segment and line."""


@dataclass(frozen=True)
class Event:
    """One parsed event: what it does to the table state and its canonical bytes."""

    lsn: int
    canon: bytes
    op: str
    key: str  # the key written (c/r/u) or deleted (d)
    old_key: str | None  # u whose before names another key: that key is deleted
    after: dict[str, Any] | None
    where: str


def load_event(raw: bytes, what: str, where: str) -> tuple[dict[str, Any], bool]:
    """Parse one event; also say whether it is *plain* (no floats, ASCII member names).

    A plain event's RFC 8785 form is what the C JSON encoder writes with sorted keys, which is
    many times faster than the pure-Python canonicalizer every other event goes through.
    """
    plain = True

    def members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal plain
        result = dict(pairs)
        if len(result) != len(pairs):
            names = [name for name, _ in pairs]
            twice = sorted({name for name in names if names.count(name) > 1})
            raise ValueError(f"duplicate member names {twice}")
        plain = plain and "".join(result).isascii()
        return result

    def number(text: str) -> float:
        nonlocal plain
        plain = False
        return float(text)

    try:
        body = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=members,
            parse_float=number,
            parse_constant=_no_constant,
        )
    except (UnicodeDecodeError, ValueError) as error:
        raise ChangelogError(f"{what}: {where}: not a JSON event: {error}") from None
    if not isinstance(body, dict):
        raise ChangelogError(f"{what}: {where}: event is {type(body).__name__}, not an object")
    return body, plain


def lsn_of(body: dict[str, Any], what: str, where: str) -> int:
    source = body.get("source")
    if not isinstance(source, dict) or "lsn" not in source:
        raise ChangelogError(f"{what}: {where}: no source.lsn")
    return as_offset(source["lsn"], what, f"{where}: source.lsn")


def parse_event(raw: bytes, key_field: str, what: str, where: str) -> Event:
    body, plain = load_event(raw, what, where)
    lsn = lsn_of(body, what, where)
    op = body.get("op")
    if op not in OPS:
        raise ChangelogError(f"{what}: {where}: unknown op {op!r} (expected c, u, d or r)")
    before, after = body.get("before"), body.get("after")
    old_key: str | None = None
    if op == "d":
        key = _key(before, "before", key_field, what, where)
        after = None
    else:
        key = _key(after, "after", key_field, what, where)
        if op == "u" and before is not None:
            old_key = _key(before, "before", key_field, what, where)
    canonical = dict(body)
    canonical["source"] = {**body["source"], "lsn": str(lsn)}  # 57 and "57" are one event
    return Event(
        lsn, canonical_event(canonical, plain, what, where), op, key, old_key, after, where
    )


def canonical_event(value: Any, plain: bool, what: str, where: str) -> bytes:
    """RFC 8785 bytes; integers beyond 2**53 (bigint keys) are written exactly, not refused."""
    try:
        return canonical_foreign_json(value, plain=plain)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError) as error:
        raise ChangelogError(f"{what}: {where}: cannot canonicalize event: {error}") from None


def as_offset(value: Any, what: str, label: str) -> int:
    """An lsn given as a non-negative int or a decimal string (offsets can pass 2**53)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return int(value)
    raise ChangelogError(f"{what}: {label} {value!r} is not a non-negative integer")


def _key(image: Any, side: str, key_field: str, what: str, where: str) -> str:
    if not isinstance(image, dict):
        raise ChangelogError(f"{what}: {where}: {side} is {type(image).__name__}, not a row")
    if key_field not in image:
        raise ChangelogError(f"{what}: {where}: {side} has no key field {key_field!r}")
    value = image[key_field]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ChangelogError(
            f"{what}: {where}: {side}.{key_field} is {type(value).__name__}, not a string or int"
        )
    return str(value)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
