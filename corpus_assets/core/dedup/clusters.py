"""One verdict per canonical record: exact dedup, then near-dedup, then leakage groups.

Verdicts: ``excluded`` (revoked by a tombstone, or a record id already used at an earlier row:
``duplicate record_id`` for the same text, ``id.conflict`` for another), ``exact_duplicate``
(its dedup key equals an earlier record's), ``near_duplicate`` (the deletion scan: it directly
reaches the threshold with a *kept* record; ``match_id`` / ``match_jaccard`` are that evidence)
or ``keep``. ``representative_id`` is the kept record that stands for a removed one;
``leakage_id`` names the component over group ids, exact clusters and verified near edges (its
smallest group id). Everything per record is a numpy vector of integers
decided over :class:`~.partition_db.PartitionDb` codes; the strings come back only when DuckDB
joins the decisions to the records for the output tables. Python loops run only over repeated
record ids and tombstoned rows.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.dedup.coding import Coding, DriverCoding, exclusions
from corpus_assets.core.dedup.near_stage import NearStage
from corpus_assets.core.dedup.order import code_dtype, sorted_hits
from corpus_assets.core.dedup.output_order import TablePositions, bucket, sorted_batches
from corpus_assets.core.dedup.partition_db import (
    MEMORY_LIMIT,
    OUTPUT_MEMORY_LIMIT,
    PartitionDb,
)
from corpus_assets.core.dedup.report import NearReport
from corpus_assets.core.dedup.row_values import Leakage
from corpus_assets.core.dedup.verdicts import (
    EXACT_CODE,
    EXCLUDED_CODE,
    NEAR_CODE,
    VERDICTS,
    EdgeRows,
    Verdicts,
)
from corpus_assets.core.storage.cas_queries import sql_path

CLUSTER_COLUMNS = pa.schema(
    [
        ("record_id", pa.string()),
        ("source_id", pa.string()),
        ("object", pa.string()),
        ("line", pa.int64()),
        ("group_id", pa.string()),
        ("dedup_key", pa.string()),
        ("verdict", pa.string()),
        ("representative_id", pa.string()),
        ("is_representative", pa.bool_()),
        ("match_id", pa.string()),
        ("match_jaccard", pa.float64()),
        ("leakage_id", pa.string()),
        ("excluded", pa.string()),
    ]
)
# The columns of a canonical record that the dedup table carries over unchanged.
CARRIED = ["record_id", "source_id", "object", "line", "group_id", "dedup_key"]
_T = TypeVar("_T")


@dataclass
class Decided:
    """Every verdict of a run, by row, plus what the output tables and counts are made of."""

    n: int  # rows
    per_source: dict[str, dict[str, int]]  # verdict counts by source
    state: Verdicts
    excluded: dict[int, str]  # row -> reason, only excluded rows
    edges: EdgeRows  # why rows are joined: copies (in total order), then verified near pairs
    # per row (``code_dtype``): a row of the group naming its leakage group; and how many
    leakage: Leakage
    # per row: its position in the clusters table (chunk parts in order) from its rank by
    # record id, object, line, row (the total order's last keys: ``positions.rank``)
    positions: TablePositions
    report: NearReport | None

    def take_edges(self) -> EdgeRows:
        """The edges, handed over: this object no longer holds them (O(edges) arrays the
        output phases need only once)."""
        edges = self.edges
        empty = np.empty(0, dtype=edges.a.dtype)
        self.edges = EdgeRows(empty, empty, 0, np.empty(0, dtype=np.float64))
        return edges


class Decisions(NamedTuple):
    """The verdicts by row in a Parquet file, and the exclusion reasons their codes name."""

    path: Path
    reasons: pa.Array


def decide(
    db: PartitionDb,
    source_order: dict[str, int],
    revoked: dict[int, str] | None = None,
    near: NearStage | None = None,
    coding: Coding | None = None,
    chunk_starts: np.ndarray | None = None,
) -> Decided:
    """Exclusions, exact dedup, near-dedup and leakage groups over the codes of ``db``
    (``coding``: where the codes, repeated ids and exact copies come from; the driver's
    sorts by default; ``chunk_starts``: each canonical chunk's first row, whose rows make
    one part of the clusters table)."""
    content_of = near.content_of if near is not None else None
    coding = coding if coding is not None else DriverCoding(None, source_order, content_of)
    codes = coding.codes(db)
    state = Verdicts(codes.n)
    excluded = exclusions(db, coding.repeated(codes), dict(revoked or {}))
    excluded_rows = np.fromiter(sorted(excluded), dtype=np.int64, count=len(excluded))
    state.set(excluded_rows, EXCLUDED_CODE)
    exact = coding.exact(db, codes, excluded_rows)
    del excluded_rows
    copies, classes = exact.copies, exact.classes
    state.set(copies, EXACT_CODE, exact.match)  # Jaccard 1.0
    del exact  # its matches are in the verdicts, its classes handed to the near stage
    codes.forget("record_id", "dedup_key")
    report = None
    near_x = near_y = np.empty(0, dtype=np.int64)
    near_j = np.empty(0, dtype=np.float64)
    if near is not None:
        report = near.run(classes)
        near_x, near_y, near_j = near.edge_arrays()
        rows, match, jaccard = near.match_arrays()
        state.set(rows, NEAR_CODE, match)
        state.jaccard.set_near(rows, jaccard)
    per_source = coding.per_source(codes, state)  # final
    codes.forget("source_id", "kind")
    dtype = code_dtype(codes.n)
    a = np.concatenate([copies, near_x], dtype=dtype)
    b = np.concatenate([state.match(copies), near_y], dtype=dtype)
    edges = EdgeRows(a, b, len(copies), near_j)
    del copies, near_x, near_y
    leakage = coding.leakage(codes, a, b)
    codes.forget("group_id")
    positions = TablePositions(coding.rank_rows(db, codes), chunk_starts)
    return Decided(codes.n, per_source, state, excluded, edges, leakage, positions, report)


class _Reasons:
    """The exclusion reasons as codes into their distinct values (code 0 is ""), looked up for
    any rows: held for the excluded rows only (a code per row was 4 bytes a record)."""

    def __init__(self, excluded: dict[int, str]) -> None:
        values = sorted(set(excluded.values()))
        code_of = {v: k + 1 for k, v in enumerate(values)}
        rows = np.fromiter(excluded, dtype=np.int64, count=len(excluded))
        codes = np.fromiter((code_of[v] for v in excluded.values()), np.int32, len(excluded))
        by_row = np.argsort(rows)  # no list of the rows, sorted or looked up
        self.rows, self.codes = rows[by_row], codes[by_row]
        self.values = pa.array(["", *values], pa.string())

    def at(self, rows: np.ndarray) -> np.ndarray:
        """Each of ``rows``' reason code (0: not excluded)."""
        at, hit = sorted_hits(self.rows, rows)
        codes = np.zeros(len(rows), dtype=np.int32)
        codes[hit] = self.codes[at[hit]]
        return codes


def _verdict_names() -> pa.Table:
    """Code -> verdict name, built when used: ``pa.array`` of a list imports pandas when it is
    installed, which would cost every CLI command ~0.3 s at import."""
    codes = pa.array(range(len(VERDICTS)), pa.int8())
    return pa.table({"code": codes, "name": pa.array(VERDICTS, pa.string())})


# One join at a time into spillable temp tables, then the rows into a file in any order with
# their position (output_order sorts them): DuckDB never holds more than one hash table of ids
# at once, and never sorts the wide rows.
_CLUSTERS_SQL = """
CREATE TEMP TABLE ids AS SELECT {ids_columns} FROM {source}{ids_filter};
CREATE TEMP TABLE d1 AS SELECT v.*, p.record_id AS rep_id FROM decided v
  LEFT JOIN ids p ON p.row = v.rep;
CREATE TEMP TABLE d2 AS SELECT d1.*, q.record_id AS match_id FROM d1
  LEFT JOIN ids q ON q.row = d1.match;
DROP TABLE d1;
CREATE TEMP TABLE d3 AS SELECT d2.row, d2.verdict, d2.jaccard, d2.reason, d2.rep_id, d2.match_id,
  d2.pos, g.group_id AS leakage_id FROM d2 JOIN ids g ON g.row = d2.leak;
DROP TABLE d2;
{drop_ids}
COPY (
  SELECT r.record_id, r.source_id, r.object, r.line, r.group_id, r.dedup_key,
    n.name AS verdict, coalesce(d.rep_id, '') AS representative_id,
    d.verdict = 0 AS is_representative, coalesce(d.match_id, '') AS match_id,
    d.jaccard AS match_jaccard, d.leakage_id, x.reason AS excluded, d.pos
  FROM {rows} r JOIN d3 d USING (row)
  JOIN verdict_names n ON n.code = d.verdict
  JOIN reasons x ON x.code = d.reason
) TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 16384);
DROP TABLE d3;
DROP TABLE IF EXISTS ids;
"""
# With few decisions, the ids of every row they name come from the files holding those rows,
# the wide rows only from the files holding the decided rows (a child's: its new chunks).
_FEW_IDS = (
    " WHERE row IN (SELECT row FROM decided UNION SELECT rep FROM decided"
    " UNION SELECT match FROM decided UNION SELECT leak FROM decided)"
)
_FULL_SQL = {
    "ids_columns": "row, record_id, group_id",
    "ids_filter": "",
    "drop_ids": "DROP TABLE ids;",
    "rows": "recs",
    "source": "recs",
}
_FEW_SQL = {"ids_columns": "row, record_id, group_id", "ids_filter": _FEW_IDS}


def write_decisions(
    decided: Decided, directory: Path, rows: int = 1 << 16, only: np.ndarray | None = None
) -> Decisions:
    """The verdicts by row (of ``only`` when given, ascending) written to a Parquet file a
    slice at a time, so the per-row arrays can be dropped before DuckDB joins and sorts the
    output (its buffers grow with the partition up to their limit; the arrays would sit under
    that)."""
    reasons = _Reasons(decided.excluded)
    state, n = decided.state, decided.n
    count = n if only is None else len(only)
    path = directory / "decisions.parquet"
    with pq.ParquetWriter(path, _DECISIONS, compression="none") as writer:
        for lo in range(0, count, rows):
            hi = min(lo + rows, count)
            looked = state.span(lo, hi) if only is None else state.look(only[lo:hi])
            at = looked.rows
            if only is None:
                pos, leak = decided.positions.span(lo, hi), decided.leakage.rows.span(lo, hi)
            else:
                pos, leak = decided.positions.of(at), decided.leakage.rows.of(at)
            match, reps = looked.match, state.representatives(looked)
            columns = {
                "row": at,
                "verdict": looked.verdict,
                "rep": pa.array(reps, mask=reps < 0),
                "match": pa.array(match, mask=match < 0),
                "jaccard": pa.array(state.jaccard.of(looked), mask=match < 0),
                "leak": leak,
                "reason": reasons.at(at),
                "pos": pos,
            }
            writer.write_table(pa.table(columns, schema=_DECISIONS), row_group_size=rows)
    return Decisions(path, reasons.values)


_DECISIONS = pa.schema(
    [
        ("row", pa.int64()),
        ("verdict", pa.int8()),
        ("rep", pa.int64()),
        ("match", pa.int64()),
        ("jaccard", pa.float64()),
        ("leak", pa.int64()),
        ("reason", pa.int32()),
        ("pos", pa.int64()),
    ]
)


def join_clusters(
    db: PartitionDb,
    decisions: Decisions,
    directory: Path,
    few: tuple[np.ndarray, np.ndarray] | None = None,
) -> Path:
    """The dedup table's rows, in any order with their ``pos``, joined into a Parquet file by
    DuckDB (the joins spill as needed), so the connection can go before the table is sorted
    (:func:`cluster_batches`) and written. ``few``: the decisions are a few rows (the first
    array, ascending) and the second is every row they name (ascending), so only those are
    gathered: their ids from the files holding them, the decided rows' columns from theirs."""
    reasons = decisions.reasons
    db.con.execute(
        f"CREATE TEMP VIEW decided AS SELECT * FROM read_parquet({sql_path(str(decisions.path))})"
    )
    db.register(
        "reasons", pa.table({"code": pa.array(range(len(reasons)), pa.int32()), "reason": reasons})
    )
    db.register("verdict_names", _verdict_names())
    path = directory / "clusters-unsorted.parquet"
    try:
        sql = _CLUSTERS_SQL.replace("{path}", str(path).replace("'", "''"))
        parts = _FULL_SQL
        if few is not None:
            rows = {"rows": db.recs_of(few[0]), "source": db.recs_of(few[1])}
            parts = {**_FULL_SQL, **_FEW_SQL, **rows}
        for name, value in parts.items():
            sql = sql.replace("{" + name + "}", value)
        output_query(db, lambda: db.con.execute(sql))
    finally:
        for name in ("reasons", "verdict_names"):
            db.unregister(name)
        db.con.execute("DROP VIEW decided")
    return path


def output_query(db: PartitionDb, run: Callable[[], _T]) -> _T:
    """``run`` at the output limit on one thread; if DuckDB still runs out of memory (a hash
    join partition must fit at once), once more from scratch at the coding limit on every
    thread: the rows are the same either way."""
    import duckdb

    db.limit(OUTPUT_MEMORY_LIMIT, 1)
    try:
        return run()
    except duckdb.OutOfMemoryException:
        db.con.execute(";".join(f"DROP TABLE IF EXISTS {t}" for t in ("ids", "d1", "d2", "d3")))
        db.flush()
        db.limit(MEMORY_LIMIT, db.workers)
        return run()


def cluster_batches(unsorted: Path) -> Iterator[pa.RecordBatch]:
    """The dedup table in its order, a batch at a time, as CLUSTER_COLUMNS: the joined rows
    bucketed by position next to their file, each bucket sorted as it is read."""
    buckets = bucket(unsorted, unsorted.parent)
    unsorted.unlink()
    yield from sorted_batches(buckets, CLUSTER_COLUMNS)
