"""The clusters table's join as worker tasks: the driver writes integers, workers
write the strings.

The in-driver join (:func:`.clusters.join_clusters`) hands DuckDB every record's ids and hash
joins them to the decisions: O(records) CPU on one machine. On the task runner the same rows
come from two stages over a scratch folder under the data home (every worker sees it):

- **names** (one task per canonical chunk): the chunk's carried columns (record id, source,
  object, line, group id, dedup key), verified and read from its file, written as one
  uncompressed Arrow IPC batch, so any task can memory-map it and take rows by number;
- **gather** (one task per output bucket of :func:`gather_rows` rows): the
  decisions of the bucket's rows, already in table order (the driver wrote them by position),
  joined by row number to the memory-mapped names: each row's own columns, its
  representative's and direct match's record ids, its leakage group's id. Written as the
  bucket's rows in CLUSTER_COLUMNS.

The driver then streams the buckets in order into the table's Parquet file. The rows are those
of the DuckDB join, so the table's bytes are the same whichever path ran.
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
    VERDICTS,
    Decided,
    Decisions,
    write_decisions,
)
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.workspace import Workspace, pooled
from corpus_assets.core.storage.cas_queries import VerifiedFiles

GATHER_ROWS = 1 << 16  # table rows per gather task (any count gives the same bytes)
_CARRIED_SCHEMA = pa.schema([CLUSTER_COLUMNS.field(name) for name in CARRIED])


@dataclass(frozen=True)
class NamesJob:
    """One canonical chunk: its carried columns into ``names-<index>.arrow``."""

    scratch: str
    index: int
    chunk: ChunkRecords


@dataclass(frozen=True)
class GatherJob:
    """One output bucket: row group ``bucket`` of the decisions, joined to the names."""

    scratch: str
    bucket: int
    starts: tuple[int, ...]  # each chunk's first row
    reasons: tuple[str, ...]  # exclusion reason by code


def decisions_by_position(decided: Decided, scratch: Path) -> Decisions:
    """The decisions in table order, a row group per output bucket (what gather tasks read)."""
    by_position = np.empty(decided.codes.n, dtype=np.int64)
    by_position[decided.position] = np.arange(decided.codes.n, dtype=np.int64)
    return write_decisions(decided, scratch, gather_rows(), only=by_position)


def gather_rows() -> int:
    """Rows per gather task (tests set fewer with ``CORPUS_GATHER_ROWS``)."""
    return int(os.environ.get("CORPUS_GATHER_ROWS") or GATHER_ROWS)


def cluster_batches_on_runner(
    ws: Workspace,
    chunks: list[ChunkRecords],
    decisions: Decisions,
    scratch: Path,
    work: Counter[str],
) -> Iterator[pa.RecordBatch]:
    """The clusters table in its order, joined by tasks on the runner (see the module);
    ``decisions`` from :func:`decisions_by_position` in ``scratch``. ``work`` counts the
    gather tasks and those that ran in another process (run figures, never hashed)."""
    pooled(ws, chunk_names, [NamesJob(str(scratch), i, c) for i, c in enumerate(chunks)])
    starts = tuple(np.cumsum([0, *(c.count for c in chunks)])[:-1].tolist())
    reasons = tuple(decisions.reasons.to_pylist())
    buckets = pq.ParquetFile(decisions.path).num_row_groups
    jobs = [GatherJob(str(scratch), b, starts, reasons) for b in range(buckets)]
    done = pooled(ws, gather_bucket, jobs)
    work["clusters_gather_tasks"] += len(done)
    work["clusters_gather_elsewhere"] += sum(pid != os.getpid() for _, pid in done)
    for i in range(len(chunks)):
        _names_path(scratch, i).unlink()
    for path, _ in done:
        with pa.memory_map(path) as source:
            yield from ipc.open_file(source).read_all().to_batches()
        Path(path).unlink()


def _names_path(scratch: Path, index: int) -> Path:
    return scratch / f"names-{index:06d}.arrow"


def chunk_names(ws: Workspace, job: NamesJob, spec: object, done: object) -> int:
    """Write one chunk's carried columns as a memory-mappable Arrow file; its row count."""
    chunk = job.chunk
    path = VerifiedFiles(ws.cas).path(chunk.records["digest"], chunk.what)
    table = pq.read_table(path, columns=CARRIED, use_threads=False).cast(_CARRIED_SCHEMA)
    if table.num_rows != chunk.count:
        raise ValueError(f"{chunk.what}: {table.num_rows} rows, the index says {chunk.count}")
    batch = table.combine_chunks().to_batches()
    with ipc.new_file(str(_names_path(Path(job.scratch), job.index)), _CARRIED_SCHEMA) as out:
        for part in batch:  # one batch: the table was combined
            out.write_batch(part)
    return table.num_rows


class _Names:
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
            values = _whole(self.tables[c].column(column))
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


def gather_bucket(ws: Workspace, job: GatherJob, spec: object, done: object) -> tuple[str, int]:
    """One bucket's rows of the clusters table, in table order, into an Arrow file; its path
    and the process that wrote it."""
    scratch = Path(job.scratch)
    decided = pq.ParquetFile(scratch / "decisions.parquet").read_row_group(job.bucket)
    names = _Names(scratch, job.starts)
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
        "excluded": pa.array(job.reasons, pa.string()).take(_one(decided, "reason")),
    }
    table = pa.table(columns).cast(CLUSTER_COLUMNS)
    path = scratch / f"clusters-{job.bucket:08d}.arrow"
    with ipc.new_file(str(path), CLUSTER_COLUMNS) as out:
        out.write_table(table)
    return str(path), os.getpid()


def _one(table: pa.Table, column: str) -> pa.Array:
    return _whole(table.column(column))


def _whole(column: pa.ChunkedArray) -> pa.Array:
    """One array (a memory-mapped single chunk is not copied)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
