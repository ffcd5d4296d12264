"""Dedup's id order, repeated ids, exact copies and total order from the runner's merge tasks.

The :class:`.coding.Coding` where the stages run on the task runner. At construction a runs
task per canonical chunk and a merge task per partition of the ids set run
(:mod:`.code_tasks`); the driver keeps the repeated rows the merges found. Each merge keeps
its record rows (ascending) with their ranks in the partition, which the output phases read a
slice at a time from the mapped files (:class:`.row_values.PartedRows`). The groups stay in
the merges' files until
the leakage groups ask for them, after the near stage: the driver looks up only the edges'
rows' groups, finds the components among those, and reads each row's naming row from the
mapped files a slice at a time as the output phases ask. Exact copies need the excluded rows
first (tombstones and repeated ids), so the keys set's merges run when ``decide`` asks for
them, and hand back only the copies and their representatives; then the order set's runs and
merges put each near class's representatives and the copies in total order, in files the
near stage's band tasks read (:class:`.class_rows.FiledClass`). The driver never holds a
record id, dedup key, group, kind or source code, nor any order of every row, and sorts no
value; the merges' files stay in the scratch folder to the end of the layer's run.
"""

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from corpus_assets.core.dedup.class_rows import FiledClass, OrderSlice
from corpus_assets.core.dedup.cluster_tasks import Names, NamesJob
from corpus_assets.core.dedup.code_tasks import (
    COPY,
    REPRESENTATIVE,
    Merged,
    MergeJob,
    OrderJob,
    RunJob,
    RunSamples,
    chunk_runs,
    merge_partition,
    merge_partitions,
    merge_path,
    order_runs,
    run_path,
    splitters,
)
from corpus_assets.core.dedup.coding import Classes, Exact, Repeated
from corpus_assets.core.dedup.leakage import ROOT_SLICE, components
from corpus_assets.core.dedup.order import sorted_hits
from corpus_assets.core.dedup.partition_db import Coded, PartitionDb, RecordCodes, code_dtype
from corpus_assets.core.dedup.row_values import (
    Leakage,
    PartedRows,
    RowValues,
    Values,
    load_merged,
    mapped_merged,
    write_npy,
)
from corpus_assets.core.dedup.verdicts import Verdicts
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.workspace import Workspace, pooled


class TaskCoding:
    """The runs and the ids merges, run at construction; the keys merges on :meth:`exact`.
    ``lengths``: each chunk's text lengths digest. Each fact is handed over once, as
    ``decide`` asks (this object keeps no copy); its ``work`` counts the tasks and those that
    ran in another process (run figures, never hashed)."""

    def __init__(
        self,
        ws: Workspace,
        chunks: list[ChunkRecords],
        lengths: list[str],
        source_order: dict[str, int],
        scratch: Path,
        content_of: dict[str, str] | None = None,
    ) -> None:
        """``content_of``: each source's content, which names the near-dedup classes (None:
        no near stage, one class)."""
        self.ws, self.scratch, self.work = ws, scratch, Counter[str]()
        starts = np.cumsum([0, *(c.count for c in chunks)], dtype=np.int64)
        self.n = int(starts[-1])
        self._spans = [(int(starts[i]), c.count) for i, c in enumerate(chunks)]
        ranks = tuple(sorted(source_order.items()))
        contents = tuple(sorted((content_of or {}).items()))
        jobs = [
            RunJob(NamesJob(str(scratch), i, c, int(starts[i])), lengths[i], ranks, contents)
            for i, c in enumerate(chunks)
        ]
        self.sampled: list[RunSamples] = pooled(ws, chunk_runs, jobs)
        self.work["code_run_tasks"] += len(jobs)
        self._ids = self._merged("ids", self.sampled)
        self._remove_runs("ids")
        bases = [merge_path(scratch, j.kind, j.partition) for j, _ in self._ids]
        offsets = np.cumsum([0, *(m.records for _, m in self._ids)])[:-1].tolist()
        self._ranked = list(zip(bases, offsets, strict=True))  # each partition's first rank
        self._repeated = _joined_repeats(
            [load_merged(base, "repeated", "first", "same") for base in bases]
        )

    def codes(self, db: PartitionDb) -> RecordCodes:
        """No codes: no record id, dedup key or group code is held (the groups stay in the
        merges' files until :meth:`leakage` asks, after the near stage), and no kind or source
        code (the classes come from the order merges, the counts by source from the runs and
        the names of the rows not kept)."""
        none = [Coded(np.empty(0, dtype=np.int64), []) for _ in range(5)]
        return RecordCodes(self.n, *none)

    def per_source(self, codes: RecordCodes, state: Verdicts) -> dict[str, dict[str, int]]:
        """Each source's rows from the runs, the sources of the rows not kept read from the
        chunks' names: no source code per row."""
        totals: Counter[str | None] = Counter()
        for sampled in self.sampled:
            totals.update(dict(sampled.sources))
        names = list(totals)  # any order: the counts come back by name
        code_of = {name: code for code, name in enumerate(names)}
        starts = tuple(start for start, _ in self._spans)
        held = pc.dictionary_encode(
            Names(self.scratch, starts).take(state.rows, "source_id"), null_encoding="encode"
        )
        codes_of = np.array([code_of[v] for v in held.dictionary.to_pylist()], dtype=np.int64)
        held_codes = codes_of[held.indices.to_numpy(zero_copy_only=False)]
        totals_in = np.array(list(totals.values()), dtype=np.int64)
        return state.per_source_held(totals_in, held_codes, names)

    def leakage(self, codes: RecordCodes, a: np.ndarray, b: np.ndarray) -> Leakage:
        """Per row, its leakage group's naming row (:func:`.leakage.leakage_rows`' answer)
        from the ids merges' group rows, read a slice at a time, and how many groups: the
        driver holds the edges' groups and their components' naming rows, never a group code
        or an answer per row."""
        parts = _group_parts(self.scratch, self._ids)
        self._ids = []
        dtype = code_dtype(self.n)
        edge_rows = np.unique(np.concatenate([a, b]).astype(dtype, copy=False))
        edge_groups, edge_names = _edge_groups(parts, edge_rows, dtype)
        touched = np.unique(edge_groups)
        names = np.empty(len(touched), dtype=dtype)
        names[np.searchsorted(touched, edge_groups)] = edge_names
        del edge_names
        ends = _touched_ends(edge_rows, edge_groups, touched, a, b)
        del edge_rows, edge_groups
        roots = components(len(touched), ends[: len(a)], ends[len(a) :])
        del ends
        groups = _named_groups(parts, touched, names[roots], dtype)
        merged = len(touched) - len(np.unique(roots))  # groups an edge joined to another
        rows = PartedRows(self.n, np.dtype(dtype), [_named(p.base, dtype) for p in parts])
        return Leakage(rows, groups - merged)

    def rank_rows(self, db: PartitionDb, codes: RecordCodes) -> RowValues:
        """Read a slice at a time from the ids merges' files."""
        dtype = np.dtype(code_dtype(self.n))
        parts = []
        for base, first in self._ranked:
            rows, local = mapped_merged(base, "rank_rows", "rank_local")
            parts.append((rows, _offset(local, dtype.type(first), dtype)))
        return PartedRows(self.n, dtype, parts)

    def repeated(self, codes: RecordCodes) -> Repeated:
        return self._repeated

    def exact(self, db: PartitionDb, codes: RecordCodes, excluded: np.ndarray) -> Exact:
        """The keys merges over the rows not ``excluded`` (ascending), then the order runs
        and merges over the rest: each class's representatives and the copies in total order
        come from the runner (the source ranks and contents were the runs'). The driver
        holds the copies and their representatives, never an order of every row."""
        db.drop_lengths()  # read by the driver's total order only
        out = self.scratch / "excluded.npy"
        np.save(out, np.asarray(excluded, dtype=np.int64))
        copies, match = self._copies(self._merged("keys", self.sampled, str(out)))
        copied = self.scratch / "copies.npy"
        np.save(copied, copies)
        jobs = [
            OrderJob(str(self.scratch), i, start, count, str(out), str(copied))
            for i, (start, count) in enumerate(self._spans)
        ]
        sampled = pooled(self.ws, order_runs, jobs)
        self.work["code_order_run_tasks"] += len(jobs)
        self._remove_runs("keys")
        out.unlink()
        copied.unlink()
        groups = _order_groups(self.scratch, self._merged("order", sampled))
        self._remove_runs("order")
        dtype = np.dtype(code_dtype(self.n)).name
        in_order = FiledClass(tuple(groups.pop(COPY, [])), dtype).rows()
        match_in_order = match[np.searchsorted(copies, in_order)].astype(dtype)
        classes: Classes = {
            name.removeprefix(REPRESENTATIVE): FiledClass(tuple(slices), dtype)
            for name, slices in groups.items()
        }
        return Exact(classes, in_order, match_in_order)

    def _copies(self, done: list[tuple[MergeJob, Merged]]) -> tuple[np.ndarray, np.ndarray]:
        """The keys merges' copies (ascending) and each one's representative."""
        found = [
            load_merged(merge_path(self.scratch, "keys", j.partition), "copies", "match")
            for j, _ in done
        ]
        dtype = code_dtype(self.n)
        copies = np.concatenate([c for c, _ in found], dtype=dtype) if found else np.empty(0, dtype)
        match = np.concatenate([m for _, m in found], dtype=dtype) if found else np.empty(0, dtype)
        del found
        by_row = np.argsort(copies)
        return copies[by_row], match[by_row]

    def _merged(
        self, kind: str, sampled: list[RunSamples], excluded: str | None = None
    ) -> list[tuple[MergeJob, Merged]]:
        """One set's merge tasks, run, with what each returned."""
        budget = self.ws.config.execution.task_budget_bytes()
        jobs = _merge_jobs(self.scratch, kind, sampled, budget, excluded)
        merged: list[Merged] = pooled(self.ws, merge_partition, jobs)
        self.work["code_merge_tasks"] += len(jobs)
        self.work["code_merge_elsewhere"] += sum(m.pid != os.getpid() for m in merged)
        return list(zip(jobs, merged, strict=True))

    def _remove_runs(self, kind: str) -> None:
        for index in range(len(self.sampled)):
            run_path(self.scratch, kind, index).unlink()


def _merge_jobs(
    scratch: Path, kind: str, sampled: list[RunSamples], budget: int, excluded: str | None
) -> list[MergeJob]:
    """A set's merge jobs, one per partition between the splitters of its samples."""
    values = sum(s.values[kind] for s in sampled)
    value_bytes = sum(s.value_bytes[kind] for s in sampled)
    count = merge_partitions(values, value_bytes, budget)
    cuts = splitters([v for s in sampled for v in s.samples[kind]], count)
    bounds = [None, *cuts, None]
    return [
        MergeJob(str(scratch), kind, p, len(sampled), bounds[p], bounds[p + 1], excluded)
        for p in range(len(cuts) + 1)
    ]


def _order_groups(
    scratch: Path, merged: list[tuple[MergeJob, Merged]]
) -> dict[str, list[OrderSlice]]:
    """Each group of the order set (a class's representatives, the copies) as slices of the
    partitions' files, in order; the groups in order."""
    groups: dict[str, list[OrderSlice]] = {}
    for job, done in merged:
        base = merge_path(scratch, "order", job.partition)
        at = 0
        for name, count in done.groups:
            groups.setdefault(name, []).append(OrderSlice(base, at, at + count))
            at += count
    return groups


def _offset(local: np.ndarray, first: np.integer, dtype: np.dtype) -> Values:
    """A partition's ranks: its local ranks after the partitions before."""
    return lambda at: np.asarray(local[at], dtype=dtype) + first


@dataclass(frozen=True)
class _GroupPart:
    """One ids partition's group files and the codes of the partitions before it."""

    base: str
    offset: int
    values: int


def _group_parts(scratch: Path, done: list[tuple[MergeJob, Merged]]) -> list[_GroupPart]:
    offsets = np.cumsum([0, *(merged.values for _, merged in done)])
    return [
        _GroupPart(merge_path(scratch, job.kind, job.partition), int(offsets[i]), merged.values)
        for i, (job, merged) in enumerate(done)
    ]


def _group_slices(part: _GroupPart) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """A partition's group rows and their local codes ``ROOT_SLICE`` at a time, with its
    naming rows by local code, all memory-mapped: memory holds a slice's temporaries."""
    rows, codes, naming = mapped_merged(part.base, *_GROUP_FILES)
    for lo in range(0, len(rows), ROOT_SLICE):
        yield (
            np.asarray(rows[lo : lo + ROOT_SLICE]),
            np.asarray(codes[lo : lo + ROOT_SLICE]),
            naming,
        )


def _edge_groups(
    parts: list[_GroupPart], edge_rows: np.ndarray, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """Per edge row (ascending), its group code and that group's naming row (``dtype``):
    each partition's group rows looked up among the edge rows (O(rows log edges) in all)."""
    total = parts[-1].offset + parts[-1].values if parts else 0
    groups = np.full(len(edge_rows), -1, dtype=code_dtype(total))
    names = np.full(len(edge_rows), -1, dtype=dtype)
    for part in parts if len(edge_rows) else []:
        for rows, codes, naming in _group_slices(part):
            at, hit = sorted_hits(edge_rows, rows)
            groups[at[hit]] = codes[hit] + groups.dtype.type(part.offset)
            names[at[hit]] = naming[codes[hit]]
    if (groups < 0).any():
        raise RuntimeError("an edge row is in no ids partition's groups")
    return groups, names


def _touched_ends(
    edge_rows: np.ndarray,
    edge_groups: np.ndarray,
    touched: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
) -> np.ndarray:
    """Each edge's two ends (``a`` then ``b``) as indices into the ``touched`` groups, in
    ``edge_rows``' dtype, found a slice of ends at a time (bounds the searches' temporaries)."""
    ends = np.empty(len(a) + len(b), dtype=edge_rows.dtype)
    for offset, side in ((0, a), (len(a), b)):
        for lo in range(0, len(side), ROOT_SLICE):
            rows = side[lo : lo + ROOT_SLICE]
            groups = edge_groups[np.searchsorted(edge_rows, rows)]
            ends[offset + lo : offset + lo + len(rows)] = np.searchsorted(touched, groups)
    return ends


def _named_groups(
    parts: list[_GroupPart], touched: np.ndarray, root_names: np.ndarray, dtype: type
) -> int:
    """Each partition's naming row by local code written as its ``named`` file, a slice at a
    time: the group's own, or its component root's where the edges touch it (``touched``
    codes ascending, ``root_names`` theirs); how many groups in all."""
    groups = 0

    def rooted(naming: np.ndarray, offset: int) -> Iterator[np.ndarray]:
        nonlocal groups
        for lo in range(0, len(naming), ROOT_SLICE):
            named = np.array(naming[lo : lo + ROOT_SLICE], dtype=dtype)  # a copy: mapped
            groups += int(np.count_nonzero(named >= 0))  # -1: a value naming no group
            a, b = np.searchsorted(touched, [offset + lo, offset + lo + len(named)])
            named[touched[a:b] - (offset + lo)] = root_names[a:b]
            yield named

    for part in parts:
        (naming,) = mapped_merged(part.base, "naming")
        path = Path(f"{part.base}-named.npy")
        write_npy(path, np.dtype(dtype), len(naming), rooted(naming, part.offset))
    return groups


def _named(base: str, dtype: type) -> tuple[np.ndarray, Values]:
    """A partition's group rows with their answers: each one's naming row, from its group's
    code and the partition's ``named`` file."""
    rows, codes, named = mapped_merged(base, "group_rows", "group_codes", "named")
    return rows, lambda at: np.asarray(named[np.asarray(codes[at])], dtype=dtype)


_GROUP_FILES = ("group_rows", "group_codes", "naming")


def _joined_repeats(parts: list[tuple[np.ndarray, ...]]) -> Repeated:
    """The partitions' repeated rows in one, ascending by row."""
    if not parts:
        empty = np.empty(0, dtype=np.int64)
        return Repeated(empty, empty, np.empty(0, dtype=bool))
    rows, first, same = (np.concatenate(column) for column in zip(*parts, strict=True))
    by = np.argsort(rows, kind="stable")
    return Repeated(rows[by], first[by], same[by])
