"""The held-out search as tasks on the runner: one per group of member chunks.

With more than one worker (or the Ray engine) the driver writes the held-out records' rows,
signatures, text digests and every row's threshold once to a scratch folder under the data
home's ``tmp`` (few records; every worker shares the home). Each task takes one group of
consecutive signature chunks (a group closes once it holds ``GROUP_RECORDS`` records, so the
groups never depend on the worker count), finds its members' candidates against the held-out
records, applies the agreement estimate and verifies the exact Jaccards there: known ones
looked up in the same tables with the same SQL as the driver, the others from texts read and
fingerprinted by the worker. A pair is searched by exactly one task (the one holding its
member that is not held out, or the larger row of two held-out records), so the driver only
concatenates the tasks' pairs and sorts them by (a, b): the result, and every byte the splits
layer writes from it, is the in-process search's. Only the counts of work done differ
(``fingerprinted``: a held-out text is read by each task needing it; ``tasks``,
``task_processes``, ``task_cpu_s``): they are in the layer's details, no hashed output.
"""

import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from corpus_assets.core.dedup.fingerprint_store import TextLookup, text_digests
from corpus_assets.core.dedup.heldout_search import (
    HeldoutPairs,
    HeldoutParams,
    likely_pairs,
    side_candidates,
    verified_pairs,
)
from corpus_assets.core.dedup.minhash import SignatureSpec, fingerprints
from corpus_assets.core.dedup.near_dedup import RowMajor
from corpus_assets.core.dedup.signature_cache import BandMajorFile
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.runners import task_runner
from corpus_assets.core.runtime.workspace import Workspace, pooled
from corpus_assets.core.training_view.splits.heldout_known import known_jaccards
from corpus_assets.core.training_view.view_queries import spilling

if TYPE_CHECKING:
    from corpus_assets.core.training_view.splits.heldout import HeldoutScan

GROUP_RECORDS = 1 << 15  # member records a task searches at least (whole chunks)
GROUP_ENV = "CORPUS_HELDOUT_GROUP_RECORDS"  # overrides it (tests: several groups)
FETCH = 256  # texts read and fingerprinted together
SIGNATURES, DIGESTS = "signatures.npy", "digests.arrow"  # the held-out side's files
DIGEST_SCHEMA = pa.schema([("text_digest", pa.string())])


def chunk_groups(counts: Sequence[int], size: int) -> list[tuple[int, int]]:
    """Consecutive chunk ranges ``[first, end)``, each closed once it holds ``size`` records."""
    groups, first, held = [], 0, 0
    for i, count in enumerate(counts):
        held += count
        if held >= size:
            groups.append((first, i + 1))
            first, held = i + 1, 0
    if first < len(counts):
        groups.append((first, len(counts)))
    return groups


def group_records() -> int:
    return max(1, int(os.environ.get(GROUP_ENV, GROUP_RECORDS)))


@dataclass(frozen=True)
class GroupJob:
    """One task: a group's signature files, its member rows (and moved ones), and where the
    held-out side and the known Jaccards are."""

    scratch: str  # the held-out side's folder (``_write_heldout``)
    chunks: list[ChunkRecords]  # every chunk (texts of held-out records live anywhere)
    first: int  # the group's chunks: chunks[first:end], its rows start at ``start``
    end: int
    start: int
    blocks: list[BandMajorFile]
    members: np.ndarray  # ascending global member rows of the group
    moved: np.ndarray | None  # of them, the moved ones (None: a full search)
    params: HeldoutParams
    spec: SignatureSpec
    tables: tuple[str, ...]  # SQL relations (a, b, jaccard) of Jaccards known


def pooled_search(
    scan: "HeldoutScan",
    heldout: np.ndarray,
    rows: np.ndarray,
    tables: tuple[str, ...],
    moved: np.ndarray | None,
) -> HeldoutPairs | None:
    """The search as one task per chunk group on the configured runner; None when the stages
    stay in the driver (``execution.stages``) or the runner wants no workers for them (the
    caller searches in-process)."""
    if not scan.ws.config.execution.stages_on_runner():
        return None
    counts = [c.count for c in scan.chunks]
    groups = chunk_groups(counts, group_records())
    size = sum(c.stored_bytes() for c in scan.chunks)
    runner = task_runner(scan.ws.config.execution)
    if not len(heldout) or not runner.wants(len(groups), size):
        return None
    folder = scan.ws.home / "tmp"
    folder.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(dir=folder, prefix=".heldout-")
    try:
        _write_heldout(Path(scratch), scan, heldout, moved)
        jobs = [_job(scan, scratch, first, end, rows, moved, tables) for first, end in groups]
        results = pooled(scan.ws, search_group, jobs, None, None, None, size)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _joined(results)


def _job(
    scan: "HeldoutScan",
    scratch: str,
    first: int,
    end: int,
    rows: np.ndarray,
    moved: np.ndarray | None,
    tables: tuple[str, ...],
) -> GroupJob:
    """The task of chunks ``[first, end)``: its slice of the member (and moved) rows."""
    lo = sum(c.count for c in scan.chunks[:first])
    hi = lo + sum(c.count for c in scan.chunks[first:end])
    mine = None if moved is None else _within(moved, lo, hi)
    blocks = scan.blocks[first:end]
    members = _within(rows, lo, hi)
    return GroupJob(
        scratch, scan.chunks, first, end, lo, blocks, members, mine, scan.params, scan.spec, tables
    )


def _within(rows: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The ascending ``rows`` in ``[lo, hi)``."""
    return rows[np.searchsorted(rows, lo) : np.searchsorted(rows, hi)]


def _write_heldout(
    scratch: Path, scan: "HeldoutScan", heldout: np.ndarray, moved: np.ndarray | None
) -> None:
    """The held-out side as files in ``scratch``: rows, (records, num_perm) signatures and
    text digests written a chunk at a time (the driver never holds them all: at 1.1 GB they
    were ~300 MB of its peak), moved flags and every threshold. Tasks memory-map them."""
    starts = np.cumsum([0, *(c.count for c in scan.chunks)])
    cut = np.searchsorted(heldout, starts)
    shape = (len(heldout), scan.params.num_perm)
    header = {"descr": np.dtype(np.uint32).str, "fortran_order": False, "shape": shape}
    with open(scratch / SIGNATURES, "wb") as sink:
        np.lib.format.write_array_header_1_0(sink, header)
        for i, block in enumerate(scan.blocks):
            local = heldout[cut[i] : cut[i + 1]] - starts[i]
            if len(local):
                sink.write(_signature_rows(block, local, shape[1]).data)
    with pa.ipc.new_file(scratch / DIGESTS, DIGEST_SCHEMA) as writer:
        for i, chunk in enumerate(scan.chunks):
            local = heldout[cut[i] : cut[i + 1]] - starts[i]
            if len(local):
                digests = text_digests(scan.ws, [chunk], local)
                writer.write_table(pa.table([digests], schema=DIGEST_SCHEMA))
    np.save(scratch / "rows.npy", heldout)
    is_moved = np.isin(heldout, moved) if moved is not None else np.zeros(len(heldout), bool)
    np.save(scratch / "moved.npy", is_moved)
    np.save(scratch / "thresholds.npy", scan.thresholds)


def _signature_rows(block: BandMajorFile, local: np.ndarray, perms: int) -> np.ndarray:
    """The (rows, perms) signatures of a chunk's ``local`` rows, one array filled a
    permutation at a time: a stack of the per-permutation copies held them twice, and its
    bytes a third time (+43 MB traced at 1.1 GB, 42k held-out rows in a chunk)."""
    out = np.empty((len(local), perms), dtype="<u4")
    for p in range(perms):
        out[:, p] = block.row(p)[local]
    return out


def _read_heldout(scratch: Path) -> tuple[np.ndarray, np.ndarray, pa.Array, np.ndarray, np.ndarray]:
    """``_write_heldout``'s files, memory-mapped (every task of a machine shares the pages):
    rows, signatures, text digests, moved flags, thresholds."""
    signatures = np.load(scratch / SIGNATURES, mmap_mode="r")
    with pa.ipc.open_file(pa.memory_map(str(scratch / DIGESTS))) as reader:
        digests = reader.read_all().column(0).combine_chunks()
    load = [np.load(scratch / name) for name in ("rows.npy", "moved.npy", "thresholds.npy")]
    return load[0], signatures, digests, load[1], load[2]


def pair_order(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.lexsort((b, a))`` of non-negative rows: a stable sort of one key ``a * n + b``
    (about half the CPU of the two-key sort)."""
    a, b = a.astype(np.int64), b.astype(np.int64)
    n = max(int(a.max(initial=0)), int(b.max(initial=0))) + 1
    if n > 1 << 31:  # the key would overflow
        return np.lexsort((b, a))
    return np.argsort(a * n + b, kind="stable")


class RowDigests:
    """Every canonical row's text digest, by global row, read from the chunk tables only for
    the rows taken (a chunk's column at a time): the driver holds no column of all rows (at
    1.1 GB that column was ~270 MB of the splits layer's peak). The caller checked the tables."""

    def __init__(self, ws: Workspace, chunks: list[ChunkRecords]) -> None:
        self.ws, self.chunks = ws, chunks

    def paths(self) -> list[str]:
        """The chunk tables' files, in row order."""
        return [str(self.ws.cas.path(chunk.records["digest"])) for chunk in self.chunks]

    def starts(self) -> list[int]:
        """Each chunk table's first global row."""
        return np.cumsum([0, *(c.count for c in self.chunks)])[:-1].tolist()

    def take(self, rows: pa.Array) -> pa.Array:
        wanted = np.asarray(rows.to_numpy(zero_copy_only=False), dtype=np.int64)
        if np.all(wanted[1:] > wanted[:-1]):  # distinct and ascending already: read as asked
            return text_digests(self.ws, self.chunks, wanted).combine_chunks()
        unique = np.unique(wanted)
        found = text_digests(self.ws, self.chunks, unique).combine_chunks()
        return found.take(pa.array(np.searchsorted(unique, wanted), pa.int64()))


def search_group(ws: Workspace, job: GroupJob, _spec: Any = None, _done: Any = None) -> Any:
    """A task: the group's verified pairs in global rows (``HeldoutPairs``, (a, b) order) and
    the id of the process that searched them. Local rows number the held-out records first,
    then the group's rows."""
    started = time.process_time()
    hrows, signatures, held_digests, is_moved, taus = _read_heldout(Path(job.scratch))
    blocks = [RowMajor(signatures), *job.blocks]
    group = job.chunks[job.first : job.end]
    own = np.arange(job.start, job.start + sum(c.count for c in group))
    to_global = np.concatenate([hrows, own])
    likely = likely_pairs(
        blocks, *_owned_candidates(job, blocks, hrows, is_moved, to_global), job.params
    )
    own_digests = text_digests(ws, group, own - job.start).chunks
    digests = pa.chunked_array([held_digests, *own_digests], pa.string())
    texts = TextLookup(ws, job.chunks, verified=True)
    with spilling(ws.home, threads=1) as con:  # the view's cap, as the driver's search
        found = verified_pairs(
            likely, job.params,
            lambda local: _local_prints(texts, job.spec, to_global[local]),
            taus[to_global],
            lambda x, y: known_jaccards(con, job.tables, digests, x, y),
            ws.home / "tmp",
        )  # fmt: skip
    found.stats["task_cpu_s"] = time.process_time() - started
    return _to_global(found, to_global), os.getpid()


def _owned_candidates(
    job: GroupJob,
    blocks: list[Any],
    hrows: np.ndarray,
    is_moved: np.ndarray,
    to_global: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The candidates this task searches, as local rows (held-out, the group's) in the
    global (a, b) order: those whose owner (the module doc) is one of the group's rows."""
    k = len(hrows)
    members = k + job.members - job.start
    if job.moved is None:
        sides = [(np.arange(k), members)]
    else:
        sides = [(np.flatnonzero(is_moved), members), (np.arange(k), k + job.moved - job.start)]
    packed = side_candidates(blocks, sides, job.params, len(to_global))
    a, b = np.divmod(packed, max(len(to_global), 1))  # a: held-out, b: the group's
    ga, gb = to_global[a], to_global[b]
    mine = (ga != gb) & (~np.isin(gb, hrows) | (gb > ga))
    a, b, ga, gb = a[mine], b[mine], ga[mine], gb[mine]
    order = np.lexsort((np.maximum(ga, gb), np.minimum(ga, gb)))
    return a[order], b[order]


def _local_prints(texts: TextLookup, spec: SignatureSpec, rows: np.ndarray) -> list[np.ndarray]:
    """Fingerprint sets of global rows in any order (a held-out record of the group can be
    asked for twice): each distinct row read once, in ascending order."""
    unique, inverse = np.unique(rows, return_inverse=True)
    prints = fingerprint_rows(texts, spec, unique)
    return [prints[i] for i in inverse.tolist()]


def _to_global(found: HeldoutPairs, to_global: np.ndarray) -> HeldoutPairs:
    """Local pairs as global rows a < b, in (a, b) order."""

    def ordered(x: np.ndarray, y: np.ndarray, *rest: np.ndarray) -> tuple[np.ndarray, ...]:
        gx, gy = to_global[x], to_global[y]
        a, b = np.minimum(gx, gy), np.maximum(gx, gy)
        order = np.lexsort((b, a))
        return (a[order], b[order], *(r[order] for r in rest))

    a, b, jaccard = ordered(found.a, found.b, found.jaccard)
    verified = ordered(*found.verified)
    return HeldoutPairs(a, b, jaccard, found.stats, verified)  # type: ignore[arg-type]


def _joined(done: list[tuple[HeldoutPairs, int]]) -> HeldoutPairs:
    """The tasks' pairs (disjoint) in (a, b) order, their summed counts, how many tasks ran
    and in how many processes other than this one (work done: no hashed output)."""
    results = [pairs for pairs, _ in done]

    def merged(parts: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
        a, b, jaccard = (np.concatenate(column) for column in zip(*parts, strict=True))
        order = np.lexsort((b, a))
        return a[order].astype(np.int64), b[order].astype(np.int64), jaccard[order]

    a, b, jaccard = merged([(r.a, r.b, r.jaccard) for r in results])
    verified = merged([r.verified for r in results])
    stats: dict[str, int | float] = {}
    for r in results:
        for key, value in r.stats.items():
            stats[key] = stats.get(key, 0) + value
    stats["tasks"] = len(done)
    stats["task_processes"] = len({pid for _, pid in done} - {os.getpid()})
    return HeldoutPairs(a, b, jaccard, stats, verified)  # type: ignore[arg-type]


def by_digest(
    digests: "pa.Array | pa.ChunkedArray | RowDigests",
    x: np.ndarray,
    y: np.ndarray,
    extra: dict[str, np.ndarray],
) -> pa.Table:
    """Pairs of rows as their two text digests ``x`` and ``y``, with ``extra`` columns (the
    digests taken once for both sides: a :class:`RowDigests` reads its chunks once)."""
    both = digests.take(pa.array(np.concatenate([x, y]), pa.int64()))
    return pa.table({**extra, "x": both.slice(0, len(x)), "y": both.slice(len(x))})


def fingerprint_rows(texts: TextLookup, spec: SignatureSpec, rows: np.ndarray) -> list[np.ndarray]:
    """Fingerprint sets of ascending global rows, ``FETCH`` texts at a time (they are all
    returned, so nothing is spilled; no garbage collection pass for a few texts)."""
    out: list[np.ndarray] = []
    for start in range(0, len(rows), FETCH):
        out += fingerprints(texts.get(rows[start : start + FETCH]), spec)
    return out
