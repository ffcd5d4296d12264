"""A near-dedup class run with banding and verification on the task runner.

With more than one worker (``execution.workers > 1`` or engine ``ray``) the driver no longer
bands, fingerprints and verifies a class itself: map tasks write every band's keys by
partition, reduce tasks pair one partition's buckets each, verify tasks verify one partition of
the unique pairs each, once (:mod:`.band_tasks`), and the driver merges the pair partitions'
pairs and Jaccards and runs the unchanged scan (:func:`.near_dedup.scan_verified`). The
candidate pairs, band figures and every Jaccard are those of the in-process path, so verdicts,
edges, report and pairs are the same bytes. The driver holds pairs, never texts, fingerprints
or signatures of all records.

The partition count is a function of the class size, the band count and
``execution.worker_memory_mb`` (never the worker count), though any count gives the same bytes;
tests set another with ``CORPUS_DEDUP_PARTITIONS``. A reduce task holds its partition's
(band, key, rank) rows, their sorted copy and sort order (48 bytes a record and band traced by
``test_band_memory``; the sizing takes 52), then, the rows freed, its candidate pairs (~40
bytes each while they are made unique and split): up to ``bands * 52 / 40`` pairs a record (20
at 16 bands) the rows are the peak. Near-duplicate families larger than that (up to
``bucket_heads`` pairs a record and band) take more, so the bound is an estimate for them.
"""

import bisect
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from corpus_assets.core.dedup.band_index import IndexWriter
from corpus_assets.core.dedup.band_tasks import (
    ROW,
    MapJob,
    ReduceDone,
    ReduceJob,
    VerifyDone,
    VerifyJob,
    band_map,
    band_reduce,
    index_path,
    pair_verify,
)
from corpus_assets.core.dedup.class_rows import ClassOrder, FiledClass, RankLookup
from corpus_assets.core.dedup.minhash import SignatureSpec
from corpus_assets.core.dedup.near_dedup import BandStats, LshParams, NearResult, scan_verified
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.execution import Execution
from corpus_assets.core.runtime.runners import task_runner
from corpus_assets.core.runtime.workspace import Workspace, pooled
from corpus_assets.core.storage.artifacts import Ref

PARTITION_RECORDS = 16384  # class records per band-key partition ...
MAX_PARTITIONS = 256  # ... up to this many partitions, unless the memory bound needs more
MAP_RECORDS = 65536  # class records per map task at least (a group of signature chunks) ...
REDUCE_ROW_BYTES = 52  # a reduce task's bytes per (record, band): rows, sorted copy, order (48)
PAIR_BYTES = 40  # a reduce task's bytes per candidate pair, once its rows are freed
MAP_ROW_BYTES = 80  # a map task's bytes per (record, band): keys, rows, partition, sorted copy


def distributed(execution: Execution) -> bool:
    """Whether near-dedup classes run on the task runner (``execution.stages``)."""
    return execution.stages_on_runner()


def partitions(n: int, bands: int, budget: int) -> int:
    """Band-key partitions of a class of ``n`` records: one per ``PARTITION_RECORDS`` up to
    ``MAX_PARTITIONS``, or more if a reduce task's estimate would exceed ``budget`` bytes
    (``Execution.task_budget_bytes``); the environment may fix it."""
    fixed = int(os.environ.get("CORPUS_DEDUP_PARTITIONS") or 0)
    by_records = min(MAX_PARTITIONS, -(-n // PARTITION_RECORDS))
    return fixed or max(1, by_records, -(-n * bands * REDUCE_ROW_BYTES // budget))


def map_records(bands: int, budget: int) -> int:
    """Class records a map task takes at least (whole signature chunks): ``MAP_RECORDS``, or
    fewer if their keys would exceed ``budget`` bytes."""
    return max(1, min(MAP_RECORDS, budget // (bands * MAP_ROW_BYTES)))


@dataclass(frozen=True)
class BandInputs:
    """What the tasks read: per signature chunk (digest, first row, rows), the canonical
    chunks (texts), the signature spec and the parent's verified pairs (incremental)."""

    signatures: tuple[tuple[str, int, int], ...]
    records: tuple[ChunkRecords, ...]
    spec: SignatureSpec
    parent_pairs: Ref | None = None


class BandRunner:
    """Runs near-dedup classes on the workspace's task runner; counts the work it did."""

    def __init__(self, ws: Workspace, inputs: BandInputs) -> None:
        self.ws, self.inputs = ws, inputs
        self.work: Counter[str] = Counter()

    def wants(self, n: int) -> bool:
        """Whether a class of ``n`` records goes to the runner: its reduce tasks would run on
        workers. (A lone reduce the local runner would run here: the in-process path is the
        same bytes and cheaper, it skips verifying pairs already linked.)"""
        return task_runner(self.ws.config.execution).wants(self._partitions(n))

    def _partitions(self, n: int) -> int:
        execution = self.ws.config.execution
        return partitions(
            n, self.ws.config.policies.dedup.near.bands, execution.task_budget_bytes()
        )

    def run_class(
        self,
        order: ClassOrder,
        params: LshParams,
        thresholds: RankLookup | None,
        index: IndexWriter | None = None,
    ) -> NearResult:
        """The class's :class:`NearResult`, as :func:`.near_dedup.near_dedup` gives it;
        ``index``, if given, receives the class's bands in bucket order (the band index).
        A held order is written for the tasks first (a filed one is the order merges')."""
        n = order.n
        count = self._partitions(n)
        base = self.ws.home / "tmp"
        base.mkdir(parents=True, exist_ok=True)
        scratch = tempfile.mkdtemp(dir=base, prefix="near-band-")
        try:
            if not isinstance(order, FiledClass):
                order = FiledClass.write(Path(scratch) / "class", order.rows())
            maps = self._map_jobs(scratch, order, params, count)
            pooled(self.ws, band_map, maps)
            reduces = [
                ReduceJob(
                    scratch, p, len(maps), count, n, params.bands, params.bucket_heads, bool(index)
                )
                for p in range(count)
            ]
            bands = pooled(self.ws, band_reduce, reduces)
            if index is not None:
                _write_index(index, scratch, count, order)
            verified = pooled(
                self.ws,
                pair_verify,
                [self._verify_job(scratch, q, count, order) for q in range(count)],
            )
            pairs, jaccards, reused = _merged(Path(scratch), count)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        stats = _band_stats(bands, params.bands)
        result = scan_verified(n, pairs, jaccards, stats, params, thresholds)
        result.computed_pairs = sum(d.computed for d in verified)
        result.fingerprinted_now = sum(d.fingerprinted for d in verified)
        self._count(len(maps), bands, verified, reused)
        return result

    def _map_jobs(
        self, scratch: str, order: FiledClass, params: LshParams, count: int
    ) -> list[MapJob]:
        """Consecutive signature chunks holding class rows, grouped to :func:`map_records`."""
        signatures = self.inputs.signatures
        starts = np.array([start for _, start, _ in signatures], dtype=np.int64)
        size = map_records(params.bands, self.ws.config.execution.task_budget_bytes())
        held = np.zeros(len(signatures), dtype=np.int64)  # class rows per chunk
        for piece in order.pieces():  # a piece at a time: no int64 per row
            chunk = np.searchsorted(starts, piece, side="right") - 1
            held += np.bincount(chunk, minlength=len(signatures))
        groups: list[list[tuple[str, int, int]]] = [[]]
        in_group = 0
        for chunk, rows in zip(signatures, held.tolist(), strict=True):
            if not rows:
                continue
            if in_group >= size:
                groups.append([])
                in_group = 0
            groups[-1].append(chunk)
            in_group += rows
        return [
            MapJob(scratch, i, tuple(g), params.bands, params.rows, count, order)
            for i, g in enumerate(groups)
        ]

    def _verify_job(
        self, scratch: str, partition: int, reduces: int, order: FiledClass
    ) -> VerifyJob:
        inputs = self.inputs
        return VerifyJob(
            scratch,
            partition,
            reduces,
            order.n,
            inputs.spec,
            inputs.records,
            inputs.parent_pairs,
            order,
        )

    def _count(
        self, maps: int, bands: list[ReduceDone], verified: list[VerifyDone], reused: int
    ) -> None:
        """Work figures for the layer's run_stats (never hashed)."""
        here = os.getpid()
        self.work["band_map_tasks"] += maps
        self.work["band_reduce_tasks"] += len(bands)
        self.work["band_reduce_elsewhere"] += sum(d.pid != here for d in bands)
        self.work["pair_verify_tasks"] += len(verified)
        self.work["pair_verify_elsewhere"] += sum(d.pid != here for d in verified)
        self.work["band_pairs_verified"] += sum(d.pairs for d in verified)
        self.work["pairs_reused"] += reused


def _write_index(index: IndexWriter, scratch: str, count: int, order: ClassOrder) -> None:
    """Each band's rows of every reduce partition in bucket order: keys are sorted in each
    partition and the partitions are ranges of keys in order (``band_tasks.key_partition``),
    so their concatenation is sorted (the boundaries checked first; a stable sort by key
    otherwise, which gives the same rows). A sorted band goes from the files to the index a
    slice at a time: the driver holds ``WRITE_ROWS`` rows, not a band's (~50 bytes a class
    record: +26 MB at 459k), nor the partitions mapped whole (+140 MB at 1.1 GB of raw
    text)."""
    runs = [_BandRuns.open(index_path(scratch, p), index.bands) for p in range(count)]
    for band in range(index.bands):
        if _in_bucket_order(runs, band):
            parts = (s for run in runs for s in run.slices(band))
            index.add_parts((s["key"], order[s["rank"]]) for s in parts)
            continue
        rows = np.concatenate([run.band(band) for run in runs])
        rows = rows[np.argsort(rows["key"], kind="stable")]
        index.add(rows["key"], order[rows["rank"]])
    index.close()


def _in_bucket_order(runs: list["_BandRuns"], band: int) -> bool:
    """Whether the band's keys never decrease from one partition to the next. Each partition's
    rows are sorted by its reduce task (as the bisection for the band bounds assumes), so only
    the boundaries are read: two keys a partition, not the band again."""
    last = None
    for run in runs:
        ends = run.end_keys(band)
        if ends is None:
            continue
        if last is not None and ends[0] < last:
            return False
        last = ends[1]
    return True


WRITE_ROWS = 1 << 16  # band rows read and written at a time by the driver


@dataclass(frozen=True)
class _BandRuns:
    """A reduce partition's sorted ``ROW`` file (an ``.npy``): where each band's rows lie."""

    path: Path
    offset: int  # the data's first byte
    bounds: np.ndarray  # band b's rows are [bounds[b], bounds[b + 1])

    @classmethod
    def open(cls, path: Path, bands: int) -> "_BandRuns":
        with open(path, "rb") as file:
            version = np.lib.format.read_magic(file)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(file)
            else:
                shape, _, dtype = np.lib.format.read_array_header_2_0(file)
            if dtype != ROW or len(shape) != 1:
                raise ValueError(f"{path.name}: {dtype} {shape}, not a reduce partition's rows")
            offset = file.tell()
            return cls(path, offset, _band_starts(file.fileno(), offset, shape[0], bands))

    def band(self, band: int) -> np.ndarray:
        lo, hi = int(self.bounds[band]), int(self.bounds[band + 1])
        return self._read(lo, hi)

    def slices(self, band: int) -> Iterator[np.ndarray]:
        """The band's rows, ``WRITE_ROWS`` at a time."""
        lo, hi = int(self.bounds[band]), int(self.bounds[band + 1])
        for start in range(lo, hi, WRITE_ROWS):
            yield self._read(start, min(start + WRITE_ROWS, hi))

    def end_keys(self, band: int) -> tuple[int, int] | None:
        """The band's first and last key here (None: no row of it)."""
        lo, hi = int(self.bounds[band]), int(self.bounds[band + 1])
        if hi == lo:
            return None
        return int(self._read(lo, lo + 1)["key"][0]), int(self._read(hi - 1, hi)["key"][0])

    def _read(self, lo: int, hi: int) -> np.ndarray:
        start = self.offset + lo * ROW.itemsize
        return np.fromfile(self.path, dtype=ROW, count=hi - lo, offset=start)


def _band_starts(fd: int, offset: int, rows: int, bands: int) -> np.ndarray:
    """Where each band's rows start (and the end) in a reduce partition's file, sorted by
    band, by bisection over single reads of the band field (the first of ``ROW``): ~20 reads
    a band. Mapping the file for it cost +20 MB of the driver's peak at 400k rows (every
    fault maps its neighbours too), ``np.searchsorted`` on the mapped field a copy of it."""

    def band_at(row: int) -> int:
        return int.from_bytes(os.pread(fd, 4, offset + row * ROW.itemsize), "little")

    starts = [bisect.bisect_left(range(rows), b, key=band_at) for b in range(bands + 1)]
    return np.array(starts, dtype=np.int64)


def _band_stats(done: list[ReduceDone], bands: int) -> list[BandStats]:
    """Each band's figures over every partition: sums, and the largest bucket's maximum."""
    out = []
    for band in range(bands):
        rows = np.array([d.bands[band] for d in done], dtype=np.int64).reshape(-1, 6)
        total = rows.sum(axis=0)
        out.append(
            BandStats(
                band=band,
                buckets=int(total[0]),
                records=int(total[1]),
                largest=int(rows[:, 2].max(initial=0)),
                capped_buckets=int(total[3]),
                pairs=int(total[4]),
                pairs_skipped_by_cap=int(total[5]),
            )
        )
    return out


def _merged(scratch: Path, count: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Every pair partition's pairs (sorted by x then y), their Jaccards, and how many of them
    the parent had verified (known before any was computed)."""
    pairs, jaccards, known = [], [], []
    for p in range(count):
        pairs.append(np.load(scratch / f"pairs-{p:05d}.npy"))
        jaccards.append(np.load(scratch / f"jaccards-{p:05d}.npy"))
        known.append(np.load(scratch / f"known-{p:05d}.npy"))
    packed = np.concatenate(pairs) if pairs else np.empty(0, dtype=np.int64)
    by_pair = np.argsort(packed, kind="stable")
    packed = packed[by_pair]
    first = np.r_[True, packed[1:] != packed[:-1]] if len(packed) else np.zeros(0, dtype=bool)
    picked = by_pair[first]
    all_known = np.concatenate(known) if known else np.zeros(0, dtype=bool)
    all_jaccards = np.concatenate(jaccards) if jaccards else np.empty(0, dtype=np.float64)
    return packed[first], all_jaccards[picked], int(all_known[picked].sum())
