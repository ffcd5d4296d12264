"""Near-dedup banding and verification as worker tasks: map by band key, reduce by partition.

A class run on more than one worker (:mod:`.band_runner`) shares a scratch folder under the
data home (every worker, Ray's included, sees the same paths); the class's rows in total
order are the order merges' files, named in each job (:class:`.class_rows.FiledClass`: a map
task reads the ranks of its rows, a verify task the rows of its ranks).

- **map** (one task per group of signature chunks): every band's key of the group's class
  rows (:func:`.near_dedup.band_keys`, unchanged), written as ``(band, key, rank)`` rows
  grouped by partition into one file with the partition offsets. It holds one group's keys.
  A partition is a range of keys (:func:`key_partition`: the keys' top bits, which their
  fold mixes evenly), so the partitions' sorted rows of a band, one after another, are that
  band's rows in key order: the band index is their concatenation, no merge.
- **reduce** (one task per partition): the partition's rows from every map file, sorted by
  (band, key, rank); a bucket is one (band, key), so it lies in one partition whole and
  :func:`.near_dedup.star_pairs` gives exactly its pairs and figures. Its unique pairs are
  written split by a hash of the pair (``paired-<p>.bin``): a pair colliding in buckets of
  several partitions (several bands) lands in one pair partition from each.
- **verify** (one task per pair partition): its pairs from every reduce file, unique, all
  verified there: the parent's known Jaccards looked up by text digest (incremental builds),
  the others from fingerprints of the canonical texts. Output: the packed pairs, Jaccards and
  known flags (``pairs-<q>.npy``, ``jaccards-``, ``known-``).

Each candidate pair is verified once; the scan may need fewer (it skips pairs already linked).
"""

import os
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.dedup.class_rows import FiledClass, KnownRanks, RankLookup
from corpus_assets.core.dedup.fingerprint_store import (
    SpilledFingerprints,
    TextLookup,
    text_digests,
)
from corpus_assets.core.dedup.jaccard import jaccard_sorted
from corpus_assets.core.dedup.minhash import SignatureSpec
from corpus_assets.core.dedup.near_dedup import BandStats, _unique, band_keys, star_pairs
from corpus_assets.core.dedup.signature_cache import BandMajorFile
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import Ref
from corpus_assets.core.storage.cas_queries import Spilling, cas_parquet

ROW = np.dtype([("band", "<u4"), ("key", "<u8"), ("rank", "<i8")])
_PAIR_MIX = np.uint64(0x9E3779B97F4A7C15)  # spreads packed pairs over the verify tasks
LOOKUP_MEMORY_LIMIT = "128MB"  # the parent-pairs join's DuckDB buffers; beyond, it spills


@dataclass(frozen=True)
class MapJob:
    """One group of signature chunks: (signatures digest, first row, rows) each."""

    scratch: str
    index: int
    chunks: tuple[tuple[str, int, int], ...]
    bands: int
    rows: int
    partitions: int
    order: FiledClass


@dataclass(frozen=True)
class ReduceJob:
    """One band-key partition of a class run: its buckets paired."""

    scratch: str
    partition: int
    maps: int
    partitions: int
    n: int
    bands: int
    heads: int
    index: bool = False  # keep the partition's sorted rows for the band index


@dataclass(frozen=True)
class VerifyJob:
    """One pair partition of a class run and what verifying its pairs needs."""

    scratch: str
    partition: int
    reduces: int
    n: int
    spec: SignatureSpec
    records: tuple[ChunkRecords, ...]
    parent_pairs: Ref | None
    order: FiledClass


@dataclass(frozen=True)
class ReduceDone:
    """Per band (buckets, records, largest, capped, pairs, skipped) of one partition's buckets,
    and the process it ran in."""

    bands: tuple[tuple[int, ...], ...]
    pid: int


@dataclass(frozen=True)
class VerifyDone:
    """The pairs a verify task had (computed or known), fingerprinted records, its process."""

    pairs: int
    computed: int
    known: int
    fingerprinted: int
    pid: int


def map_path(scratch: str, index: int) -> Path:
    return Path(scratch) / f"map-{index:05d}.bin"


def band_map(ws: Workspace, job: MapJob, _spec: Any = None, _done: Any = None) -> int:
    """Write the group's (band, key, rank) rows by partition; returns how many rows."""
    parts = []
    for digest, start, count in job.chunks:
        inside, ranks = job.order.ranks_within(start, start + count)
        inside -= start  # the class's rows of the chunk, ascending
        block = BandMajorFile.open(ws.cas.path(digest))  # verified by the driver's load
        for band in range(job.bands):
            keys = band_keys(block.band(band, job.rows), band)[inside]
            rows = np.empty(len(keys), dtype=ROW)
            rows["band"], rows["key"], rows["rank"] = band, keys, ranks
            parts.append(rows)
    rows = np.concatenate(parts) if parts else np.empty(0, dtype=ROW)
    del parts
    partition = key_partition(rows["key"], job.partitions)
    _write_split(map_path(job.scratch, job.index), rows, partition, job.partitions)
    return len(rows)


def key_partition(keys: np.ndarray, partitions: int) -> np.ndarray:
    """Each key's partition of ``partitions`` equal ranges of the 64-bit keys (by their top 32
    bits): partition numbers rise with the keys."""
    return (((keys >> np.uint64(32)) * np.uint64(partitions)) >> np.uint64(32)).astype(np.int64)


def _write_split(path: Path, values: np.ndarray, partition: np.ndarray, count: int) -> None:
    """``values`` grouped by partition into one file, with the partitions' offsets beside."""
    values = values[np.argsort(partition, kind="stable")]
    offsets = np.r_[0, np.cumsum(np.bincount(partition, minlength=count))]
    values.tofile(path)
    np.save(path.with_suffix(".off.npy"), offsets.astype(np.int64))


def _read_split(paths: list[Path], partition: int, dtype: np.dtype) -> np.ndarray:
    """One partition's values from each of ``paths`` (:func:`_write_split` files), joined."""
    parts = [np.empty(0, dtype=dtype)]
    for path in paths:
        offsets = np.load(path.with_suffix(".off.npy"))
        lo, hi = int(offsets[partition]), int(offsets[partition + 1])
        parts.append(np.fromfile(path, dtype=dtype, count=hi - lo, offset=lo * dtype.itemsize))
    return np.concatenate(parts)


def _partition_rows(job: ReduceJob) -> np.ndarray:
    """The partition's rows from every map file, sorted by (band, key, rank)."""
    paths = [map_path(job.scratch, index) for index in range(job.maps)]
    rows = _read_split(paths, job.partition, ROW)
    return rows[np.lexsort((rows["rank"], rows["key"], rows["band"]))]


def index_path(scratch: str, partition: int) -> Path:
    """A reduce task's rows sorted by (band, key, rank): its share of the band index."""
    return Path(scratch) / f"index-{partition:05d}.npy"


def _pairs(job: ReduceJob) -> tuple[np.ndarray, list[BandStats]]:
    """The partition's unique packed pairs and each band's figures over its buckets."""
    rows = _partition_rows(job)
    if job.index:
        np.save(index_path(job.scratch, job.partition), rows)
    bounds = np.searchsorted(rows["band"], np.arange(job.bands + 1, dtype=np.uint32))
    found, stats = [], []
    for band in range(job.bands):
        lo, hi = int(bounds[band]), int(bounds[band + 1])
        keys, ranks = rows["key"][lo:hi], rows["rank"][lo:hi].astype(np.int64)
        pairs, band_stats = star_pairs(keys, ranks, job.n, job.heads, band)
        found.append(pairs)
        stats.append(band_stats)
    del rows
    return _unique(np.concatenate(found)), stats


def band_reduce(ws: Workspace, job: ReduceJob, _spec: Any = None, _done: Any = None) -> ReduceDone:
    """Pair one band-key partition's buckets; its unique pairs go to the scratch folder split
    by pair (a pair found in several partitions meets its copies in one verify task)."""
    pairs, stats = _pairs(job)
    mixed = (pairs.astype(np.uint64) * _PAIR_MIX) >> np.uint64(33)
    partition = (mixed % np.uint64(job.partitions)).astype(np.int64)
    _write_split(_paired_path(job.scratch, job.partition), pairs, partition, job.partitions)
    figures = tuple(
        (s.buckets, s.records, s.largest, s.capped_buckets, s.pairs, s.pairs_skipped_by_cap)
        for s in stats
    )
    return ReduceDone(figures, os.getpid())


def _paired_path(scratch: str, partition: int) -> Path:
    return Path(scratch) / f"paired-{partition:05d}.bin"


def pair_verify(ws: Workspace, job: VerifyJob, _spec: Any = None, _done: Any = None) -> VerifyDone:
    """Verify one pair partition's unique pairs: the parent's Jaccards first, the rest from
    fingerprints; pairs, Jaccards and known flags go to the scratch folder."""
    paths = [_paired_path(job.scratch, p) for p in range(job.reduces)]
    pairs = _unique(_read_split(paths, job.partition, np.dtype(np.int64)))
    xs, ys = np.divmod(pairs, job.n)
    order = KnownRanks(job.order, np.concatenate([xs, ys]))  # read once: rows by rank
    jaccards = np.full(len(pairs), np.nan, dtype=np.float64)
    if job.parent_pairs is not None and len(pairs):
        jaccards = _known(ws, job, order, xs, ys)
    known = ~np.isnan(jaccards)
    fingerprinted = _verify(ws, job, order, xs, ys, jaccards)
    for name, values in (("pairs", pairs), ("jaccards", jaccards), ("known", known)):
        np.save(Path(job.scratch) / f"{name}-{job.partition:05d}.npy", values)
    found = int(known.sum())
    return VerifyDone(len(pairs), len(pairs) - found, found, fingerprinted, os.getpid())


def _verify(
    ws: Workspace,
    job: VerifyJob,
    order: RankLookup,
    xs: np.ndarray,
    ys: np.ndarray,
    jaccards: np.ndarray,
) -> int:
    """Fill in the unknown Jaccards (nan) from the fingerprints of the canonical texts, spilled
    to the scratch folder; returns how many records were fingerprinted."""
    todo = np.flatnonzero(np.isnan(jaccards))
    if not len(todo):
        return 0
    ranks = _unique(np.concatenate([xs[todo], ys[todo]]))
    # the driver's PartitionDb verified every chunk file against its digest in this run
    texts = TextLookup(ws, list(job.records), verified=True)
    prints = SpilledFingerprints(texts, job.spec, order, Path(job.scratch))
    try:
        prints.prefetch(ranks)
        bounds = np.flatnonzero(np.r_[True, xs[todo][1:] != xs[todo][:-1], True]).tolist()
        for lo, hi in pairwise(bounds):
            at = todo[lo:hi]
            (first,) = prints(xs[at[:1]])
            others = prints(ys[at])
            jaccards[at] = [jaccard_sorted(first, other) for other in others]
    finally:
        prints.close()
    return len(ranks)


def _known(
    ws: Workspace, job: VerifyJob, order: RankLookup, xs: np.ndarray, ys: np.ndarray
) -> np.ndarray:
    """The parent's Jaccard of each pair (nan when it has none), found by the two texts'
    digests in its ``pairs`` table, as :class:`.pair_cache.PairLookup` does."""
    assert job.parent_pairs is not None
    ranks = _unique(np.concatenate([xs, ys]))
    rows = np.asarray(order[ranks], dtype=np.int64)  # in total order, not row order
    by_row = np.argsort(rows, kind="stable")
    digests = text_digests(ws, job.records, rows[by_row]).combine_chunks()
    place = np.empty(len(rows), dtype=np.int64)
    place[by_row] = np.arange(len(rows), dtype=np.int64)  # rank's index -> its digest's
    at_x, at_y = place[np.searchsorted(ranks, xs)], place[np.searchsorted(ranks, ys)]
    a, b = digests.take(pa.array(at_x)), digests.take(pa.array(at_y))
    swap = pc.greater(a, b)
    low, high = pc.if_else(swap, b, a), pc.if_else(swap, a, b)
    wanted = pa.table({"i": np.arange(len(xs), dtype=np.int64), "a": low, "b": high})
    # capped and spilling under the home's tmp like every stage's DuckDB; one task per
    # worker: one core each
    with Spilling(ws.home / "tmp", LOOKUP_MEMORY_LIMIT, threads=1) as con:
        con.register("wanted", wanted)
        source = cas_parquet(ws.cas, job.parent_pairs, "parent dedup pairs")
        found = con.sql(
            f"SELECT w.i, q.jaccard FROM wanted w JOIN {source} q ON q.a = w.a AND q.b = w.b"
        ).fetchnumpy()
    out = np.full(len(xs), np.nan, dtype=np.float64)
    out[np.asarray(found["i"], dtype=np.int64)] = found["jaccard"]
    return out
