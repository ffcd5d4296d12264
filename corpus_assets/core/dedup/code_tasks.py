"""Record codes by a sample sort on the task runner: the driver's coding sorts, distributed.

Dedup decides on integer codes of record ids, group ids and dedup keys
(:class:`.partition_db.RecordCodes`). In the driver they cost DuckDB external sorts of every
value: 1.1 of the dedup driver's 3.3-3.5 CPU-s at 1.1 GB of raw text on Ray. Where the stages
run on the runner (:func:`.band_runner.distributed`) they come from three stages over the
layer's scratch folder under the data home instead (every worker sees it):

- **runs** (one task per canonical chunk; it is the clusters join's *names* task, so the chunk
  is verified and read once): each coded set of the chunk sorted by value (byte order, nulls
  last) with its rows, written as an Arrow IPC file - ``ids``: every record id and each group
  id unlike its record id (flagged), ranked together as the driver ranks them; ``keys``: the
  dedup keys. It returns evenly spaced samples of each set.
- **splitters** (the driver): from the samples, the values that cut each set into partitions
  of about ``PARTITION_VALUES`` values (a function of the sizes and samples, never of the
  worker count; any cut gives codes in the same order).
- **merge** (one task per partition of a set): every run's rows between the partition's
  splitters (a binary search of the memory-mapped run), sorted, numbered where the value
  changes; rows and codes written as ``.npy``.

The driver places each partition's codes at their rows, offset by the values of the
partitions before it: codes follow byte order, equal values share one and numbers are
skipped, as :meth:`.partition_db.PartitionDb.codes` promises. No output depends on the
numbering itself (a child's carried codes number differently too), so the layer's bytes are
the in-driver path's (``test_dedup_distributed``). The driver holds the codes (4 bytes a
record each) and one partition's arrays at a time, never a value.
"""

import bisect
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from corpus_assets.core.dedup.cluster_tasks import NamesJob, whole_array, write_names
from corpus_assets.core.dedup.partition_db import Coded, code_dtype, value_changes
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.workspace import Workspace, pooled

PARTITION_VALUES = 1 << 18  # values per merge partition at most (tests fix the count instead)
MERGE_COPIES = 3  # a merge task holds its slices, their concatenation and the sorted copy
ROW_BYTES = 9  # beside each value: its row (int64) and flag
SAMPLES = 64  # evenly spaced values per run and set
SETS = ("ids", "keys")


@dataclass(frozen=True)
class RunSamples:
    """What a runs task wrote, per set: its values, their UTF-8 bytes and evenly spaced
    non-null ones."""

    values: dict[str, int]
    value_bytes: dict[str, int]
    samples: dict[str, list[str]]


@dataclass(frozen=True)
class MergeJob:
    """One partition of a set: the values ``lo <= v < hi`` of every run (None: unbounded;
    nulls sort last, so they belong to the last partition)."""

    scratch: str
    kind: str
    partition: int
    runs: int
    lo: str | None
    hi: str | None


@dataclass(frozen=True)
class Merged:
    """A merge task's value count (the next partition's code offset) and its process."""

    values: int
    pid: int


def runner_codes(
    ws: Workspace, chunks: list[ChunkRecords], scratch: Path, work: Counter[str]
) -> tuple[Coded, Coded, Coded]:
    """Record id, dedup key and group id codes by row (as ``PartitionDb.codes`` takes them
    carried); the chunks' names are left in ``scratch`` for the clusters join's gather tasks.
    ``work`` counts the tasks and those run in another process."""
    starts = np.cumsum([0, *(c.count for c in chunks)], dtype=np.int64)
    jobs = [NamesJob(str(scratch), i, c, int(starts[i])) for i, c in enumerate(chunks)]
    sampled: list[RunSamples] = pooled(ws, chunk_runs, jobs)
    n = int(starts[-1])
    work["code_run_tasks"] += len(jobs)
    budget = ws.config.execution.task_budget_bytes()
    merges = [job for kind in SETS for job in _merge_jobs(scratch, kind, sampled, budget)]
    merged: list[Merged] = pooled(ws, merge_partition, merges)  # both sets' at once
    work["code_merge_tasks"] += len(merges)
    work["code_merge_elsewhere"] += sum(m.pid != os.getpid() for m in merged)
    for kind in SETS:
        for index in range(len(sampled)):
            _run_path(scratch, kind, index).unlink()
    done = list(zip(merges, merged, strict=True))
    ids, groups = _placed(scratch, [d for d in done if d[0].kind == "ids"], n)
    keys, _ = _placed(scratch, [d for d in done if d[0].kind == "keys"], n)
    own = groups < 0
    groups[own] = ids[own]
    return Coded(ids, []), Coded(keys, []), Coded(groups, [])


def _merge_jobs(scratch: Path, kind: str, sampled: list[RunSamples], budget: int) -> list[MergeJob]:
    """A set's merge jobs, one per partition between the splitters of its samples."""
    values = sum(s.values[kind] for s in sampled)
    value_bytes = sum(s.value_bytes[kind] for s in sampled)
    count = merge_partitions(values, value_bytes, budget)
    cuts = splitters([v for s in sampled for v in s.samples[kind]], count)
    bounds = [None, *cuts, None]
    return [
        MergeJob(str(scratch), kind, p, len(sampled), bounds[p], bounds[p + 1])
        for p in range(len(cuts) + 1)
    ]


def _placed(
    scratch: Path, done: list[tuple[MergeJob, Merged]], n: int
) -> tuple[np.ndarray, np.ndarray]:
    """A set's codes by row from its partitions, and its flagged rows' (group ids; -1:
    none): each partition's local codes offset by the values of the partitions before."""
    dtype = code_dtype(max(sum(m.values for _, m in done), 1))
    codes = np.zeros(n, dtype=dtype)
    groups = np.full(n, -1, dtype=dtype)
    offset = 0
    for job, merged in done:
        rows, local, flagged = _load_merge(scratch, job.kind, job.partition)
        placed = (local + offset).astype(dtype)
        codes[rows[~flagged]], groups[rows[flagged]] = placed[~flagged], placed[flagged]
        offset += merged.values
    return codes, groups


def merge_partitions(values: int, value_bytes: int, budget: int) -> int:
    """Partitions of a set of ``values`` values of ``value_bytes`` UTF-8 bytes: one per
    ``PARTITION_VALUES``, or more if a merge task's copies would exceed ``budget`` bytes
    (``Execution.task_budget_bytes``, evenly spread values assumed); the environment may fix
    it (``CORPUS_CODE_PARTITIONS``)."""
    fixed = int(os.environ.get("CORPUS_CODE_PARTITIONS") or 0)
    held = MERGE_COPIES * (value_bytes + ROW_BYTES * values)
    return fixed or max(1, -(-values // PARTITION_VALUES), -(-held // max(budget, 1)))


def splitters(samples: list[str], count: int) -> list[str]:
    """Ascending distinct values cutting a set into ``count`` partitions at the samples'
    quantiles; fewer when the samples hold fewer distinct values."""
    ordered = sorted(set(samples))  # code point order: UTF-8's byte order
    if count <= 1 or not ordered:
        return []
    return sorted({ordered[k * len(ordered) // count] for k in range(1, count)})


def chunk_runs(ws: Workspace, job: NamesJob, spec: object, done: object) -> RunSamples:
    """One chunk's names (for the gather tasks) and its sorted runs of both sets."""
    table = write_names(ws, job)
    rows = pa.array(np.arange(job.start, job.start + table.num_rows, dtype=np.int64))
    record, group = whole_array(table["record_id"]), whole_array(table["group_id"])
    unlike = _distinct(group, record)
    sets = {
        "ids": _run(
            pa.concat_arrays([record, group.filter(unlike)]),
            pa.concat_arrays([rows, rows.filter(unlike)]),
            pc.sum(unlike).as_py() or 0,
        ),
        "keys": _run(whole_array(table["dedup_key"]), rows, 0),
    }
    samples, sizes = {}, {}
    for kind, run in sets.items():
        sizes[kind] = pc.sum(pc.binary_length(run.column("v"))).as_py() or 0
        ordered = run.take(pc.sort_indices(run, [("v", "ascending", "at_end")]))
        _write(_run_path(Path(job.scratch), kind, job.index), ordered.combine_chunks())
        samples[kind] = _samples(ordered.column("v"))
    return RunSamples({k: t.num_rows for k, t in sets.items()}, sizes, samples)


def _run(values: pa.Array, rows: pa.Array, flagged: int) -> pa.Table:
    """A set's rows of a chunk, its last ``flagged`` rows flagged (group ids)."""
    flags = np.r_[np.zeros(len(rows) - flagged, bool), np.ones(flagged, bool)]
    return pa.table([values, rows, pa.array(flags)], schema=_SCHEMA)


def _distinct(a: pa.Array, b: pa.Array) -> pa.Array:
    """Per row, ``a IS DISTINCT FROM b`` (null against a value differs, two nulls do not)."""
    unequal = pc.fill_null(pc.not_equal(a, b), False)
    return pc.or_(unequal, pc.xor(pc.is_null(a), pc.is_null(b)))


def _samples(values: pa.ChunkedArray) -> list[str]:
    """``SAMPLES`` evenly spaced non-null values of a sorted column (nulls are last)."""
    present = len(values) - values.null_count
    if not present:
        return []
    at = sorted({k * present // SAMPLES for k in range(SAMPLES)})
    return values.take(pa.array(at, pa.int64())).to_pylist()


def merge_partition(ws: Workspace, job: MergeJob, spec: object, done: object) -> Merged:
    """One partition of a set: its rows of every run, sorted and numbered, written."""
    scratch = Path(job.scratch)
    parts = []
    for index in range(job.runs):
        run = _read(_run_path(scratch, job.kind, index))
        lo, hi = _Sorted(run.column("v")).range(job.lo, job.hi)
        parts.append(run.slice(lo, hi - lo))
    table = pa.concat_tables(parts) if parts else _empty()
    table = table.take(pc.sort_indices(table, [("v", "ascending", "at_end")]))
    values = table.column("v").combine_chunks()
    local = np.cumsum(value_changes(values, None)) - 1 if len(values) else np.zeros(0, np.int64)
    base = _merge_path(scratch, job.kind, job.partition)
    np.save(f"{base}-rows.npy", table.column("row").to_numpy())
    np.save(f"{base}-codes.npy", local.astype(np.int64))
    np.save(f"{base}-flags.npy", table.column("flag").to_numpy(zero_copy_only=False))
    return Merged(table.num_rows, os.getpid())


class _Sorted:
    """A sorted string column (nulls last) searched for its rows between two values."""

    def __init__(self, values: pa.ChunkedArray | pa.Array) -> None:
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, i: int) -> tuple[int, str]:
        value = self.values[i].as_py()
        return (1, "") if value is None else (0, value)

    def range(self, lo: str | None, hi: str | None) -> tuple[int, int]:
        start = 0 if lo is None else bisect.bisect_left(self, (0, lo))
        end = len(self) if hi is None else bisect.bisect_left(self, (0, hi))
        return start, end


_SCHEMA = pa.schema([("v", pa.string()), ("row", pa.int64()), ("flag", pa.bool_())])


def _empty() -> pa.Table:
    return _SCHEMA.empty_table()


def _write(path: Path, table: pa.Table) -> None:
    with ipc.new_file(str(path), _SCHEMA) as out:
        out.write_table(table.cast(_SCHEMA))


def _read(path: Path) -> pa.Table:
    return ipc.open_file(pa.memory_map(str(path))).read_all()


def _load_merge(scratch: Path, kind: str, partition: int) -> tuple[np.ndarray, ...]:
    base = _merge_path(scratch, kind, partition)
    loaded = tuple(np.load(f"{base}-{name}.npy") for name in ("rows", "codes", "flags"))
    for name in ("rows", "codes", "flags"):
        Path(f"{base}-{name}.npy").unlink()
    return loaded


def _run_path(scratch: Path, kind: str, index: int) -> Path:
    return scratch / f"run-{kind}-{index:06d}.arrow"


def _merge_path(scratch: Path, kind: str, partition: int) -> Path:
    return scratch / f"merged-{kind}-{partition:05d}"
