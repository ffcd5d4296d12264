"""A child's clusters parts from its parent's: a chunk whose rows' decisions did not change
keeps its parent's part.

Joining every record's strings to its verdict costs a third of a child's dedup at 685k records,
yet a +1% child changes few rows. The layer stores its per-row decisions (``decisions``: verdict,
representative, match and leakage rows, Jaccard, exclusion reason, table position, rank). A
child whose parent ran the same code and policy maps rows of the canonical chunks both list
(same records digest: same columns, line for line) onto the parent's rows; a mapped row whose
verdict, Jaccard and reason are equal and whose representative, match and leakage rows map onto
the child's own is the parent's row, byte for byte. A chunk whose rows all are is the parent's
part (the same rows in the same order: the same bytes); only the other chunks are joined. When
anything does not line up (no parent, parent without decisions, a parent table not in parts)
every chunk is joined.
"""

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.dedup.output_order import TablePositions
from corpus_assets.core.dedup.pair_cache import INCREMENTAL, Mode
from corpus_assets.core.dedup.row_values import RowValues
from corpus_assets.core.dedup.verdicts import Verdicts
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import ChunkPart
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import JSON, Ref
from corpus_assets.core.storage.cas_queries import streamed
from corpus_assets.core.storage.parquet_sink import put_table_batches
from corpus_assets.core.storage.table_lookup import TrustedFiles

DECISION_COLUMNS = pa.schema(
    [
        ("verdict", pa.int8()),
        ("rep", pa.int64()),  # -1: none (excluded)
        ("match", pa.int64()),  # -1: none
        ("jaccard", pa.float64()),  # nan without a match
        ("leak", pa.int64()),
        ("reason", pa.string()),  # "" unless excluded
        ("pos", pa.int64()),  # its clusters table position (chunk parts in order)
        ("rank", pa.int64()),  # its rank by record id (what a child's carried codes read)
    ]
)
_GONE = -2  # a parent row the child does not have (never equal to a child row or to -1)
BATCH_ROWS = 1 << 16


@dataclass
class RowDecisions:
    """What the child decided, by row, in the decisions table's terms."""

    verdicts: Verdicts  # verdict, match and Jaccard, read by rows
    leak: RowValues
    positions: TablePositions  # with the ranks
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
        looked = self.verdicts.look(rows)
        reps = self.verdicts.representatives(looked)
        named = np.concatenate([rows, reps, looked.match, self.leak.of(rows)])
        return np.unique(named[named >= 0])


def put_decisions(ws: Workspace, decided: RowDecisions, tmp: Path) -> Ref:
    """The decisions table, a slice of rows at a time."""
    return put_table_batches(ws.cas, DECISION_COLUMNS, _decision_batches(decided), tmp)


def _decision_batches(d: RowDecisions) -> Iterator[pa.RecordBatch]:
    v, n = d.verdicts, d.verdicts.n
    for lo in range(0, n, BATCH_ROWS):
        looked = v.span(lo, min(lo + BATCH_ROWS, n))
        rows = looked.rows
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(looked.verdict, pa.int8()),
                pa.array(v.representatives(looked), pa.int64()),  # rows held: code_dtype
                pa.array(looked.match, pa.int64()),
                pa.array(v.jaccard.of(looked), pa.float64()),
                pa.array(d.leak.span(lo, lo + len(rows)), pa.int64()),
                d.reasons(lo, lo + len(rows)),
                pa.array(d.positions.span(lo, lo + len(rows)), pa.int64()),
                pa.array(d.positions.rank.span(lo, lo + len(rows)), pa.int64()),
            ],
            schema=DECISION_COLUMNS,
        )


@dataclass(frozen=True)
class Reuse:
    """The parent's parts a child keeps (by chunk number) and the rows of the other chunks,
    joined in this run."""

    parts: dict[int, ChunkPart]
    fresh_rows: np.ndarray  # ascending

    @property
    def copied(self) -> int:
        return sum(part.count for part in self.parts.values())


def reused_parts(
    ws: Workspace, mode: Mode, chunk_rows: list[tuple[str, int]], d: RowDecisions
) -> Reuse | str:
    """The parent's part of every chunk whose rows it holds with the same decisions, or why
    none."""
    if mode.mode != INCREMENTAL:
        return f"no reusable parent ({mode.reason})"
    if mode.decisions is None or mode.clusters is None:
        return "the parent stored no decisions"
    if mode.clusters["media"] != JSON:
        return "the parent's clusters table is not in chunk parts"
    if not ws.cas.contains(mode.decisions["digest"]):
        return "the parent's decisions are gone from the store"
    parent = PartedTable.read(ws.cas, mode.clusters, "parent dedup clusters")
    c2p, p2c = row_maps(mode.chunks, chunk_rows)
    files = TrustedFiles(ws.cas, ws.catalog)
    decisions = files.path(mode.decisions["digest"], "parent dedup decisions")
    same = _unchanged(decisions, d, c2p, p2c)
    by_records = {(part.records, part.count): part for part in parent.parts}
    starts = np.cumsum([0, *(rows for _, rows in chunk_rows)])
    parts: dict[int, ChunkPart] = {}
    for number, (digest, rows) in enumerate(chunk_rows):
        part = by_records.get((digest, rows))
        if part is None or not ws.cas.contains(part.digest):
            continue
        if bool(same[starts[number] : starts[number + 1]].all()):
            parts[number] = part
    fresh = np.ones(len(c2p), dtype=bool)
    for number in parts:
        fresh[starts[number] : starts[number + 1]] = False
    return Reuse(parts, np.flatnonzero(fresh))


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


def _unchanged(path: str, d: RowDecisions, c2p: np.ndarray, p2c: np.ndarray) -> np.ndarray:
    """Per child row, whether its parent row's decisions are its own. Reads the parent's
    decisions a batch at a time."""
    same = np.zeros(len(c2p), dtype=bool)
    lo = 0
    for batch in streamed(path, BATCH_ROWS):
        hi = lo + len(batch)
        child = p2c[lo:hi]
        kept = np.flatnonzero(child >= 0)
        rows = child[kept]
        col = {name: batch.column(name) for name in ("verdict", "rep", "match", "leak", "jaccard")}

        def parent(name: str) -> np.ndarray:
            return col[name].to_numpy()[kept]  # noqa: B023

        looked = d.verdicts.look(rows)
        ok = looked.verdict == parent("verdict")
        ok &= d.verdicts.representatives(looked) == _mapped(parent("rep"), p2c)
        ok &= looked.match == _mapped(parent("match"), p2c)
        ok &= d.leak.of(rows) == _mapped(parent("leak"), p2c)
        cj, pj = d.verdicts.jaccard.of(looked), parent("jaccard")
        ok &= (cj == pj) | (np.isnan(cj) & np.isnan(pj))
        ok &= _same_reasons(batch.column("reason"), kept, rows, d)
        same[rows] = ok
        lo = hi
    return same


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
