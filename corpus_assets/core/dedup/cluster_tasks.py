"""The clusters table's join as worker tasks: the driver writes integers, workers
write the strings.

The in-driver join (:func:`.clusters.join_clusters`) hands DuckDB every record's ids and hash
joins them to the decisions: O(records) CPU on one machine. On the task runner the same rows
come from two stages over a scratch folder under the data home (every worker sees it):

- **names** (one task per canonical chunk): the chunk's carried columns (record id, source,
  object, line, group id, dedup key), verified and read from its file, written as one
  uncompressed Arrow IPC batch, so any task can memory-map it and take rows by number;
- **gather** (one task per canonical chunk): the decisions of the chunk's rows (the driver
  wrote them by row; a chunk's rows are a range of rows and the same range of table
  positions), put in table order by their positions and joined by row number to the
  memory-mapped names: each row's own columns, its representative's and
  direct match's record ids, its leakage group's id. The task puts the rows in the store as
  the chunk's clusters part and returns its ref, with the record ids of the rows the edges
  name (the edges table's input: O(edges) strings, not the rows).

The driver only names the parts in a parts document: no row of the table passes through it.
The rows are those of the DuckDB join and a part's bytes depend on its rows alone, so the
table's bytes are the same whichever path ran.
"""

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from corpus_assets.core.dedup.clusters import (
    CARRIED,
    CLUSTER_COLUMNS,
    Decisions,
)
from corpus_assets.core.dedup.edges import EdgeIds
from corpus_assets.core.dedup.verdicts import VERDICTS
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.workspace import Workspace, pooled
from corpus_assets.core.storage.artifacts import Ref
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.storage.parquet_sink import put_table_batches

GATHER_ROWS = 1 << 16  # decisions rows per row group (any count gives the same bytes)
WANTED = "wanted.npy"  # the table positions whose record ids the edges name, for every task
_CARRIED_SCHEMA = pa.schema([CLUSTER_COLUMNS.field(name) for name in CARRIED])


@dataclass(frozen=True)
class NamesJob:
    """One canonical chunk: its carried columns into ``names-<index>.arrow``."""

    scratch: str
    index: int
    chunk: ChunkRecords
    start: int = 0  # its first row in the partition


@dataclass(frozen=True)
class GatherJob:
    """One canonical chunk's rows of the decisions, joined to the names, put as its part."""

    scratch: str
    chunk: int  # its number among the chunks
    starts: tuple[int, ...]  # each chunk's first row (and table position)
    count: int  # its rows
    reasons: tuple[str, ...]  # exclusion reason by code
    group_rows: int  # the decisions' rows per row group


@dataclass(frozen=True)
class GatheredPart:
    """What a gather task put: its part's ref and the record ids at the wanted positions."""

    ref: Ref
    count: int
    ids: pa.Array
    pid: int


def gather_rows() -> int:
    """Decisions rows per row group (tests set fewer with ``CORPUS_GATHER_ROWS``)."""
    return int(os.environ.get("CORPUS_GATHER_ROWS") or GATHER_ROWS)


def cluster_parts_on_runner(
    ws: Workspace,
    chunks: list[ChunkRecords],
    decisions: Decisions,
    edge_ids: EdgeIds,
    scratch: Path,
    work: Counter[str],
    named: bool = False,
) -> list[GatheredPart]:
    """Every chunk's clusters part, joined and put by a task on the runner (see the module),
    in chunk order, the ids the edges name handed to ``edge_ids``; ``decisions`` from
    :func:`decisions_by_position` in ``scratch`` (``named``: the chunks' names are there
    already, written by the coding's tasks). ``work`` counts the gather tasks and those that
    ran in another process (run figures, never hashed)."""
    if not named:
        pooled(ws, chunk_names, [NamesJob(str(scratch), i, c) for i, c in enumerate(chunks)])
    starts = tuple(np.cumsum([0, *(c.count for c in chunks)])[:-1].tolist())
    np.save(scratch / WANTED, edge_ids.wanted)  # O(edges) int64s, not a tuple of ints per job
    reasons = tuple(decisions.reasons.to_pylist())
    meta = pq.ParquetFile(decisions.path).metadata
    group_rows = max(meta.row_group(0).num_rows if meta.num_row_groups else 0, 1)
    jobs = [
        GatherJob(
            str(scratch),
            i,
            starts,
            chunk.count,
            reasons,
            group_rows,
        )
        for i, chunk in enumerate(chunks)
        if chunk.count  # a chunk without rows: its empty part is put here
    ]
    gathered = iter(pooled(ws, gather_part, jobs))
    work["clusters_gather_tasks"] += len(jobs)
    done = [next(gathered) if c.count else _empty_part(ws, scratch) for c in chunks]
    work["clusters_gather_elsewhere"] += sum(p.pid != os.getpid() for p in done if p.count)
    for i in range(len(chunks)):
        _names_path(scratch, i).unlink()
    (scratch / WANTED).unlink()
    for part in done:
        edge_ids.given(part.count, part.ids)
    return done


def _empty_part(ws: Workspace, scratch: Path) -> GatheredPart:
    """A chunk without rows: an empty part (the bytes the joined path puts for it)."""
    ref = put_table_batches(ws.cas, CLUSTER_COLUMNS, [], scratch)
    return GatheredPart(ref, 0, pa.array([], pa.string()), os.getpid())


def _names_path(scratch: Path, index: int) -> Path:
    return scratch / f"names-{index:06d}.arrow"


def chunk_names(ws: Workspace, job: NamesJob, spec: object, done: object) -> int:
    """Write one chunk's carried columns as a memory-mappable Arrow file; its row count."""
    return write_names(ws, job).num_rows


def write_names(ws: Workspace, job: NamesJob, also: tuple[str, ...] = ()) -> pa.Table:
    """One chunk's carried columns, verified and read from its file, written as a
    memory-mappable Arrow file; the table, with the columns ``also`` read beside them."""
    chunk = job.chunk
    path = VerifiedFiles(ws.cas).path(chunk.records["digest"], chunk.what)
    read = pq.read_table(path, columns=[*CARRIED, *also], use_threads=False)
    if read.num_rows != chunk.count:
        raise ValueError(f"{chunk.what}: {read.num_rows} rows, the index says {chunk.count}")
    table = read.select(CARRIED).cast(_CARRIED_SCHEMA)
    batch = table.combine_chunks().to_batches()
    with ipc.new_file(str(_names_path(Path(job.scratch), job.index)), _CARRIED_SCHEMA) as out:
        for part in batch:  # one batch: the table was combined
            out.write_batch(part)
    for name in also:
        table = table.append_column(name, read.column(name))
    return table


class Names:
    """Every chunk's names, memory-mapped, taken by global row number."""

    def __init__(self, scratch: Path, starts: tuple[int, ...]) -> None:
        self.starts = np.asarray(starts, dtype=np.int64)
        self.tables: list[pa.Table] = []
        for i in range(len(starts)):
            source = pa.memory_map(str(_names_path(scratch, i)))
            self.tables.append(ipc.open_file(source).read_all())

    def take(self, rows: np.ndarray, column: str) -> pa.Array:
        """``column`` at each of ``rows``, in their order."""
        chunk = np.searchsorted(self.starts, rows, side="right") - 1
        by_chunk = np.argsort(chunk, kind="stable")
        cuts = np.flatnonzero(np.diff(chunk[by_chunk])) + 1
        parts = []
        for part in np.split(by_chunk, cuts) if len(by_chunk) else []:
            c = int(chunk[part[0]])
            values = whole_array(self.tables[c].column(column))
            parts.append(values.take(pa.array(rows[part] - self.starts[c])))
        if not parts:
            return pa.array([], _CARRIED_SCHEMA.field(column).type)
        back = np.empty(len(rows), dtype=np.int64)
        back[by_chunk] = np.arange(len(rows), dtype=np.int64)
        return pa.concat_arrays(parts).take(pa.array(back))

    def take_nullable(self, rows: pa.Array, column: str, empty: str) -> pa.Array:
        """``column`` at each row; ``empty`` where the row is null (no such record)."""
        valid = rows.is_valid()
        taken = self.take(pc.fill_null(rows, 0).to_numpy(), column)
        return pc.if_else(valid, taken, pa.scalar(empty, pa.string()))


def gather_part(ws: Workspace, job: GatherJob, spec: object, done: object) -> GatheredPart:
    """One chunk's rows of the clusters table, in table order, put in the store as its part
    a slice of :attr:`GatherJob.group_rows` rows at a time (a task holds the chunk's
    decisions and one joined slice); its ref, the record ids at the wanted positions and the
    process."""
    scratch = Path(job.scratch)
    names = Names(scratch, job.starts)
    taken: list[tuple[int, pa.Array]] = []
    slices = _joined_slices(scratch / "decisions.parquet", job, names, taken)
    ref = put_table_batches(ws.cas, CLUSTER_COLUMNS, slices, scratch)
    ids = pa.concat_arrays([i for _, i in taken]) if taken else pa.array([], pa.string())
    return GatheredPart(ref, sum(rows for rows, _ in taken), ids, os.getpid())


def _joined_slices(
    path: Path, job: GatherJob, names: Names, taken: list[tuple[int, pa.Array]]
) -> Iterator[pa.RecordBatch]:
    """The chunk's rows, joined, a slice at a time in table order; each slice's rows and the
    record ids at its wanted positions appended to ``taken`` (the rows really put, which the
    driver checks against the chunk's count)."""
    lo = job.starts[job.chunk]
    decided = _in_table_order(_chunk_decisions(path, job), lo)
    wanted = _wanted_in(Path(job.scratch), lo, lo + job.count) - lo
    for start in range(0, decided.num_rows, job.group_rows):
        joined = _joined(decided.slice(start, job.group_rows), names, job.reasons)
        end = start + joined.num_rows
        at = wanted[(wanted >= start) & (wanted < end)] - start
        taken.append(
            (joined.num_rows, joined.column("record_id").take(pa.array(at)).combine_chunks())
        )
        yield from joined.to_batches()


def _chunk_decisions(path: Path, job: GatherJob) -> pa.Table:
    """The decisions of the chunk's rows, read from the row groups holding them."""
    lo = job.starts[job.chunk]
    hi = lo + job.count
    groups = list(range(lo // job.group_rows, -(-hi // job.group_rows)))
    table = pq.ParquetFile(path).read_row_groups(groups)
    return table.slice(lo - groups[0] * job.group_rows, job.count)


def _in_table_order(decided: pa.Table, lo: int) -> pa.Table:
    """A chunk's decisions by position: its positions are ``lo`` onwards, one a row."""
    positions = decided.column("pos").to_numpy() - lo
    count = len(positions)
    by_position = np.full(count, -1, dtype=np.int64)
    if count and positions.min() >= 0 and positions.max() < count:
        by_position[positions] = np.arange(count, dtype=np.int64)
    if (by_position < 0).any():  # out of range, or two rows at one position
        raise ValueError(f"dedup decisions: rows {lo}.. are not at positions {lo}..")
    return decided.take(pa.array(by_position))


def _wanted_in(scratch: Path, lo: int, hi: int) -> np.ndarray:
    """The positions in ``[lo, hi)`` whose record ids the edges name, ascending: a slice of
    the driver's file, memory-mapped."""
    wanted = np.load(scratch / WANTED, mmap_mode="r")
    first, last = np.searchsorted(wanted, [lo, hi])
    return np.array(wanted[first:last], dtype=np.int64)


def _joined(decided: pa.Table, names: Names, reasons: tuple[str, ...]) -> pa.Table:
    """Decided rows joined by row number to the names: the clusters table's columns."""
    rows = decided.column("row").to_numpy()
    verdict = decided.column("verdict").combine_chunks()
    columns = {name: names.take(rows, name) for name in CARRIED}
    columns |= {
        "verdict": pa.array(VERDICTS, pa.string()).take(verdict),
        "representative_id": names.take_nullable(_one(decided, "rep"), "record_id", ""),
        "is_representative": pc.equal(verdict, pa.scalar(0, pa.int8())),
        "match_id": names.take_nullable(_one(decided, "match"), "record_id", ""),
        "match_jaccard": _one(decided, "jaccard"),
        "leakage_id": names.take(decided.column("leak").to_numpy(), "group_id"),
        "excluded": pa.array(reasons, pa.string()).take(_one(decided, "reason")),
    }
    return pa.table(columns).cast(CLUSTER_COLUMNS)


def _one(table: pa.Table, column: str) -> pa.Array:
    return whole_array(table.column(column))


def whole_array(column: pa.ChunkedArray) -> pa.Array:
    """One array (a memory-mapped single chunk is not copied)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
