"""Near-dedup's band tasks are sized from ``execution.worker_memory_mb``: what a task holds
(numpy's allocations, traced) stays within the estimate its size was chosen by."""

import subprocess
import sys
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from corpus_assets.core.dedup.band_runner import (
    MAP_ROW_BYTES,
    MAX_PARTITIONS,
    PAIR_BYTES,
    REDUCE_ROW_BYTES,
    map_records,
    partitions,
)
from corpus_assets.core.dedup.band_tasks import (
    ROW,
    MapJob,
    ReduceJob,
    _write_split,
    band_map,
    band_reduce,
    index_path,
    map_path,
)
from corpus_assets.core.dedup.class_rows import FiledClass
from corpus_assets.core.runtime.execution import Execution

BANDS, ROWS = 16, 8


def _traced_peak(run: object) -> int:
    tracemalloc.start()
    try:
        run()  # type: ignore[operator]
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_reduce_task_holds_no_more_than_its_estimate(tmp_path: Path) -> None:
    """A partition of 60,000 records whose keys collide so that each record has as many
    candidate pairs as the estimate allows (bands * 52 / 40): the rows and their sort are the
    peak, within the per-record estimate and close to it."""
    records, rng = 60_000, np.random.default_rng(7)
    allowed = BANDS * REDUCE_ROW_BYTES // PAIR_BYTES
    rows = np.empty(records * BANDS, dtype=ROW)
    rows["band"] = np.repeat(np.arange(BANDS, dtype=np.uint32), records)
    rows["key"] = rng.integers(0, records // 2, len(rows)).astype(np.uint64)
    rows["rank"] = np.tile(np.arange(records, dtype=np.int64), BANDS)
    _write_split(map_path(str(tmp_path), 0), rows, np.zeros(len(rows), dtype=np.int64), 1)
    del rows
    job = ReduceJob(str(tmp_path), 0, 1, 1, records, BANDS, 32)
    done: list = []
    peak = _traced_peak(lambda: done.append(band_reduce(None, job)))  # type: ignore[arg-type]
    pairs = sum(band[4] for band in done[0].bands)
    assert 0.7 * allowed * records <= pairs <= allowed * records
    estimate = records * BANDS * REDUCE_ROW_BYTES
    assert 0.8 * estimate <= peak <= estimate, f"{peak} bytes traced, {estimate} estimated"


def test_a_map_task_holds_no_more_than_its_estimate(tmp_path: Path) -> None:
    records = 40_000
    signatures = np.random.default_rng(3).integers(0, 2**32, (BANDS * ROWS, records))
    path = tmp_path / "signatures.npy"
    np.save(path, signatures.astype("<u4"))
    order = np.random.default_rng(4).permutation(records).astype(np.int32)
    filed = FiledClass.write(tmp_path / "class", order)  # every row, ranked in another order
    ws = SimpleNamespace(cas=SimpleNamespace(path=Path))  # the digest is the file's path
    job = MapJob(str(tmp_path), 0, ((str(path), 0, records),), BANDS, ROWS, 4, filed)
    peak = _traced_peak(lambda: band_map(ws, job))  # type: ignore[arg-type]
    assert peak <= records * BANDS * MAP_ROW_BYTES, peak


@pytest.mark.parametrize("memory_mb", [256, 2048, 16384])
def test_partitions_follow_the_memory_bound_past_the_record_count_cap(memory_mb: int) -> None:
    """A class of 10 billion records: its partitions are as many as the task budget needs (far
    beyond ``MAX_PARTITIONS``), each within the budget; map groups shrink with the budget."""
    budget = Execution(worker_memory_mb=memory_mb).task_budget_bytes()
    per_record = BANDS * REDUCE_ROW_BYTES
    n = 10_000_000_000
    count = partitions(n, BANDS, budget)
    assert count > MAX_PARTITIONS
    assert n * per_record / count <= budget  # a partition's share, on average
    assert partitions(n, BANDS, budget * 2) < count  # more memory, fewer and larger tasks
    assert map_records(BANDS, budget) * BANDS * MAP_ROW_BYTES <= budget


def test_small_classes_keep_the_record_count_sizing() -> None:
    """Below the memory bound the count is one per 16,384 records (what the tests and the
    measured figures used): a class's partitions do not move with the bound there."""
    budget = Execution().task_budget_bytes()
    assert partitions(1, BANDS, budget) == 1
    assert partitions(100_000, BANDS, budget) == 7
    assert partitions(100_000, BANDS, Execution(worker_memory_mb=256).task_budget_bytes()) == 7


INDEX_PROBE = """
import sys
from pathlib import Path
import numpy as np
from corpus_assets.core.dedup.band_index import IndexWriter
from corpus_assets.core.dedup.band_runner import _write_index

scratch, count, n, bands = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

def kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

before = kb("VmRSS")
writer = IndexWriter(Path(scratch) / "index.npy", bands, n)
_write_index(writer, scratch, count, np.arange(n, dtype=np.int64))
print((kb("VmHWM") - before) * 1024)
"""


def test_the_band_index_writer_holds_one_band_not_every_partition(tmp_path: Path) -> None:
    """The driver merges the reduce tasks' sorted partitions a band at a time: what it holds
    grows with one band's rows (~20 bytes a record, with its sort), not with the partition
    files (20 bytes a record and band), which it must not keep mapped (their pages counted
    in its peak: +140 MB at 1.1 GB of raw text)."""
    count, n, bands = 4, 400_000, 16
    rng = np.random.default_rng(5)
    for partition in range(count):
        size = n // count
        rows = np.empty(size * bands, dtype=ROW)
        rows["band"] = np.repeat(np.arange(bands, dtype=np.uint32), size)
        rows["key"] = rng.integers(0, 2**62, len(rows)).astype(np.uint64) * count + partition
        rows["rank"] = np.tile(np.arange(partition * size, (partition + 1) * size), bands)
        order = np.lexsort((rows["rank"], rows["key"], rows["band"]))
        np.save(index_path(str(tmp_path), partition), rows[order])
    files = n * bands * ROW.itemsize
    probe = [sys.executable, "-c", INDEX_PROBE, str(tmp_path), str(count), str(n), str(bands)]
    grown = int(subprocess.run(probe, check=True, capture_output=True, text=True).stdout)
    assert grown < files // 3, f"{grown} bytes over the files' {files}"
    written = np.load(tmp_path / "index.npy")
    assert written.shape == (bands, n)
    keys = written["key"]
    assert (keys[:, 1:] >= keys[:, :-1]).all()  # each band in bucket order


def _range_partitions(scratch: Path, count: int, n: int, bands: int) -> np.ndarray:
    """Reduce files as the tasks write them (partition p holds the p-th range of keys, each
    sorted by key then rank) and every row of them; keys repeat, so ties are kept by rank."""
    rng = np.random.default_rng(11)
    size = n // count
    rows = np.empty(n * bands, dtype=ROW)
    rows["band"] = np.repeat(np.arange(bands, dtype=np.uint32), n)
    rows["key"] = rng.integers(0, 2**40, len(rows)).astype(np.uint64) // 7  # repeats
    rows["rank"] = np.tile(rng.permutation(n), bands)
    cut = np.quantile(rows["key"], np.linspace(0, 1, count + 1)[1:-1]).astype(np.uint64)
    part = np.searchsorted(cut, rows["key"], side="right")
    for partition in range(count):
        mine = rows[part == partition]
        np.save(
            index_path(str(scratch), partition),
            mine[np.lexsort((mine["rank"], mine["key"], mine["band"]))],
        )
    assert size  # every partition gets rows of every band here
    return rows


def test_a_band_in_bucket_order_is_written_a_slice_at_a_time(tmp_path: Path) -> None:
    """Partitions that are ranges of keys (as ``key_partition`` cuts them) concatenate in
    bucket order: each band goes from the files to the index a slice at a time, the same
    bytes as the band sorted whole, and the driver grows by less than one band's rows."""
    count, n, bands = 3, 400_000, 8
    rows = _range_partitions(tmp_path, count, n, bands)
    probe = [sys.executable, "-c", INDEX_PROBE, str(tmp_path), str(count), str(n), str(bands)]
    grown = int(subprocess.run(probe, check=True, capture_output=True, text=True).stdout)
    order = np.arange(n, dtype=np.int64)
    assert grown < n * ROW.itemsize, f"{grown} bytes, one band's rows are {n * ROW.itemsize}"
    written = np.load(tmp_path / "index.npy")
    for band in range(bands):
        mine = rows[rows["band"] == band]
        whole = mine[np.lexsort((mine["rank"], mine["key"]))]
        assert np.array_equal(written[band]["key"], whole["key"])
        assert np.array_equal(written[band]["row"], order[whole["rank"]])
