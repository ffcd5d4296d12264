"""The catalog: one SQLAlchemy Core schema on SQLite or PostgreSQL (``CORPUS_CATALOG_URL``).

It holds the facts that must be shared and linearisable across workers: freezes, per-layer output
digests, chunk tasks, snapshot states and the alias gate row. Bulk data never lives here; it is in
the CAS and the catalog points at it by digest.
"""

import errno
import fcntl
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Engine,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import IntegrityError
from sqlalchemy.schema import CreateColumn

from corpus_assets.core.storage import schema_seen
from corpus_assets.core.storage.fsio import disk_full

metadata = MetaData()

freezes = Table(
    "freezes",
    metadata,
    Column("partition_key", String(64), primary_key=True),
    Column("spec_digest", String(71), nullable=False),
    Column("fingerprint", String(71), nullable=False),
    Column("created_at", Float, nullable=False),
)

layer_outputs = Table(
    "layer_outputs",
    metadata,
    Column("partition_key", String(64), primary_key=True),
    Column("layer", String(32), primary_key=True),
    Column("index_digest", String(71), nullable=False),
    Column("code_version", String(200), nullable=False),
    Column("updated_at", Float, nullable=False),
)

# A layer's inputs (see ``core.pipeline``) -> the index it produced, for unchanged snapshots.
layer_memo = Table(
    "layer_memo",
    metadata,
    Column("memo_key", String(71), primary_key=True),
    Column("layer", String(32), nullable=False),
    Column("index_digest", String(71), nullable=False),
    Column("result", Text, nullable=False),  # the LayerResult's JSON, minus run-only stats
    Column("created_at", Float, nullable=False),
)

# A CAS object's file as it was when its bytes last hashed to its name (``storage.trust``).
verified_files = Table(
    "verified_files",
    metadata,
    Column("digest", String(71), primary_key=True),
    Column("file_stat", String(200), nullable=False),  # size:mtime_ns:ctime_ns:inode:device
    Column("verified_at", Float, nullable=False),
)

# The passing outcome of the content rules for one rule-set key (``publication.gate_memo``).
gate_results = Table(
    "gate_results",
    metadata,
    Column("gate_key", String(71), primary_key=True),
    Column("manifest_digest", String(71), nullable=False),
    Column("metrics", Text, nullable=False),  # the content rules' gate metrics, JSON
    Column("created_at", Float, nullable=False),
)

chunk_tasks = Table(
    "chunk_tasks",
    metadata,
    Column("layer", String(32), primary_key=True),
    Column("chunk_key", String(200), primary_key=True),
    Column("input_digest", String(71), primary_key=True),
    Column("code_version", String(200), primary_key=True),  # name@sha256:<hex>
    Column("status", String(10), nullable=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("owner", String(128)),
    Column("heartbeat_at", Float),
    Column("last_error", Text),
    Column("output_digest", String(71)),
    Column("output_size", BigInteger),
    Column("dead_letter", Boolean, nullable=False, default=False),
    Column("updated_at", Float, nullable=False),
)

snapshots = Table(
    "snapshots",
    metadata,
    Column("snapshot_id", String(71), primary_key=True),
    Column("partition_key", String(64), nullable=False, index=True),
    Column("manifest_digest", String(71), nullable=False),
    Column("build_id", String(71), index=True),
    Column("alias", String(64), nullable=False),
    Column("state", String(12), nullable=False),
    Column("approved_by", String(128)),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

snapshot_events = Table(
    "snapshot_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("snapshot_id", String(71), nullable=False, index=True),
    Column("from_state", String(12)),
    Column("to_state", String(12), nullable=False),
    Column("actor", String(128), nullable=False),
    Column("detail", Text),
    Column("at", Float, nullable=False),
)

gate = Table(
    "gate",
    metadata,
    Column("alias", String(64), primary_key=True),
    Column("tombstone_watermark", BigInteger, nullable=False),
    Column("benchmark_fence", BigInteger, nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("active_snapshot", String(71)),
    Column("updated_at", Float, nullable=False),
)

alias_history = Table(
    "alias_history",
    metadata,
    Column("alias", String(64), primary_key=True),
    Column("generation", BigInteger, primary_key=True),
    Column("snapshot_id", String(71), nullable=False),
    Column("at", Float, nullable=False),
)

tombstones = Table(
    "tombstones",
    metadata,
    Column(
        "seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("kind", String(16), nullable=False, default="record"),  # record | object | group
    Column("record_id", String(512), nullable=False),  # the revoked record id, object or group
    Column("reason", Text, nullable=False),
    Column("at", Float, nullable=False),
    # the log (``governance.tombstones``): "add" revokes, "lift" withdraws the add row ``lifts``
    Column("action", String(8), nullable=False, server_default="add"),
    Column("lifts", BigInteger, nullable=True),
    Column("actor", String(128), nullable=True),  # who lifted (or revoked) it, if known
)

benchmark_items = Table(
    "benchmark_items",
    metadata,
    Column(
        "seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("benchmark", String(128), nullable=False),
    Column("item_id", String(256), nullable=False),
    Column("text_digest", String(71), nullable=False),  # the item's text, in the CAS
    Column("dedup_key", String(71), nullable=False, index=True),  # dedup-normalised text digest
    Column("at", Float, nullable=False),
    # the registry is a log (``governance.benchmarks``): "add" registers, "remove" withdraws
    Column("action", String(8), nullable=False, default="add"),
    Column("actor", String(128)),  # who removed (or registered) it, if known
    Index("benchmark_items_by_item", "item_id", "seq"),
)

permits = Table(
    "permits",
    metadata,
    Column("permit_id", String(71), primary_key=True),
    Column("run_id", String(200), nullable=False, unique=True),
    Column("snapshot_id", String(71), nullable=False, index=True),
    Column("alias", String(64)),
    Column("purpose", String(128), nullable=False),
    Column("tombstone_watermark", BigInteger, nullable=False),
    Column("benchmark_fence", BigInteger, nullable=False),
    Column("generation", BigInteger),
    Column("at", Float, nullable=False),
)

# The signing key ids an alias's readers accept (``publication.trust_root``): the key of the alias's
# first verified snapshot, then only what ``corpus-assets trust add|rotate`` records.
alias_keys = Table(
    "alias_keys",
    metadata,
    Column("alias", String(64), primary_key=True),
    Column("keyid", String(64), primary_key=True),
    Column("how", Text, nullable=False),
    Column("at", Float, nullable=False),
)


def default_catalog_url(home: Path) -> str:
    return os.environ.get("CORPUS_CATALOG_URL") or f"sqlite:///{home / 'catalog.sqlite'}"


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=FULL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _full_disk_named(path: str) -> Callable[[ExceptionContext], None]:
    """SQLite's "database or disk is full" becomes the ``DiskFullError`` every other write in
    the data home raises, naming the catalog file: its transaction rolled back, so a rerun with
    space resumes from what was committed."""

    def handle(context: ExceptionContext) -> None:
        code = getattr(context.original_exception, "sqlite_errorcode", None)
        if code == sqlite3.SQLITE_FULL:
            raise disk_full(OSError(errno.ENOSPC, "disk full"), f"the catalog {path}")

    return handle


class LayerConflict(RuntimeError):
    """A layer rebuilt with the same code and inputs produced different bytes."""


SCHEMA_LOCK = 0x636F72707573  # the advisory lock creating the schema holds ("corpus")


@contextmanager
def _schema_lock(path: Path | None) -> Iterator[None]:
    """Processes opening a fresh SQLite catalog at once create its tables one at a time:
    SQLite's DDL is not transactional here, so two ``create_all`` would both see a table
    missing (PostgreSQL takes an advisory lock instead)."""
    if path is None:
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _add_missing_columns(conn: Connection) -> None:
    """A catalog created by an earlier version gets the columns added since, with their
    defaults (``create_all`` creates missing tables only). Only nullable or server-defaulted
    columns are ever added to an existing table, so old rows keep their meaning."""
    inspector = inspect(conn)
    existing_tables = set(inspector.get_table_names())
    for table in metadata.sorted_tables:
        if table.name not in existing_tables:
            continue
        present = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            ddl = CreateColumn(column).compile(dialect=conn.dialect)
            conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {ddl}"))


class Catalog:
    """Engine plus schema; modules that own a concept (tasks, states, gate) query through it."""

    def __init__(self, url: str) -> None:
        self.url = url
        lock: Path | None = None
        db: Path | None = None  # the SQLite file, if any
        if url.startswith("sqlite"):
            path = url.split("///", 1)[-1]
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                lock, db = Path(path + ".schema-lock"), Path(path)
            self.engine: Engine = create_engine(url, connect_args={"timeout": 30})
            event.listen(self.engine, "connect", _sqlite_pragmas)
            event.listen(self.engine, "handle_error", _full_disk_named(path))
        else:
            self.engine = create_engine(url, pool_pre_ping=True)
        if db is not None and schema_seen.current(self.engine, db):
            return
        with _schema_lock(lock), self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # processes opening a fresh catalog at once
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK})
            metadata.create_all(conn)
            _add_missing_columns(conn)
        if db is not None:
            schema_seen.remember(self.engine, db)

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        with self.engine.begin() as connection:
            yield connection

    def dispose(self) -> None:
        self.engine.dispose()

    # freezes -------------------------------------------------------------------------------
    def freeze_digest(self, partition_key: str) -> str | None:
        with self.begin() as conn:
            return conn.scalar(
                select(freezes.c.spec_digest).where(freezes.c.partition_key == partition_key)
            )

    def record_freeze(self, partition_key: str, spec_digest: str, fingerprint: str) -> str:
        """Write the freeze once; a concurrent or repeated writer gets the first one back."""
        try:
            with self.begin() as conn:
                conn.execute(
                    insert(freezes).values(
                        partition_key=partition_key,
                        spec_digest=spec_digest,
                        fingerprint=fingerprint,
                        created_at=time.time(),
                    )
                )
            return spec_digest
        except IntegrityError:
            existing = self.freeze_digest(partition_key)
            assert existing is not None
            return existing

    def latest_freeze(self) -> dict[str, Any] | None:
        with self.begin() as conn:
            row = (
                conn.execute(select(freezes).order_by(freezes.c.created_at.desc()).limit(1))
                .mappings()
                .first()
            )
            return dict(row) if row else None

    def previous_freeze(self, partition_key: str) -> str | None:
        """The spec digest of the freeze recorded just before ``partition_key``'s, if any."""
        with self.begin() as conn:
            created = conn.scalar(
                select(freezes.c.created_at).where(freezes.c.partition_key == partition_key)
            )
            if created is None:
                return None
            return conn.scalar(
                select(freezes.c.spec_digest)
                .where(freezes.c.created_at < created)
                .order_by(freezes.c.created_at.desc())
                .limit(1)
            )

    def partition_keys(self) -> list[str]:
        with self.begin() as conn:
            return list(
                conn.scalars(select(freezes.c.partition_key).order_by(freezes.c.created_at))
            )

    # layer outputs -------------------------------------------------------------------------
    def set_layer_output(self, partition_key: str, layer: str, digest: str, code: str) -> None:
        """Record a layer's index; the same code producing other bytes is refused, not overwritten.

        ``code`` is the layer's build spec (code, transform image, policy, inputs): the same spec
        must give the same bytes. A different spec is a new build of the partition and may
        replace the pointer (the old index stays in the CAS); a ``~partial`` one may be retried.
        """
        now = time.time()
        with self.begin() as conn:
            row = conn.execute(
                select(layer_outputs.c.index_digest, layer_outputs.c.code_version)
                .where(layer_outputs.c.partition_key == partition_key)
                .where(layer_outputs.c.layer == layer)
            ).first()
            if row is None:
                conn.execute(
                    insert(layer_outputs).values(
                        partition_key=partition_key,
                        layer=layer,
                        index_digest=digest,
                        code_version=code,
                        updated_at=now,
                    )
                )
            elif (
                row.code_version == code
                and not code.endswith("~partial")
                and row.index_digest != digest
            ):
                raise LayerConflict(
                    f"{layer} of partition {partition_key!r} was {row.index_digest} and the same "
                    f"code ({code}) now gives {digest}: nondeterministic output, not overwritten"
                )
            elif row.index_digest != digest or row.code_version != code:
                conn.execute(
                    update(layer_outputs)
                    .where(layer_outputs.c.partition_key == partition_key)
                    .where(layer_outputs.c.layer == layer)
                    .values(index_digest=digest, code_version=code, updated_at=now)
                )

    def memo(self, key: str) -> tuple[str, str] | None:
        """(index digest, result JSON) of the layer build whose inputs digest to ``key``."""
        with self.begin() as conn:
            row = conn.execute(
                select(layer_memo.c.index_digest, layer_memo.c.result).where(
                    layer_memo.c.memo_key == key
                )
            ).first()
        return None if row is None else (row.index_digest, row.result)

    def remember(self, key: str, layer: str, digest: str, result: str) -> None:
        """Record a finished layer build; the first one for a key stays (same key, same bytes)."""
        self.insert_once(layer_memo, memo_key=key, layer=layer, index_digest=digest, result=result)

    def insert_once(self, table: Table, **values: Any) -> None:
        """Insert a row stamped ``created_at`` unless its key is taken: for memo tables, where
        the first writer's row stands for every later one (same key, same content)."""
        try:
            with self.begin() as conn:
                conn.execute(insert(table).values(**values, created_at=time.time()))
        except IntegrityError:
            pass

    def layer_output(self, partition_key: str, layer: str) -> str | None:
        with self.begin() as conn:
            return conn.scalar(
                select(layer_outputs.c.index_digest)
                .where(layer_outputs.c.partition_key == partition_key)
                .where(layer_outputs.c.layer == layer)
            )
