"""Dagster's SQLite event log, except that each database file keeps one engine and one open
connection per process.

Dagster's ``SqliteEventLogStorage`` creates an engine (dialect set-up, first-connect checks, an
empty statement cache) and opens and closes a SQLite connection for every use; closing the last
connection of a WAL database also checkpoints it and deletes its ``-wal`` file. A build stores
~100 events, each one or two uses (its run's database, and ``index`` for asset and run-status
events): ~2.5 ms CPU and ~10 ms wall an event, whatever the data size. Here each file gets one
engine per process with a pool of one connection, made on first use and kept (the most recently
used ``ENGINES_KEPT``, so a UI reading many runs holds few files open): ~0.6 ms an event.

Why this is safe: every use is still one transaction under Dagster's ``_db_lock`` (so one thread
at a time uses a connection, which is why it may move between threads), and a pooled connection
is rolled back when returned, so between uses it holds no lock: other processes (the UI, the
daemon, run workers, the CLI) read and write as before, and each transaction sees their commits.
A file is still initialised on its first use by this storage (a run's file is created mid-run).
Connections are closed by ``dispose`` (Dagster's instance calls it), by ``wipe`` before the files
go, on eviction, and at interpreter exit; committed events are durable in the WAL either way.
After a fork the child makes its own engines and never touches (nor closes) the parent's.

``CorpusInstance`` (named in every ``dagster.yaml`` the project ships or writes, and in the
homes made before) puts this storage in place of Dagster's when the instance's event log is the
SQLite one; PostgreSQL (``deploy/dagster.yaml``) is untouched. It overrides the private
``_connect`` of the pinned Dagster version; a test counts the connections a run's events open,
so a Dagster that stops calling it (or a change that stops reusing) fails there.
"""

import atexit
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dagster._core.storage.event_log import SqliteEventLogStorage
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME
from dagster._core.storage.sql import create_engine
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import QueuePool

ENGINES_KEPT = 16  # a UI or daemon process reads many runs' files; a build touches two
_FORKED_AWAY: list[Any] = []  # a parent's engines, kept from being closed in a forked child
_LIVE: "weakref.WeakSet[SharedEngineSqliteEventLogStorage]" = weakref.WeakSet()


class SharedEngineSqliteEventLogStorage(SqliteEventLogStorage):
    """``SqliteEventLogStorage`` with one engine and connection per database file and process."""

    def __init__(self, base_dir: str, inst_data: Any = None) -> None:
        super().__init__(base_dir, inst_data=inst_data)
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._engines_pid = os.getpid()
        self._engines_lock = threading.Lock()
        self._tables_found: set[str] = set()
        _LIVE.add(self)

    def _shard_engine(self, shard: str) -> Engine:
        """This process's engine for ``shard``'s file, made on first use."""
        with self._engines_lock:
            if self._engines_pid != os.getpid():  # a forked child: the parent's are not ours
                _FORKED_AWAY.append(self._engines)
                self._engines, self._engines_pid = OrderedDict(), os.getpid()
            engine = self._engines.get(shard)
            if engine is None:
                engine = create_engine(
                    self.conn_string_for_shard(shard),
                    poolclass=QueuePool,
                    pool_size=2,  # a transaction, and has_table inside it
                    max_overflow=2,
                    connect_args={
                        "timeout": SQLITE_BUSY_TIMEOUT_SECONDS,
                        "check_same_thread": False,  # used under _db_lock, one thread at a time
                    },
                )
                self._engines[shard] = engine
                while len(self._engines) > ENGINES_KEPT:
                    self._engines.popitem(last=False)[1].dispose()
            self._engines.move_to_end(shard)
            return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        """As Dagster's, with the shard's kept engine instead of a new one each time."""
        with self._db_lock:
            engine = self._shard_engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def has_table(self, table_name: str) -> bool:
        """Dagster's asks a new engine of the index file each time (a few times an event); here
        the kept one, and a table once found is remembered (tables are only ever added)."""
        if table_name in self._tables_found:
            return True
        with self._shard_engine(INDEX_SHARD_NAME).connect() as conn:
            found = bool(conn.dialect.has_table(conn, table_name))
        if found:
            self._tables_found.add(table_name)
        return found

    def close_connections(self) -> None:
        """Close this process's connections (they reopen on the next use)."""
        with self._engines_lock:
            if self._engines_pid != os.getpid():  # a forked child: the parent's, left alone
                _FORKED_AWAY.append(self._engines)
                self._engines, self._engines_pid = OrderedDict(), os.getpid()
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()

    def dispose(self) -> None:
        """Dagster's, and this process's connections closed."""
        super().dispose()
        self.close_connections()

    def wipe(self) -> None:
        """Dagster's, which deletes the files: closed first, so none is written after."""
        with self._db_lock:
            self.close_connections()
        super().wipe()


@atexit.register
def close_all_connections() -> None:
    """Close every live storage's connections, so a process leaves checkpointed files (at
    interpreter exit, and from the CLI, which leaves with ``os._exit``)."""
    for storage in list(_LIVE):
        storage.close_connections()


def shared_engine_event_log(event_storage: Any) -> Any:
    """``event_storage``, or the same SQLite event log with shared engines when it is exactly
    Dagster's (not a subclass, nor PostgreSQL's)."""
    if type(event_storage) is not SqliteEventLogStorage:
        return event_storage
    return SharedEngineSqliteEventLogStorage(event_storage._base_dir, event_storage.inst_data)
