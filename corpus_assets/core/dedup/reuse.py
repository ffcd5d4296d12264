"""A child's clusters table from its parent's: rows whose decisions did not change are copied.

Joining every record's strings to its verdict costs a third of a child's dedup at 685k records,
yet a +1% child changes few rows. The layer stores its per-row decisions (``decisions``: verdict,
representative, match and leakage rows, Jaccard, exclusion reason, table position). A child
whose parent ran the same code and policy maps rows of the canonical chunks both list (same
records digest: same columns, line for line) onto the parent's rows; a mapped row whose
verdict, Jaccard and reason are equal and whose representative, match and leakage rows map onto
the child's own is the parent's row, byte for byte. Those rows stream from the parent's table
(in its order, which is theirs: same strings, rows in the same relative order); only the rest
is joined, and the two streams are merged by output position. When anything does not line up
(no parent, parent without decisions, an order that differs) the whole table is joined.
"""

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.dedup.clusters import representatives_at
from corpus_assets.core.dedup.pair_cache import INCREMENTAL, Mode
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import Ref
from corpus_assets.core.storage.cas_queries import streamed
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.digests import json_digest
from corpus_assets.core.storage.parquet_sink import ROW_GROUP_ROWS, put_table_batches
from corpus_assets.core.storage.table_lookup import TrustedFiles

DECISION_COLUMNS = pa.schema(
    [
        ("verdict", pa.int8()),
        ("rep", pa.int64()),  # -1: none (excluded)
        ("match", pa.int64()),  # -1: none
        ("jaccard", pa.float64()),  # nan without a match
        ("leak", pa.int64()),
        ("reason", pa.string()),  # "" unless excluded
        ("pos", pa.int64()),
    ]
)
_GONE = -2  # a parent row the child does not have (never equal to a child row or to -1)
CHANGED = "dedup.changed_chunks"  # memo rows: the chunks whose clusters rows a child joined
BATCH_ROWS = 1 << 16
MERGE_ROWS = ROW_GROUP_ROWS  # rows merged at a time: one row group of the table written


@dataclass
class RowDecisions:
    """What the child decided, by row, in the decisions table's terms."""

    verdict: np.ndarray
    match: np.ndarray
    jaccard: np.ndarray
    leak: np.ndarray
    pos: np.ndarray
    excluded: dict[int, str]
    excluded_rows: np.ndarray = field(init=False)  # the keys of ``excluded``, ascending

    def __post_init__(self) -> None:
        rows = sorted(self.excluded)
        self.excluded_rows = np.asarray(rows, dtype=np.int64)

    def reasons(self, lo: int, hi: int) -> pa.Array:
        """The exclusion reason of rows lo..hi-1 ("" for most), without a loop over them."""
        a, b = np.searchsorted(self.excluded_rows, [lo, hi])
        at = self.excluded_rows[a:b]
        codes = np.zeros(hi - lo, dtype=np.int32)
        codes[at - lo] = np.arange(1, len(at) + 1, dtype=np.int32)
        values = pa.array(["", *(self.excluded[r] for r in at.tolist())], pa.string())
        return pa.DictionaryArray.from_arrays(codes, values).cast(pa.string())

    def named(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` and every row their decisions name (representative, match, leakage),
        ascending: what joining only ``rows`` reads."""
        named = np.concatenate([rows, self.reps(rows), self.match[rows], self.leak[rows]])
        return np.unique(named[named >= 0])

    def reps(self, rows: np.ndarray) -> np.ndarray:
        """The representative row of each of ``rows`` (as ``_Verdicts.representatives``)."""
        return representatives_at(self.verdict, self.match, rows)


def put_decisions(ws: Workspace, decided: RowDecisions, tmp: Path) -> Ref:
    """The decisions table, a slice of rows at a time."""
    return put_table_batches(ws.cas, DECISION_COLUMNS, _decision_batches(decided), tmp)


def _decision_batches(d: RowDecisions) -> Iterator[pa.RecordBatch]:
    n = len(d.verdict)
    for lo in range(0, n, BATCH_ROWS):
        rows = np.arange(lo, min(lo + BATCH_ROWS, n), dtype=np.int64)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(d.verdict[rows]),
                pa.array(d.reps(rows)),
                pa.array(d.match[rows]),
                pa.array(d.jaccard[rows]),
                pa.array(d.leak[rows]),
                d.reasons(lo, lo + len(rows)),
                pa.array(d.pos[rows]),
            ],
            schema=DECISION_COLUMNS,
        )


@dataclass
class Reuse:
    """Which output positions come from the parent's table, and from which of its rows."""

    fresh_rows: np.ndarray  # child rows to join, ascending
    fresh_at: np.ndarray  # per child output position, whether a joined row goes there
    keep: np.ndarray  # per parent table position, whether its row is copied
    parent_table: str  # the parent's clusters table, verified

    @property
    def copied(self) -> int:
        return int(len(self.fresh_at) - self.fresh_at.sum())


def plan(
    ws: Workspace, mode: Mode, chunk_rows: list[tuple[str, int]], d: RowDecisions
) -> Reuse | str:
    """The rows the parent's table gives, or why none."""
    if mode.mode != INCREMENTAL:
        return f"no reusable parent ({mode.reason})"
    if mode.decisions is None or mode.clusters is None:
        return "the parent stored no decisions"
    if not ws.cas.contains(mode.decisions["digest"]) or not ws.cas.contains(
        mode.clusters["digest"]
    ):
        return "the parent's clusters or decisions are gone from the store"
    c2p, p2c = row_maps(mode.chunks, chunk_rows)
    files = TrustedFiles(ws.cas, ws.catalog)
    decisions = files.path(mode.decisions["digest"], "parent dedup decisions")
    same, parent_pos = _unchanged(decisions, d, c2p, p2c)
    copied = np.flatnonzero(same)
    child_pos, from_parent = d.pos[copied], parent_pos[copied]
    fresh_at = fresh_positions(len(d.verdict), child_pos, from_parent)
    if fresh_at is None:
        return "the parent's rows are in another order"
    keep = np.zeros(len(p2c), dtype=bool)
    keep[from_parent] = True
    table = files.path(mode.clusters["digest"], "parent dedup clusters")
    return Reuse(np.flatnonzero(~same), fresh_at, keep, table)


def fresh_positions(n: int, child_pos: np.ndarray, from_parent: np.ndarray) -> np.ndarray | None:
    """Per child output position, whether no copied row goes there, given each copied row's
    child position (distinct: positions are a permutation) and parent table position; None
    when the copied rows are not in the parent's order. Placed by position, not sorted."""
    by_position = np.full(n, -1, dtype=np.int64)
    by_position[child_pos] = from_parent
    fresh_at = by_position < 0
    if not bool(np.all(np.diff(by_position[~fresh_at]) > 0)):
        return None
    return fresh_at


def row_maps(
    parent: tuple[tuple[str, int], ...], child: list[tuple[str, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Child row -> parent row (-1: new) and parent row -> child row (-2: gone), over the chunks
    both list by records digest (each parent chunk given to one child chunk at most)."""
    starts: dict[str, tuple[int, int]] = {}
    start = 0
    for digest, rows in parent:
        starts.setdefault(digest, (start, rows))
        start += rows
    p2c = np.full(start, _GONE, dtype=np.int64)
    c2p = np.full(sum(rows for _, rows in child), -1, dtype=np.int64)
    at = 0
    for digest, rows in child:
        found = starts.pop(digest, None)
        if found is not None and found[1] == rows:
            c2p[at : at + rows] = np.arange(found[0], found[0] + rows)
            p2c[found[0] : found[0] + rows] = np.arange(at, at + rows)
        at += rows
    return c2p, p2c


def _unchanged(
    path: str, d: RowDecisions, c2p: np.ndarray, p2c: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per child row, whether its parent row's decisions are its own; and per child row the
    parent's table position (meaningful where unchanged). Reads the parent's decisions a
    batch at a time."""
    same = np.zeros(len(c2p), dtype=bool)
    parent_pos = np.full(len(c2p), -1, dtype=np.int64)
    lo = 0
    for batch in streamed(path, BATCH_ROWS):
        hi = lo + len(batch)
        child = p2c[lo:hi]
        kept = np.flatnonzero(child >= 0)
        rows = child[kept]
        col = {name: batch.column(name) for name in DECISION_COLUMNS.names}

        def parent(name: str) -> np.ndarray:
            return col[name].to_numpy()[kept]  # noqa: B023

        ok = d.verdict[rows] == parent("verdict")
        ok &= d.reps(rows) == _mapped(parent("rep"), p2c)
        ok &= d.match[rows] == _mapped(parent("match"), p2c)
        ok &= d.leak[rows] == _mapped(parent("leak"), p2c)
        cj, pj = d.jaccard[rows], parent("jaccard")
        ok &= (cj == pj) | (np.isnan(cj) & np.isnan(pj))
        ok &= _same_reasons(col["reason"], kept, rows, d)
        same[rows] = ok
        parent_pos[rows] = parent("pos")
        lo = hi
    return same, parent_pos


def _mapped(rows: np.ndarray, p2c: np.ndarray) -> np.ndarray:
    """Parent rows as child rows (-1 stays -1, a gone row is -2)."""
    return np.where(rows < 0, -1, p2c[np.maximum(rows, 0)])


def _same_reasons(
    reasons: pa.Array, kept: np.ndarray, rows: np.ndarray, d: RowDecisions
) -> np.ndarray:
    """Whether each kept parent row's exclusion reason is its child row's (few are set)."""
    ok = np.ones(len(kept), dtype=bool)
    parent_set = pc.not_equal(reasons, "").to_numpy(zero_copy_only=False)[kept]
    check = np.flatnonzero(parent_set | np.isin(rows, d.excluded_rows))
    for k in check.tolist():
        ok[k] = reasons[int(kept[k])].as_py() == d.excluded.get(int(rows[k]), "")
    return ok


class _Stream:
    """Rows of a batch iterator handed out ``take`` at a time."""

    def __init__(self, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> None:
        self.batches, self.schema = batches, schema
        self.held: list[pa.RecordBatch] = []
        self.rows = 0

    def take(self, k: int) -> pa.Table:
        while self.rows < k:
            batch = next(self.batches)
            self.held.append(batch)
            self.rows += len(batch)
        table = pa.Table.from_batches(self.held, self.schema)
        out, rest = table.slice(0, k), table.slice(k)
        self.held = rest.to_batches()
        self.rows -= k
        return out


class _ParentWindow:
    """The parent's table decoded a row group at a time, holding only the batches that cover
    the parent rows asked for (which only move forward). A batch whose rows are mostly not
    copied is held filtered, so what is held stays within a few row groups however sparse
    the copied rows are."""

    def __init__(self, path: str, keep: np.ndarray, schema: pa.Schema, rows: int) -> None:
        self.batches = streamed(path, rows)
        self.keep, self.schema = keep, schema
        # per held batch: its first parent row, its rows, each parent row's place in it
        self.held: list[tuple[int, pa.RecordBatch, np.ndarray]] = []
        self.end = 0  # parent rows read

    def _read(self) -> None:
        start = self.end
        batch = next(self.batches).cast(self.schema)
        self.end += len(batch)
        mask = self.keep[start : self.end]
        if mask.any():
            place = np.cumsum(mask) - 1
            if 2 * int(mask.sum()) < len(batch):
                batch = batch.filter(pa.array(mask))
            else:
                place = np.arange(len(mask))
            self.held.append((start, batch, place))

    def gather(self, at: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """The held rows, and where copied parent rows ``at`` (ascending) are in them."""
        while self.held and self.held[0][0] + len(self.held[0][2]) <= at[0]:
            self.held.pop(0)
        while self.end <= at[-1]:
            self._read()
        index = np.empty(len(at), dtype=np.int64)
        offset = 0
        for start, batch, place in self.held:
            lo, hi = np.searchsorted(at, [start, start + len(place)])
            index[lo:hi] = offset + place[at[lo:hi] - start]
            offset += len(batch)
        table = pa.Table.from_batches([batch for _, batch, _ in self.held], self.schema)
        return table, index


def merged(
    reuse: Reuse, fresh: Iterator[pa.RecordBatch], schema: pa.Schema, rows: int = MERGE_ROWS
) -> Iterator[pa.RecordBatch]:
    """The child's table in output order: the joined rows where ``fresh_at``, the parent's
    copied rows elsewhere, both streams in that order already. Each output batch is one row
    group of rows gathered by one ``take`` from the parent's decoded rows and the joined ones
    (no rechunking by the writer)."""
    parent = _ParentWindow(reuse.parent_table, reuse.keep, schema, rows)
    new = _Stream(fresh, schema)
    copied = np.flatnonzero(reuse.keep)  # the parent rows copied, in output order
    n, taken = len(reuse.fresh_at), 0
    for lo in range(0, n, rows):
        flags = reuse.fresh_at[lo : lo + rows]
        k_new = int(flags.sum())
        at = copied[taken : taken + len(flags) - k_new]
        taken += len(at)
        index = np.empty(len(flags), dtype=np.int64)
        parts = [new.take(k_new)]
        if len(at):
            old, index[~flags] = parent.gather(at)
            parts.insert(0, old)
        both = pa.concat_tables(parts)
        index[flags] = both.num_rows - k_new + np.arange(k_new)
        yield from gathered(both, index).to_batches()


RUNS_SHARE = 16  # more runs than one in RUNS_SHARE rows: a take


def gathered(table: pa.Table, index: np.ndarray) -> pa.Table:
    """``table.take(index)`` as one contiguous table. A child's merge takes long runs of
    consecutive rows (copied rows between a few joined ones), so the runs are sliced and
    concatenated (copies of whole runs: half the CPU of a take row by row at 685k rows)."""
    if not len(index):
        return table.slice(0, 0).combine_chunks()
    cuts = np.flatnonzero(np.diff(index) != 1) + 1
    if (len(cuts) + 1) * RUNS_SHARE > len(index):
        return table.take(pa.array(index)).combine_chunks()
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [len(index)]])
    runs = [table.slice(int(index[a]), int(b - a)) for a, b in zip(starts, ends, strict=True)]
    return pa.concat_tables(runs).combine_chunks()


def changed_key(code: str, parent_clusters: str, clusters: str) -> str:
    """The memo key of the chunks whose rows may differ between two clusters tables."""
    return json_digest(
        {"table": CHANGED, "code": code, "parent": parent_clusters, "child": clusters}
    )


def remember_changed(
    catalog: Catalog,
    code: str,
    tables: tuple[str, str],
    chunk_rows: list[tuple[str, int]],
    reuse: Reuse,
) -> None:
    """Record which chunks (records digests) hold a row this child joined rather than copied
    from its parent's table (``tables``: the parent's clusters digest, then the child's).
    Every other row is the parent's row byte for byte, so a reader comparing the two tables
    (the members parts) needs to look at these chunks only."""
    starts = np.cumsum([0, *(rows for _, rows in chunk_rows)])
    holding = np.unique(np.searchsorted(starts, reuse.fresh_rows, side="right") - 1)
    digests = sorted({chunk_rows[int(n)][0] for n in holding})
    catalog.remember(changed_key(code, *tables), CHANGED, tables[1], json.dumps(digests))


def changed_chunks(
    catalog: Catalog, code: str, parent_clusters: str, clusters: str
) -> set[str] | None:
    """The records digests :func:`remember_changed` recorded for the two tables, or None."""
    hit = catalog.memo(changed_key(code, parent_clusters, clusters))
    return None if hit is None else set(json.loads(hit[1]))
