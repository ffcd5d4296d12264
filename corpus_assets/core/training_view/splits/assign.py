"""The split assignment: inherit the parent's, hash only new components, resolve conflicts.

Inputs are Arrow tables or SQL over Parquet files (members: record_id, component,
content_key, event_time; parent: record_id, split); everything per record is a join or a
group-by in DuckDB (``view_queries``, spilling), the hash included, and Python loops run only
over conflicts. A leakage component whose members had splits in the parent keeps that split. A
component with no parent member is hashed: ``u(k)`` is the first 8 bytes of
sha256(salt NUL k) scaled to [0, 100) without floats, and ``k`` is the smallest content key
(``dedup_key``) of its members, a name no new edge can change. A component whose parent members
sit in different splits is a conflict (a new edge bridged them); it is always listed and resolved
by ``policies.splits.on_conflict``:

* ``quarantine_new``: the component's records without a parent split are excluded (reason
  ``split.bridge``), parent members keep their splits. With no such record (an edge between two
  old records) the smaller sides move to the largest side's split.
* ``move_smaller``: every member of the smaller sides moves to the largest side's split, new
  records join it.
* ``new_eval_version``: nothing is inherited; every component is hashed again with the salt of
  the next evaluation version (``eval_version`` + 1) and every changed record is a listed move.

The largest side is the split holding most parent members, ties broken by split order. The time
boundary (``time_cutoff``, ``gap``) runs first: see ``splits.by_time``.
"""

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.runtime.config import SplitPolicy
from corpus_assets.core.training_view import view_queries
from corpus_assets.core.training_view.splits.bridges import AnyGraph
from corpus_assets.core.training_view.splits.by_time import time_phase
from corpus_assets.core.training_view.splits.conflicts import Resolution, resolve_conflicts
from corpus_assets.core.training_view.splits.schema import (
    EXCLUDED,
    MOVE_COLUMNS,
    NEW_VERSION,
    SPLIT_TABLE,
    SPLITS,
    UNLINKED,
    Conflict,
    Move,
    move_table,
)

MEMBER_SCHEMA = pa.schema(
    [
        ("record_id", pa.string()),
        ("component", pa.string()),  # the dedup layer's leakage_id
        ("content_key", pa.string()),  # dedup_key: stable however the component grows
        ("event_time", pa.string()),
    ]
)
_BATCH = 65536
# A component's parent splits: 0, 1, or 2 for more than one (only ``sides > 1`` is asked). A
# min and a max per group, not a distinct count: a third of the group-by's time at 470k members;
# of an enum (``_PARENT_SPLIT``, each parent split name an integer), not of strings: the string
# min and max were two thirds of what remained.
_SIDES = "CASE WHEN min(code) IS NULL THEN 0 WHEN min(code) = max(code) THEN 1 ELSE 2 END"
_PARENT_SPLIT = "parent_split_name"  # the enum type of the parent's split names


Source = pa.Table | str  # an Arrow table, or a SQL query over the connection's tables


@dataclass
class Assignment:
    """The members' splits, held by ``con`` as its table ``assigned`` (record_id, split, and
    ``pos`` when the members had it; in no particular order), with the moves (by record_id) and
    conflicts (by component)."""

    con: duckdb.DuckDBPyConnection
    moves: pa.Table  # MOVE_COLUMNS, by record_id
    conflicts: list[Conflict] = field(default_factory=list)
    eval_version: int = 0

    @property
    def table(self) -> pa.Table:
        """record_id, split of every member (for tests and small tables only)."""
        rows = self.con.sql("SELECT record_id, split FROM assigned").to_arrow_table()
        return rows.cast(SPLIT_TABLE)

    def splits_of(self, ids: pa.Array) -> pa.Table:
        """record_id, split of the members among ``ids``."""
        self.con.register("wanted", pa.table({"record_id": ids.cast(pa.string())}))
        sql = "SELECT a.record_id, a.split FROM assigned a JOIN wanted w USING (record_id)"
        rows = self.con.sql(sql).to_arrow_table()
        self.con.unregister("wanted")
        return rows.cast(SPLIT_TABLE)

    @property
    def excluded(self) -> list[str]:
        moves = self.moves
        return moves.filter(pc.equal(moves.column("to"), EXCLUDED)).column("record_id").to_pylist()

    @property
    def unlinked(self) -> list[str]:
        """Removed newcomers that bridged two splits: taken out of the leakage graph."""
        moves = self.moves
        return moves.filter(pc.equal(moves.column("to"), UNLINKED)).column("record_id").to_pylist()

    def as_dict(self) -> dict[str, str]:
        """record id -> split (for tests and small tables only)."""
        table = self.table
        ids, splits = table.column("record_id"), table.column("split")
        return dict(zip(ids.to_pylist(), splits.to_pylist(), strict=True))


def split_of(key: str, policy: SplitPolicy, version: int = 0) -> str:
    return SPLITS[int(split_indices(pa.array([key]), policy, version)[0])]


def split_indices(keys: pa.Array, policy: SplitPolicy, version: int = 0) -> np.ndarray:
    """Per key, 0/1/2 for train/validation/test, hashed a batch at a time."""
    salt = (policy.salt if version == 0 else f"{policy.salt}/eval-{version}").encode() + b"\x00"
    percent = np.empty(len(keys), np.uint8)
    for start in range(0, len(keys), _BATCH):
        batch = keys.slice(start, _BATCH).to_pylist()
        heads = [hashlib.sha256(salt + k.encode()).digest()[:8] for k in batch]
        u = np.frombuffer(b"".join(heads), ">u8")
        percent[start : start + len(batch)] = (u >> np.uint64(32)) * np.uint64(100) >> np.uint64(32)
    cuts = [policy.train_percent, policy.train_percent + policy.validation_percent]
    return np.searchsorted(cuts, percent, side="right").astype(np.int8)


def hash_split_sql(policy: SplitPolicy, version: int = 0, key: str = "key") -> str:
    """``split_indices`` as a SQL expression over the column ``key``: the same split names."""
    salt = (policy.salt if version == 0 else f"{policy.salt}/eval-{version}").encode() + b"\x00"
    head = f"('0x' || substr(sha256(unhex('{salt.hex()}') || encode({key})), 1, 16))::UBIGINT"
    percent = f"((({head}) >> 32) * 100::UBIGINT) >> 32"
    cut = policy.train_percent
    cut2 = cut + policy.validation_percent
    return (
        f"CASE WHEN {percent} < {cut} THEN '{SPLITS[0]}' "
        f"WHEN {percent} < {cut2} THEN '{SPLITS[1]}' ELSE '{SPLITS[2]}' END"
    )


def assign(
    members: Source,
    parent: Source,
    policy: SplitPolicy,
    evidence: Mapping[str, str] | None = None,
    parent_version: int = 0,
    graph: AnyGraph | None = None,
    con: duckdb.DuckDBPyConnection | None = None,
) -> Assignment:
    """Split per member; moves by record id, conflicts by component. ``quarantine_new`` needs
    the ``graph`` to tell which newcomers bridge. ``members`` and ``parent`` are Arrow tables or
    queries over ``con`` (a fresh in-memory database when not given), which holds the result."""
    con = con if con is not None else view_queries.connect()
    evidence = evidence if evidence is not None else {}  # a stored mapping is looked up lazily
    _relation(con, "member_rows", members, MEMBER_SCHEMA)
    _relation(con, "parent_rows", parent, SPLIT_TABLE)
    pos = ", m.pos" if _positioned(con) else ""
    # a member's key is read only where it can name a hashed component: a new member's (every
    # member's when a conflict hashes every component again); the copies of the parent members'
    # 71-character keys were two fifths of this join's time at 470k members
    key = "m.content_key" if policy.on_conflict == "new_eval_version" else _NEW_KEY
    with view_queries.right_built(con):  # the parent's narrow rows hashed, not the members'
        con.execute(
            f"CREATE OR REPLACE TABLE joined AS SELECT m.record_id, m.component, {key} AS "
            f"content_key, m.event_time, p.split AS parent_split{pos} FROM member_rows m "
            "LEFT JOIN parent_rows p ON m.record_id = p.record_id"
        )  # in no particular order: every consumer of a row order sorts
    timed, time_moves, time_conflicts = _time_phase(con, policy, evidence)
    _per_component(con)
    conflicted = con.sql(
        "SELECT component, record_id, parent_split FROM joined "
        "WHERE component IN (SELECT component FROM per WHERE sides > 1)"
    ).to_arrow_table()
    if len(conflicted) and policy.on_conflict == "new_eval_version":
        return _new_version(
            con, conflicted, timed, time_moves, time_conflicts, policy, parent_version, evidence
        )
    near = _parent_near(con, conflicted, policy, graph)
    resolved, moves, conflicts = resolve_conflicts(
        conflicted, near, Resolution(policy, evidence, graph)
    )
    extra = [timed, resolved]
    _calm_splits(con, policy, parent_version, extra, inherit=True, conflicts=len(conflicted) > 0)
    return Assignment(
        con,
        move_table([*time_moves, *moves]),
        sorted([*time_conflicts, *conflicts], key=lambda c: c.component),
        parent_version,
    )


_NEW_KEY = "CASE WHEN p.split IS NULL THEN m.content_key END"


def _per_component(con: duckdb.DuckDBPyConnection) -> None:
    """``per``: each component's smallest new member's key, its parent sides and (with one
    side) the split it inherits. A key is hashed only for a component with no parent member:
    the others' keys are not compared (the min of every member's 71-character key was half the
    group-by's time) nor hashed (the hash of every key was two thirds of ``_calm_splits``' at
    470k members). The sides are compared as enum codes of the parent's split names."""
    con.execute(
        f"DROP TYPE IF EXISTS {_PARENT_SPLIT}; CREATE TYPE {_PARENT_SPLIT} AS ENUM "
        "(SELECT DISTINCT split FROM parent_rows WHERE split IS NOT NULL ORDER BY split)"
    )
    con.execute(
        "CREATE OR REPLACE TABLE per AS SELECT component, "
        "min(content_key) FILTER (WHERE code IS NULL) AS key, "
        f"{_SIDES} AS sides, min(code)::VARCHAR AS inherited FROM (SELECT component, "
        f"content_key, parent_split::{_PARENT_SPLIT} AS code FROM joined) GROUP BY component"
    )


def _positioned(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the members carry ``pos`` (a query over the dedup clusters table: each row's
    position there), which ``assigned`` then keeps: the layer's later joins with that table
    are on integers, not record ids."""
    return "pos" in con.sql("FROM member_rows LIMIT 0").columns


def _relation(con: duckdb.DuckDBPyConnection, name: str, rows: Source, schema: pa.Schema) -> None:
    """``name``: a view of an Arrow table (cast to ``schema``) or of a query."""
    if isinstance(rows, str):
        con.execute(f"CREATE OR REPLACE VIEW {name} AS {rows}")
        return
    con.register(f"{name}_arrow", rows.select(schema.names).cast(schema))
    con.execute(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM {name}_arrow")


def _time_phase(
    con: duckdb.DuckDBPyConnection, policy: SplitPolicy, evidence: Mapping[str, str]
) -> tuple[pa.Table, list[Move], list[Conflict]]:
    """The time boundary (``splits.by_time``) over ``joined``, which keeps the members left for the
    other rules. With a cutoff the members are read into Arrow (one narrow table)."""
    if policy.time_cutoff is None:
        return SPLIT_TABLE.empty_table(), [], []
    joined = con.table("joined").to_arrow_table()
    timed, kept, moves, conflicts = time_phase(joined, policy, evidence)
    del joined
    con.register("kept_arrow", kept)
    con.execute("CREATE OR REPLACE TABLE joined AS SELECT * FROM kept_arrow")
    con.unregister("kept_arrow")
    return timed.cast(SPLIT_TABLE), moves, conflicts


def _parent_near(
    con: duckdb.DuckDBPyConnection,
    conflicted: pa.Table,
    policy: SplitPolicy,
    graph: AnyGraph | None,
) -> pa.Table:
    """The parent splits of the records (kept or removed) of the conflicted components: all
    ``splits.bridges`` reads of the parent."""
    if not len(conflicted) or policy.on_conflict != "quarantine_new" or graph is None:
        return SPLIT_TABLE.empty_table()
    names = pc.unique(conflicted["component"].combine_chunks())
    ids = graph.within(names).clusters["record_id"].combine_chunks().cast(pa.string())
    con.register("near_ids", pa.table({"record_id": ids}))
    near = con.sql(
        "SELECT p.record_id, p.split FROM parent_rows p JOIN near_ids n USING (record_id)"
    ).to_arrow_table()
    con.unregister("near_ids")
    return near.cast(SPLIT_TABLE)


def _calm_splits(
    con: duckdb.DuckDBPyConnection,
    policy: SplitPolicy,
    version: int,
    extra: list[pa.Table],
    inherit: bool,
    conflicts: bool = False,
) -> None:
    """``assigned``: members of components with at most one parent split (``conflicts``: some
    have more), inherited (when ``inherit``) or hashed by key, then the ``extra`` (record_id,
    split) rows. The hash runs only where nothing is inherited."""
    positioned = _positioned(con)
    pos = ", j.pos" * positioned
    hashed = hash_split_sql(policy, version)
    if inherit:
        _inherited(con, hashed, pos, conflicts)
    else:
        con.execute(
            f"CREATE OR REPLACE TABLE assigned AS SELECT j.record_id, t.split{pos} FROM joined j "
            f"JOIN (SELECT component, {hashed} AS split FROM per) t ON j.component = t.component"
        )
    # the extra rows' positions by record id (only when there are any: conflicts, a cutoff)
    insert = (
        "SELECT e.record_id, e.split, m.pos FROM extra_rows e "
        "LEFT JOIN member_rows m ON e.record_id = m.record_id"
        if positioned
        else "SELECT record_id, split FROM extra_rows"
    )
    for rows in extra:
        if len(rows):
            con.register("extra_rows", rows.cast(SPLIT_TABLE))
            con.execute(f"INSERT INTO assigned {insert}")
            con.unregister("extra_rows")


def _inherited(con: duckdb.DuckDBPyConnection, hashed: str, pos: str, conflicts: bool) -> None:
    """``assigned`` of the calm components: a parent member keeps its parent split (its calm
    component's only one), so only the new members look their component up (a join of every
    member on its component's name was most of this query's time at 470k members). As by a
    join on the component, a member without one is in no split. Only the components with a
    new member are looked up (every component's name hashed, for a child's few new members,
    was a fifth of the query)."""
    calm = "j.component IS NOT NULL"
    if conflicts:  # the members of a component with two parent sides are placed elsewhere
        calm += (
            " AND j.component NOT IN "
            "(SELECT component FROM per WHERE sides > 1 AND component IS NOT NULL)"
        )
    target = f"CASE WHEN inherited IS NULL THEN {hashed} ELSE inherited END"
    con.execute(
        "CREATE OR REPLACE TABLE assigned AS SELECT j.record_id, "
        f"CASE WHEN j.parent_split IS NULL THEN t.split ELSE j.parent_split END AS split{pos} "
        f"FROM joined j LEFT JOIN (SELECT component, {target} AS split FROM per "
        "WHERE sides <= 1 AND component IN (SELECT component FROM joined "
        "WHERE parent_split IS NULL)) t ON j.component = t.component AND j.parent_split IS NULL "
        f"WHERE {calm}"
    )


def _new_version(
    con: duckdb.DuckDBPyConnection,
    conflicted: pa.Table,
    timed: pa.Table,
    time_moves: list[Move],
    time_conflicts: list[Conflict],
    policy: SplitPolicy,
    parent_version: int,
    evidence: Mapping[str, str],
) -> Assignment:
    """Every component hashed again under the next evaluation version; changes are moves."""
    version = parent_version + 1
    listing = Resolution(policy.model_copy(update={"on_conflict": "move_smaller"}), evidence, None)
    _, _, found = resolve_conflicts(conflicted, pa.table({}), listing)
    conflicts = [replace(c, resolution="new_eval_version") for c in found]
    con.execute(  # every component hashed: by the smallest key of all its members
        "CREATE OR REPLACE TABLE per AS SELECT component, min(content_key) AS key FROM joined "
        "GROUP BY component"
    )
    _calm_splits(con, policy, version, [timed], inherit=False)
    changed = con.sql(
        "SELECT j.record_id, j.parent_split, a.split FROM joined j "
        "JOIN assigned a ON j.record_id = a.record_id "
        "WHERE j.parent_split IS NOT NULL AND j.parent_split <> a.split ORDER BY j.record_id"
    ).to_arrow_table()
    n = len(changed)
    moves = pa.table(
        {
            "record_id": changed["record_id"],
            "from": changed["parent_split"],
            "to": changed["split"],
            "reason": pa.repeat(pa.scalar(NEW_VERSION), n),
            "evidence": pa.repeat(pa.scalar(f"eval version {version}"), n),
        },
        schema=MOVE_COLUMNS,
    )
    all_moves = pa.concat_tables([move_table(time_moves), moves]).sort_by("record_id")
    ordered = sorted([*time_conflicts, *conflicts], key=lambda c: c.component)
    return Assignment(con, all_moves, ordered, version)
