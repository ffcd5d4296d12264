"""Record codes, exact copies and the total order by sample sorts on the task runner.

Dedup decides on integer codes of record ids and group ids, on each row's rank by record id,
and on which rows repeat an id or a dedup key. On the driver these cost DuckDB external sorts
of every value and numpy over every row. Where the stages run on the runner
(:func:`.band_runner.distributed`) they come from tasks over the layer's scratch folder under
the data home instead (every worker sees it), driven by :class:`.task_coding.TaskCoding`:

- **runs** (one task per canonical chunk; it is the clusters join's *names* task, so the chunk
  is verified and read once): each set of the chunk sorted by value (byte order, nulls last)
  with its rows and what deciding needs next to the value, written as an Arrow IPC file -
  ``ids``: every record id with its object, line and dedup key, and each group id unlike its
  record id (flagged), ranked together as the driver ranks them; ``keys``: every dedup key with
  the row's place in the total order (source rank, longer first, record id, object, line) and
  its near-dedup class. It returns evenly spaced samples of each set and its rows per source.
- **order runs** (one task per chunk, once the exact stage is decided): the chunk's keys run
  less the excluded rows, the copies flagged, keyed by one string whose byte order is (class,
  source rank, longer first, record id) (:mod:`.order_key`).
- **splitters** (the driver): from the samples, the values that cut each set into partitions
  of about ``PARTITION_VALUES`` values (a function of the sizes and samples, never of the
  worker count; any cut gives the same answers).
- **merge** (one task per partition of a set): every run's rows between the partition's
  splitters (a binary search of the memory-mapped run), sorted. An ids partition numbers its
  values where they change, ranks its record rows by (record id, object, line, row) and finds
  the rows whose record id an earlier row holds; a keys partition, run once the driver knows
  the excluded rows, finds each dedup key's first eligible row in the total order and the
  copies behind it; an order partition writes its rows in order, the same rows ascending with
  their places, and each class's count. All of a value's rows are in one partition, so each
  answer is whole.

The driver reads the ranks and each class's rows from the merges' files, offset by the
partitions before, and collects the sparse answers; it holds no value. Codes follow byte
order, equal values share one and numbers are skipped, as
:meth:`.partition_db.PartitionDb.codes` promises; no output depends on the numbering itself,
so the layer's bytes are the in-driver path's (``test_dedup_distributed``,
``test_code_tasks``).
"""

import bisect
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from corpus_assets.core.dedup.cluster_tasks import NamesJob, whole_array, write_names
from corpus_assets.core.dedup.order import sorted_hits, source_ranks
from corpus_assets.core.dedup.order_key import class_names, order_key
from corpus_assets.core.dedup.partition_db import stored_lengths, value_changes
from corpus_assets.core.dedup.row_values import rows_within
from corpus_assets.core.runtime.workspace import Workspace

PARTITION_VALUES = 1 << 18  # values per merge partition at most (tests fix the count instead)
MERGE_COPIES = 3  # a merge task holds its slices, their concatenation and the sorted copy
ROW_BYTES = 9  # beside each value: its row (int64) and flag
SAMPLES = 64  # evenly spaced values per run and set
_AT_END = "at_end"  # nulls last, as DuckDB's ascending ORDER BY
_SCHEMAS = {
    "ids": pa.schema(
        [
            ("v", pa.string()),
            ("row", pa.int64()),
            ("flag", pa.bool_()),  # a group id (its record columns null)
            ("own", pa.bool_()),  # a record id that is also its row's group id
            ("object", pa.string()),
            ("line", pa.int64()),
            ("key", pa.string()),
        ]
    ),
    "keys": pa.schema(
        [
            ("v", pa.string()),
            ("row", pa.int64()),
            ("source_rank", pa.int32()),
            ("longer_first", pa.int64()),
            ("record_id", pa.string()),
            ("object", pa.string()),
            ("line", pa.int64()),
            ("cls", pa.string()),  # the row's near-dedup class (kept for the order run)
        ]
    ),
    "order": pa.schema(
        [
            ("v", pa.string()),  # class, source rank, longer first, record id (:func:`_order`)
            ("row", pa.int64()),
            ("object", pa.string()),
            ("line", pa.int64()),
            ("cls", pa.string()),  # "0" and its class for a representative, "1" for a copy
        ]
    ),
}
# each set's sort in a merge: by value, then what orders a value's rows
_SORT_KEYS = {
    "ids": ["v", "object", "line", "row"],
    "keys": ["v", "source_rank", "longer_first", "record_id", "object", "line", "row"],
    "order": ["v", "object", "line", "row"],
}
REPRESENTATIVE, COPY = "0", "1"  # an order run's groups: the classes' rows, then the copies


@dataclass(frozen=True)
class RunJob:
    """One canonical chunk's runs: its names, the digest of its text lengths, and each
    source's rank in the total order (a source not listed ranks after all)."""

    names: NamesJob
    lengths: str
    source_order: tuple[tuple[str, int], ...]
    content_of: tuple[tuple[str, str], ...] = ()  # each source's content (its classes)


@dataclass(frozen=True)
class OrderJob:
    """One chunk's order run, once the exact stage is decided: its keys run's rows less the
    ``excluded`` ones, the ``copies`` flagged (both files of rows, ascending)."""

    scratch: str
    index: int
    start: int
    count: int
    excluded: str
    copies: str


@dataclass(frozen=True)
class RunSamples:
    """What a runs task wrote, per set: its values, the bytes beside their rows and flags,
    and evenly spaced non-null values."""

    values: dict[str, int]
    value_bytes: dict[str, int]
    samples: dict[str, list[str]]
    sources: tuple[tuple[str | None, int], ...] = ()  # the chunk's rows per source


@dataclass(frozen=True)
class MergeJob:
    """One partition of a set: the values ``lo <= v < hi`` of every run (None: unbounded;
    nulls sort last, so they belong to the last partition); ``excluded``: for keys, a file of
    the excluded rows (ascending), which are no dedup key's copy or representative."""

    scratch: str
    kind: str
    partition: int
    runs: int
    lo: str | None
    hi: str | None
    excluded: str | None = None


@dataclass(frozen=True)
class Merged:
    """A merge task's value count (the next partition's code offset), its record rows (the
    next partition's rank offset) and its process."""

    values: int
    records: int
    pid: int
    groups: tuple[tuple[str, int], ...] = ()  # an order partition's rows per group, in order


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


def chunk_runs(ws: Workspace, job: RunJob, spec: object, done: object) -> RunSamples:
    """One chunk's names (for the gather tasks) and its sorted runs of both sets."""
    table = write_names(ws, job.names, also=("kind",))
    sets = {"ids": _ids_run(table, job.names.start), "keys": _keys_run(ws, job, table)}
    counts = pc.value_counts(table["source_id"]).to_pylist() if table.num_rows else []
    sources = tuple((c["values"], c["counts"]) for c in counts)
    return replace(_sorted_runs(Path(job.names.scratch), job.names.index, sets), sources=sources)


def _sorted_runs(scratch: Path, index: int, sets: dict[str, pa.Table]) -> RunSamples:
    """Each set's run sorted by value and written, with its samples and sizes."""
    samples, sizes = {}, {}
    for kind, run in sets.items():
        sizes[kind] = run.nbytes - ROW_BYTES * run.num_rows
        ordered = run.take(pc.sort_indices(run, [("v", "ascending", _AT_END)]))
        _write(run_path(scratch, kind, index), ordered, kind)
        samples[kind] = _samples(ordered.column("v"))
    return RunSamples({k: t.num_rows for k, t in sets.items()}, sizes, samples)


def order_runs(ws: Workspace, job: OrderJob, spec: object, done: object) -> RunSamples:
    """One chunk's eligible rows sorted by group (its class, or the copies), then the total
    order: the near stage's classes and the copies in total order, with no sort on the
    driver."""
    scratch = Path(job.scratch)
    keys = _read(run_path(scratch, "keys", job.index))
    rows = keys.column("row").to_numpy()
    span = (job.start, job.start + job.count)
    eligible = ~sorted_hits(rows_within(job.excluded, span), rows)[1]
    keys = keys.filter(pa.array(eligible))
    copy = sorted_hits(rows_within(job.copies, span), rows[eligible])[1]
    group = pc.if_else(
        pa.array(copy),
        pa.scalar(COPY),
        pc.binary_join_element_wise(REPRESENTATIVE, keys.column("cls"), ""),
    )
    run = pa.table(
        {
            "v": order_key(
                group,
                keys.column("source_rank").to_numpy(),
                keys.column("longer_first").to_numpy(),
                keys.column("record_id"),
            ),
            "row": keys.column("row"),
            "object": keys.column("object"),
            "line": keys.column("line"),
            "cls": group,
        },
        schema=_SCHEMAS["order"],
    )
    return _sorted_runs(scratch, job.index, {"order": run})


def _ids_run(table: pa.Table, start: int) -> pa.Table:
    """Every record id with its row, object, line and dedup key (``own``: it is also the
    row's group id), then each group id unlike its record id (flagged, the record columns
    null). Each row's group is named once: by its flagged value, or its own record id."""
    rows = pa.array(np.arange(start, start + table.num_rows, dtype=np.int64))
    record, group = whole_array(table["record_id"]), whole_array(table["group_id"])
    unlike = _distinct(group, record)
    flagged = pc.sum(unlike).as_py() or 0
    flags = np.r_[np.zeros(table.num_rows, bool), np.ones(flagged, bool)]
    own = pc.invert(unlike).to_numpy(zero_copy_only=False)
    columns = [
        pa.concat_arrays([record, group.filter(unlike)]),
        pa.concat_arrays([rows, rows.filter(unlike)]),
        pa.array(flags),
        pa.array(np.r_[own, np.zeros(flagged, bool)]),
    ]
    for name in ("object", "line", "dedup_key"):
        field = _SCHEMAS["ids"].field("key" if name == "dedup_key" else name)
        columns.append(
            pa.concat_arrays(
                [whole_array(table[name]).cast(field.type), pa.nulls(flagged, field.type)]
            )
        )
    return pa.Table.from_arrays(columns, schema=_SCHEMAS["ids"])


def _keys_run(ws: Workspace, job: RunJob, table: pa.Table) -> pa.Table:
    """Every dedup key with its row's place in the total order."""
    n, start = table.num_rows, job.names.start
    lengths = stored_lengths(ws, job.names.chunk, job.lengths)
    sources = pc.dictionary_encode(whole_array(table["source_id"]), null_encoding="encode")
    ranks = source_ranks(dict(job.source_order), sources.dictionary.to_pylist())
    source_rank = ranks[sources.indices.to_numpy(zero_copy_only=False)]
    columns = [
        whole_array(table["dedup_key"]),
        pa.array(np.arange(start, start + n, dtype=np.int64)),
        pa.array(source_rank),
        pa.array(-lengths),
        whole_array(table["record_id"]),
        whole_array(table["object"]),
        whole_array(table["line"]),
        class_names(table, dict(job.content_of)),
    ]
    return pa.Table.from_arrays(columns, schema=_SCHEMAS["keys"])


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
    """One partition of a set: its rows of every run, sorted and decided, written."""
    scratch = Path(job.scratch)
    parts = []
    for index in range(job.runs):
        run = _read(run_path(scratch, job.kind, index))
        lo, hi = _Sorted(run.column("v")).range(job.lo, job.hi)
        parts.append(run.slice(lo, hi - lo))
    table = pa.concat_tables(parts) if parts else _SCHEMAS[job.kind].empty_table()
    order = [(name, "ascending", _AT_END) for name in _SORT_KEYS[job.kind]]
    table = table.take(pc.sort_indices(table, order)).combine_chunks()
    base = merge_path(scratch, job.kind, job.partition)
    records = 0  # record rows, counted for the ids set's ranks
    groups: tuple[tuple[str, int], ...] = ()
    if job.kind == "ids":
        records = _merge_ids(table, base)
    elif job.kind == "keys":
        _merge_keys(table, base, job.excluded)
    else:
        groups = _merge_order(table, base)
    return Merged(table.num_rows, records, os.getpid(), groups)


def _merge_order(table: pa.Table, base: str) -> tuple[tuple[str, int], ...]:
    """The partition's rows in order, the same rows ascending with their places (the rank
    of a row: :class:`.class_rows.FiledClass`), and how many rows each group holds, in
    order."""
    rows = _narrow(table.column("row").to_numpy())
    by_row = np.argsort(rows, kind="stable")
    _save(base, order_rows=rows, order_by_row=rows[by_row], order_at=_narrow(by_row))
    if not table.num_rows:
        return ()
    counts = pc.value_counts(table.column("cls"))  # first seen first: groups are sorted
    return tuple(
        zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True)
    )


def _merge_ids(table: pa.Table, base: str) -> int:
    """Codes of every value (a new one where it changes), the record rows (ascending) with
    their ranks in the partition, each group's rows and naming row, and the record rows whose
    id an earlier row holds; how many record rows."""
    values = table.column("v").chunk(0) if table.num_rows else pa.array([], pa.string())
    local = np.cumsum(value_changes(values, None)) - 1 if len(values) else np.zeros(0, np.int64)
    flags = table.column("flag").to_numpy(zero_copy_only=False).astype(bool)
    rows = table.column("row").to_numpy()
    ranked = rows[~flags]  # the record rows in rank order
    by_row = np.argsort(ranked, kind="stable")
    _save(base, rank_rows=_narrow(ranked[by_row]), rank_local=_narrow(by_row))
    _save_groups(base, rows, local, flags | table.column("own").to_numpy(zero_copy_only=False))
    records = table.filter(pa.array(~flags))
    repeated, first, same = _repeats(records, local[~flags])
    _save(base, repeated=repeated, first=first, same=same)
    return records.num_rows


def _save_groups(base: str, rows: np.ndarray, codes: np.ndarray, named: np.ndarray) -> None:
    """The rows whose group a value of this partition names (``named``), ascending, with
    their groups' local codes, and per local code its naming row: the group's last row, as
    the driver's :func:`.leakage.leakage_rows` names it (-1: the value names no group)."""
    rows, codes = rows[named], codes[named]
    by = np.argsort(rows, kind="stable")
    rows, codes = rows[by], codes[by]
    naming = np.full(int(codes.max(initial=-1)) + 1, -1, dtype=np.int64)
    np.maximum.at(naming, codes, rows)
    _save(base, group_rows=_narrow(rows), group_codes=_narrow(codes), naming=_narrow(naming))


def _repeats(records: pa.Table, codes: np.ndarray) -> tuple[np.ndarray, ...]:
    """Of record rows sorted by id (``codes``: their values' codes), each row after the first
    (lowest row) of its id, that first row, and whether their dedup keys are equal."""
    rows = records.column("row").to_numpy()
    by = np.lexsort((rows, codes))  # each id's rows ascending: its first row leads
    rows, codes = rows[by], codes[by]
    lead = np.r_[True, codes[1:] != codes[:-1]] if len(codes) else np.zeros(0, bool)
    first_at = np.flatnonzero(lead)[np.cumsum(lead) - 1]
    keys = (
        records.column("key").chunk(0).take(pa.array(by)) if len(by) else pa.array([], pa.string())
    )
    later = np.flatnonzero(~lead)
    distinct = _distinct(keys.take(pa.array(later)), keys.take(pa.array(first_at[later])))
    same = ~np.asarray(distinct.to_numpy(zero_copy_only=False), dtype=bool)
    return rows[later], rows[first_at[later]], same


def _merge_keys(table: pa.Table, base: str, excluded: str | None) -> None:
    """Among the eligible rows of each dedup key, in total order: the first stands for the
    key, the later ones are its copies; the copies and their representatives written."""
    rows = table.column("row").to_numpy()
    out = np.load(excluded) if excluded else np.empty(0, np.int64)
    eligible = ~sorted_hits(out, rows)[1]
    rows = rows[eligible]
    if not len(rows):
        _save(base, copies=rows, match=rows)
        return
    lead = value_changes(table.column("v").chunk(0).filter(pa.array(eligible)), None)
    representative = rows[np.flatnonzero(lead)][np.cumsum(lead) - 1]
    _save(base, copies=_narrow(rows[~lead]), match=_narrow(representative[~lead]))


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


def _write(path: Path, table: pa.Table, kind: str) -> None:
    with ipc.new_file(str(path), _SCHEMAS[kind]) as out:
        out.write_table(table.combine_chunks().cast(_SCHEMAS[kind]))


def _read(path: Path) -> pa.Table:
    return ipc.open_file(pa.memory_map(str(path))).read_all()


def _save(base: str, **arrays: np.ndarray) -> None:
    for name, array in arrays.items():
        np.save(f"{base}-{name}.npy", array)


def _narrow(values: np.ndarray) -> np.ndarray:
    """Row numbers or codes as the driver holds them: int32 below 2**31 (half the bytes it
    loads), else as they are."""
    if len(values) and int(values.max()) >= 2**31:
        return values
    return values.astype(np.int32)


def run_path(scratch: Path, kind: str, index: int) -> Path:
    return scratch / f"run-{kind}-{index:06d}.arrow"


def merge_path(scratch: Path, kind: str, partition: int) -> str:
    return str(scratch / f"merged-{kind}-{partition:05d}")
