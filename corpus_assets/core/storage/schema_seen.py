"""SQLite catalog files whose schema this process brought up to date (``Catalog``).

A build opens its catalog ~15 times (each Dagster step's workspace), and each ``create_all``
and added-columns check was ~60 PRAGMA queries (~2 ms). SQLite bumps ``schema_version`` at every
DDL statement, so a file (same device and inode) whose version is unchanged since this process
checked it still has every table and column; any DDL since, or another file at the path, is
checked again. PostgreSQL catalogs are checked at every open.
"""

import os
from pathlib import Path

from sqlalchemy import Engine

_SEEN: dict[tuple[int, int], int] = {}  # (device, inode) -> schema_version after the check


def _key(db: Path) -> tuple[int, int] | None:
    """(device, inode) of the SQLite file ``db``, or None if there is none yet."""
    try:
        st = os.stat(db)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _version(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql("PRAGMA schema_version").scalar() or 0)


def current(engine: Engine, db: Path) -> bool:
    """True when this process made ``db``'s schema current and no DDL ran on it since."""
    key = _key(db)
    return key is not None and key in _SEEN and _SEEN[key] == _version(engine)


def remember(engine: Engine, db: Path) -> None:
    """``db``'s schema is current now (``Catalog`` just checked it)."""
    key = _key(db)
    if key is not None:
        _SEEN[key] = _version(engine)
