"""Dedup's codes, id order, repeated ids and exact copies from the runner's merge tasks.

The :class:`.coding.Coding` where the stages run on the task runner. At construction a runs
task per canonical chunk and a merge task per partition of the ids set run
(:mod:`.code_tasks`); the driver places each row's rank by record id and keeps the repeated
rows the merges found. The group codes stay in the merges' files until the leakage groups ask
for them, after the near stage. Exact copies need the excluded rows first (tombstones and
repeated ids), so the keys set's merges run when ``decide`` asks for them, and hand back only
the copies and their representatives. The driver never holds a record id code or a dedup key
code, and sorts no value.
"""

import os
from collections import Counter
from pathlib import Path

import numpy as np

from corpus_assets.core.dedup.cluster_tasks import NamesJob
from corpus_assets.core.dedup.code_tasks import (
    Merged,
    MergeJob,
    RunJob,
    RunSamples,
    chunk_runs,
    load_merged,
    merge_partition,
    merge_partitions,
    merge_path,
    run_path,
    splitters,
)
from corpus_assets.core.dedup.coding import Exact, Repeated
from corpus_assets.core.dedup.partition_db import Coded, PartitionDb, RecordCodes, code_dtype
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
    ) -> None:
        self.ws, self.scratch, self.work = ws, scratch, Counter[str]()
        starts = np.cumsum([0, *(c.count for c in chunks)], dtype=np.int64)
        self.n = int(starts[-1])
        ranks = tuple(sorted(source_order.items()))
        jobs = [
            RunJob(NamesJob(str(scratch), i, c, int(starts[i])), lengths[i], ranks)
            for i, c in enumerate(chunks)
        ]
        self.sampled: list[RunSamples] = pooled(ws, chunk_runs, jobs)
        self.work["code_run_tasks"] += len(jobs)
        self._ids = self._merged("ids")
        self._remove_runs("ids")
        self._rank, self._repeated = _placed_ranks(scratch, self._ids, self.n)

    def codes(self, db: PartitionDb) -> RecordCodes:
        """Kind and source codes: no record id, dedup key or group code is held (the group
        codes are placed when :meth:`group_codes` asks, after the near stage)."""
        return db.codes(tuple(Coded(np.empty(0, dtype=np.int64), []) for _ in range(3)))

    def group_codes(self, codes: RecordCodes) -> np.ndarray:
        groups = _placed_groups(self.scratch, self._ids, self.n)
        self._ids = []
        return groups

    def id_rank(self, db: PartitionDb, codes: RecordCodes) -> np.ndarray:
        rank, self._rank = self._rank, np.empty(0, dtype=np.int64)
        return rank

    def repeated(self, codes: RecordCodes) -> Repeated:
        return self._repeated

    def exact(self, codes: RecordCodes, eligible: np.ndarray, excluded: np.ndarray) -> Exact:
        """The keys merges over the rows not ``excluded`` (ascending); their copies put back
        in ``eligible``'s order (the total order's)."""
        path = self.scratch / "excluded.npy"
        np.save(path, np.asarray(excluded, dtype=np.int64))
        done = self._merged("keys", str(path))
        self._remove_runs("keys")
        path.unlink()
        found = [
            load_merged(merge_path(self.scratch, "keys", j.partition), "copies", "match")
            for j, _ in done
        ]
        copies = np.concatenate([c for c, _ in found]) if found else np.empty(0, np.int64)
        match = np.concatenate([m for _, m in found]) if found else np.empty(0, np.int64)
        dtype = code_dtype(self.n)
        match_of = np.full(self.n, -1, dtype=dtype)  # by row: its representative, -1 if none
        match_of[copies] = match
        del copies, match, found
        copied = match_of[eligible] >= 0
        in_order = eligible[copied]
        return Exact(eligible[~copied], in_order, match_of[in_order])

    def _merged(self, kind: str, excluded: str | None = None) -> list[tuple[MergeJob, Merged]]:
        """One set's merge tasks, run, with what each returned."""
        budget = self.ws.config.execution.task_budget_bytes()
        jobs = _merge_jobs(self.scratch, kind, self.sampled, budget, excluded)
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


def _placed_ranks(
    scratch: Path, done: list[tuple[MergeJob, Merged]], n: int
) -> tuple[np.ndarray, Repeated]:
    """Ranks by record id, by row, from the ids partitions (each one's local ranks offset by
    the record rows of the partitions before), and the repeated rows they found."""
    rank = np.empty(n, dtype=code_dtype(n))
    repeated: list[tuple[np.ndarray, ...]] = []
    ranked = 0
    for job, merged in done:
        base = merge_path(scratch, job.kind, job.partition)
        (in_rank_order,) = load_merged(base, "ranked")
        rank[in_rank_order] = np.arange(ranked, ranked + len(in_rank_order), dtype=rank.dtype)
        del in_rank_order  # before the next partition's are loaded
        repeated.append(load_merged(base, "repeated", "first", "same"))
        ranked += merged.records
    return rank, _joined_repeats(repeated)


def _placed_groups(scratch: Path, done: list[tuple[MergeJob, Merged]], n: int) -> np.ndarray:
    """Group codes by row from the ids partitions (each one's local codes offset by the
    values of the partitions before): a row's group id is its record id unless flagged."""
    dtype = code_dtype(max(sum(m.values for _, m in done), 1))
    codes = np.zeros(n, dtype=dtype)
    groups = np.full(n, -1, dtype=dtype)
    offset = 0
    for job, merged in done:
        base = merge_path(scratch, job.kind, job.partition)
        rows, placed, flagged = load_merged(base, "rows", "codes", "flags")
        placed = placed.astype(dtype, copy=False)
        placed += offset
        codes[rows[~flagged]], groups[rows[flagged]] = placed[~flagged], placed[flagged]
        del rows, placed, flagged  # before the next partition's are loaded
        offset += merged.values
    own = groups < 0
    groups[own] = codes[own]
    return groups


def _joined_repeats(parts: list[tuple[np.ndarray, ...]]) -> Repeated:
    """The partitions' repeated rows in one, ascending by row."""
    if not parts:
        empty = np.empty(0, dtype=np.int64)
        return Repeated(empty, empty, np.empty(0, dtype=bool))
    rows, first, same = (np.concatenate(column) for column in zip(*parts, strict=True))
    by = np.argsort(rows, kind="stable")
    return Repeated(rows[by], first[by], same[by])
