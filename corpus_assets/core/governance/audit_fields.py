"""The one rule for audit fields: text a person or a tool supplies that the catalog keeps as the
record of who did what and why (approver, actor, tombstone target and reason, benchmark name and
item ids, a permit's run id and purpose).

Those fields are printed one per line or per table cell (``history``, ``status``, the Dagster
UI), so a line break in one forges the next line of the audit trail, an escape sequence rewrites
the terminal, and a bidirectional override reorders what follows on screen. They are refused,
never cleaned up: a cleaned value would record something nobody typed. Refused: Unicode control
characters (``Cc``: C0 with tab and newline, DEL, C1 with NEL), the line and paragraph separators
(``Zl``, ``Zp``), bidirectional embeddings, overrides and isolates (U+202A-U+202E,
U+2066-U+2069) and lone surrogates (``Cs``: command-line bytes that were not UTF-8). Joiners
and every letter, mark, symbol and space of any script pass, as do the ordinary space.

Every entry point calls :func:`audit_field`: the CLI before the command runs (its message names
the flag), the Dagster job config, and the core functions that write these rows (for Python
callers), so no path writes one unchecked.
"""

import unicodedata
from typing import Any

from sqlalchemy import Column

_REFUSED_CATEGORIES = frozenset({"Cc", "Zl", "Zp", "Cs"})
_BIDI_CONTROLS = frozenset(chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A)))


class AuditFieldError(ValueError):
    """An audit field holds a character that could forge or hide part of the audit trail."""


def refused_at(value: str) -> int | None:
    """The 0-based index of the first refused character in ``value``, or None."""
    if value.isprintable() and value.isascii():  # the common case, at C speed
        return None
    for index, char in enumerate(value):
        if char in _BIDI_CONTROLS or unicodedata.category(char) in _REFUSED_CATEGORIES:
            return index
    return None


def audit_field(field: str, value: str, column: Column[Any] | None = None) -> str:
    """``value`` unchanged, or AuditFieldError naming ``field``, the 1-based position and the
    character's code point and name (never the value itself: it may hold the forged line).
    With the catalog ``column`` it is written to, a value longer than the column's width is
    refused too (PostgreSQL would refuse it with a traceback; SQLite would keep it whole)."""
    if not isinstance(value, str):
        raise AuditFieldError(f"{field}: a string is expected, not {type(value).__name__}")
    width = getattr(column.type, "length", None) if column is not None else None
    if width is not None and len(value) > width:
        raise AuditFieldError(
            f"{field}: {len(value)} characters; at most {width} are kept in the audit trail"
        )
    index = refused_at(value)
    if index is None:
        return value
    char = value[index]
    name = unicodedata.name(char, "") or _CONTROL_NAMES.get(char, "control character")
    raise AuditFieldError(
        f"{field}: character {index + 1} is U+{ord(char):04X} ({name}); audit fields refuse "
        "control characters, line breaks and bidirectional overrides"
    )


def shown(value: str) -> str:
    """``value`` for a one-line display: each refused character as its Python escape (``\\n``,
    ``\\x1b``, ``\\u2028``), for rows a release before this rule wrote unchecked."""
    if refused_at(value) is None:
        return value
    return "".join(
        char.encode("unicode_escape", "backslashreplace").decode("ascii")
        if char in _BIDI_CONTROLS or unicodedata.category(char) in _REFUSED_CATEGORIES
        else char
        for char in value
    )


# ``unicodedata.name`` has no name for C0/C1 controls; the common ones, as people call them.
_CONTROL_NAMES = {
    "\x00": "NUL",
    "\t": "TAB",
    "\n": "LINE FEED",
    "\r": "CARRIAGE RETURN",
    "\x1b": "ESCAPE",
    "\x7f": "DELETE",
    "\x85": "NEXT LINE",
}
