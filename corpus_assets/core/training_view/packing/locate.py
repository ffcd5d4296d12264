"""Each mixed sample's place in the token cache, found as a partitioned join.

The samples (stream position, record id), the dedup representatives (record id, object, line)
and every canonical row (its key, kind, token-cache chunk and row, token count, pair split) are
hash-partitioned by record id into Parquet files under the data home's ``tmp`` (which every
worker shares), streamed a batch at a time. Each partition is then joined on its own, in Arrow
and with one partition in memory, as a task on the runner (``workspace.pooled``: in-process for
one worker or small inputs; ``local_when_small``: in the driver while the build's pool has not
started and the join is small), writing its samples' places by stream position. The driver
scatters those into fixed-width ``.npy`` columns by stream position (``LOCATED``) that it and
the shard jobs memory-map, and keeps the record ids as two flat files (offsets, UTF-8 bytes)
read a batch of samples at a time. So the driver holds no string per sample and no table of
every row; the partition count changes where work happens, never a byte of what is written.
"""

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.runtime.pool import pool_running
from corpus_assets.core.runtime.workspace import Workspace

PARTITION_ROWS = 1 << 17  # member rows per partition, about: one partition's join in memory
# (2^18 held the packed layer's driver at 319 MB at 1.1 GB, 2^17 at 299: same bytes, same CPU)
BATCH_ROWS = 1 << 16
HASH_ROWS = 1 << 12  # record ids hashed at once
KINDS = ("document", "messages", "preference")  # kind codes; any other kind is len(KINDS)
LOCATED = {"chunk": np.int64, "row": np.int64, "length": np.int64, "pair_split": np.int64,
           "kind": np.int8}  # fmt: skip
_HASH_BASE = np.uint64(0x100000001B3)
SIDES = {
    "samples": pa.schema([("pos", pa.int64()), ("record_id", pa.string())]),
    "members": pa.schema(
        [("record_id", pa.string()), ("object", pa.int32()), ("line", pa.int64())]
    ),
    "rows": pa.schema(
        [
            ("record_id", pa.string()),
            ("object", pa.int32()),
            ("line", pa.int64()),
            ("kind", pa.string()),
            ("chunk", pa.int64()),
            ("row", pa.int64()),
            ("length", pa.int64()),
            ("pair_split", pa.int64()),
        ]
    ),
}


def partition_count(member_rows: int, workers: int = 1) -> int:
    """Enough partitions that one holds about ``PARTITION_ROWS`` member rows."""
    return max(1, math.ceil(member_rows / PARTITION_ROWS), workers)


def record_parts(ids: pa.Array, parts: int) -> np.ndarray:
    """Each record id's partition: a 64-bit polynomial hash of its UTF-8 bytes, mixed
    (splitmix64), modulo ``parts``; vectorised over the Arrow buffers (a null is "")."""
    if parts == 1 or len(ids) == 0:
        return np.zeros(len(ids), np.int64)
    if len(ids) > HASH_ROWS:  # its temporaries are ~40 bytes per id byte: a slice at a time
        pieces = [
            record_parts(ids.slice(at, HASH_ROWS), parts) for at in range(0, len(ids), HASH_ROWS)
        ]
        return np.concatenate(pieces)
    ids = ids.cast(pa.large_string()) if ids.type != pa.large_string() else ids
    offsets = np.frombuffer(ids.buffers()[1], np.int64)[ids.offset : ids.offset + len(ids) + 1]
    lo, hi = int(offsets[0]), int(offsets[-1])
    data = ids.buffers()[2]
    raw = np.frombuffer(data, np.uint8)[lo:hi] if data is not None else np.empty(0, np.uint8)
    sizes = np.diff(offsets)
    at = np.arange(hi - lo, dtype=np.int64) - np.repeat(offsets[:-1] - lo, sizes)
    powers = np.cumprod(np.full(int(sizes.max(initial=0)) + 1, _HASH_BASE, np.uint64))
    terms = raw.astype(np.uint64) * powers[at]
    prefix = np.zeros(terms.size + 1, np.uint64)
    np.cumsum(terms, out=prefix[1:])
    h = prefix[offsets[1:] - lo] - prefix[offsets[:-1] - lo] + sizes.astype(np.uint64)
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return ((h ^ (h >> np.uint64(31))) % np.uint64(parts)).astype(np.int64)


class ObjectCodes:
    """Object digests as int codes, numbered as the members name them (a row of an object no
    member names gets -1 and joins nothing): partitions and their joins hold no digest string.
    Holds one entry per source object."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}

    def of_members(self, column: pa.DictionaryArray) -> pa.Array:
        local = [self._codes.setdefault(d, len(self._codes)) for d in column.dictionary.to_pylist()]
        return pa.array(np.asarray(local, np.int32)[column.indices.to_numpy()], pa.int32())

    def of_rows(self, column: pa.Array) -> pa.Array:
        known = pa.array(list(self._codes), pa.string())
        return pc.index_in(column, value_set=known).fill_null(-1).cast(pa.int32())


class PartitionWriter:
    """One Parquet file per (side, partition) under ``root``; a table is split by the
    partitions of its record ids and appended to each."""

    def __init__(self, root: Path, parts: int) -> None:
        self.root, self.parts = root, parts
        self._writers: dict[tuple[str, int], pq.ParquetWriter] = {}
        self.bytes = 0

    def write(self, side: str, table: pa.Table) -> None:
        part = record_parts(table.column("record_id").combine_chunks(), self.parts)
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(self.parts + 1))
        table = table.take(pa.array(order))
        for p in np.flatnonzero(np.diff(bounds)).tolist():
            piece = table.slice(int(bounds[p]), int(bounds[p + 1] - bounds[p]))
            key = (side, p)
            if key not in self._writers:
                self._writers[key] = pq.ParquetWriter(part_path(self.root, side, p), SIDES[side])
            self._writers[key].write_table(piece.cast(SIDES[side]))

    def close(self) -> None:
        for (side, p), writer in self._writers.items():
            writer.close()
            self.bytes += part_path(self.root, side, p).stat().st_size
        self._writers.clear()


def part_path(root: Path, side: str, part: int) -> Path:
    return root / f"{side}-{part:05d}.parquet"


def read_part(root: Path, side: str, part: int) -> pa.Table:
    """A partition's rows of one side (none written: an empty table); one file, so no
    dataset layer (whose import alone costs a worker ~0.5 CPU-s)."""
    path = part_path(root, side, part)
    return pq.ParquetFile(path).read() if path.exists() else SIDES[side].empty_table()


def local_when_small(ws: Workspace, workers: int | None, small: bool) -> int | None:
    """The workers for a map: 1 (here) when its work is ``small`` and the build's pool has not
    started, else ``workers``: a spawn worker pays ~1 CPU-s of imports before its first job.
    ``execution.in_process_bytes`` 0 still means the pool, always."""
    many = workers if workers is not None else ws.config.execution.workers
    here = small and ws.config.execution.in_process_bytes > 0 and not pool_running(many)
    return 1 if here else workers


@dataclass(frozen=True)
class PartJob:
    """Join partition ``part`` of the files under ``root``."""

    root: str
    part: int


@dataclass(frozen=True)
class PartReport:
    """A partition's join: its samples, the rows a left join of them on record id has (a
    record on two rows counts twice), and the first sample (stream position, record id) with
    no row and with two rows (-1: none)."""

    samples: int
    found: int
    missing: int
    first_missing: tuple[int, str | None] = (-1, None)
    first_twice: tuple[int, str | None] = (-1, None)


def join_part(_ws: Workspace, job: PartJob, _spec: None, _done: None) -> PartReport:
    """One partition: members joined to their canonical rows on (record id, object, line),
    then each sample to its member's row by record id (``left_join_rows``); the samples'
    places written to ``located-<part>.parquet`` (module-level: a worker runs it)."""
    root = Path(job.root)
    members = read_part(root, "members", job.part)
    rows = read_part(root, "rows", job.part)
    located = members.join(rows, ["record_id", "object", "line"], join_type="inner")
    del members, rows
    samples = read_part(root, "samples", job.part)
    ids, pos = samples.column("record_id"), samples.column("pos").to_numpy()
    record_id = located.column("record_id").combine_chunks()
    sample_row, found = left_join_rows(ids, record_id)
    missing = sample_row < 0
    twice = np.zeros(len(samples), bool)
    if found != len(samples):
        first = pc.index_in(record_id, value_set=record_id).to_numpy()
        repeats = np.bincount(first, minlength=len(record_id))
        twice = ~missing & (repeats[np.maximum(sample_row, 0)] > 1)
    take = pa.array(np.maximum(sample_row, 0))
    kind = pc.index_in(located.column("kind"), value_set=pa.array(KINDS)).fill_null(len(KINDS))
    columns = {"pos": pa.array(pos)} | {
        name: located.column(name).take(take) for name in ("chunk", "row", "length", "pair_split")
    }
    out = pa.table(columns | {"kind": kind.cast(pa.int8()).take(take)})
    pq.write_table(out.filter(pa.array(~missing)), part_path(root, "located", job.part))
    first_missing, first_twice = _first(pos, ids, missing), _first(pos, ids, twice)
    return PartReport(len(samples), found, int(missing.sum()), first_missing, first_twice)


def _first(pos: np.ndarray, ids: pa.ChunkedArray, where: np.ndarray) -> tuple[int, str | None]:
    """The stream position and record id of the first sample ``where`` holds ((-1, None))."""
    if not where.any():
        return -1, None
    at = int(np.argmin(np.where(where, pos, np.iinfo(np.int64).max)))
    return int(pos[at]), ids[at].as_py()


def left_join_rows(samples: pa.ChunkedArray, record_id: pa.Array) -> tuple[np.ndarray, int]:
    """Each sample's row in ``record_id`` (-1: none), and how many rows a left join of the
    samples on record id would have (a record id on two rows counts twice)."""
    first = pc.index_in(record_id, value_set=record_id).to_numpy()
    repeats = np.bincount(first, minlength=len(record_id))
    found = pc.index_in(samples, value_set=record_id).fill_null(-1)
    sample_row = np.asarray(found.to_numpy(), dtype=np.int64)
    matched = sample_row >= 0
    total = int((~matched).sum() + repeats[sample_row[matched]].sum())
    return sample_row, total


def scatter(root: Path, parts: int, count: int, folder: Path) -> None:
    """The partitions' places as one ``.npy`` per ``LOCATED`` column by stream position, a
    partition read at a time."""
    columns = {
        name: np.lib.format.open_memmap(folder / f"{name}.npy", "w+", dtype, (count,))
        for name, dtype in LOCATED.items()
    }
    for part in range(parts):
        path = part_path(root, "located", part)
        if not path.exists():
            continue
        table = pq.read_table(path)
        pos = table.column("pos").to_numpy()
        for name, column in columns.items():
            column[pos] = table.column(name).to_numpy()
        del table
    for column in columns.values():
        column.flush()
    del columns


class RecordIds:
    """Each sample's record id, by stream position, from two flat files: ``ids.offsets``
    (int64, count + 1) and ``ids.utf8``; ``take`` reads a batch of them as an Arrow array
    (Arrow's take over the memory-mapped files: no per-byte index, no Python string)."""

    def __init__(self, folder: Path) -> None:
        offsets = np.memmap(folder / "ids.offsets", np.int64, "r")
        size = (folder / "ids.utf8").stat().st_size
        data = np.memmap(folder / "ids.utf8", np.uint8, "r") if size else np.empty(0, np.uint8)
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        self._all = pa.Array.from_buffers(pa.large_string(), offsets.size - 1, buffers)

    def __len__(self) -> int:
        return len(self._all)

    def take(self, index: np.ndarray) -> pa.Array:
        return self._all.take(pa.array(np.asarray(index, np.int64))).cast(pa.string())


class RecordIdSink:
    """Appends record ids to ``ids.offsets`` and ``ids.utf8`` (``RecordIds``' files)."""

    def __init__(self, folder: Path) -> None:
        self._offsets: BinaryIO = (folder / "ids.offsets").open("wb")
        self._data: BinaryIO = (folder / "ids.utf8").open("wb")
        self._end = 0
        self._offsets.write(np.zeros(1, np.int64).tobytes())

    def write(self, ids: pa.Array) -> None:
        ids = ids.cast(pa.large_string())
        offsets = np.frombuffer(ids.buffers()[1], np.int64)[ids.offset : ids.offset + len(ids) + 1]
        lo, hi = int(offsets[0]), int(offsets[-1])
        if hi > lo:
            self._data.write(memoryview(ids.buffers()[2])[lo:hi])
        self._offsets.write((offsets[1:] - lo + self._end).tobytes())
        self._end += hi - lo

    def close(self) -> None:
        self._offsets.close()
        self._data.close()


def sample_batches(samples: pa.ChunkedArray | Path) -> Iterator[pa.Array]:
    """The samples' record ids in stream order, a batch at a time (a Parquet file's
    ``record_id`` column is read a batch at a time, never whole)."""
    if isinstance(samples, Path):
        parquet = pq.ParquetFile(samples)
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=["record_id"]):
            yield batch.column("record_id")
        return
    for chunk in samples.chunks:
        for start in range(0, len(chunk), BATCH_ROWS):
            yield chunk.slice(start, BATCH_ROWS)


def sample_count(samples: pa.ChunkedArray | Path) -> int:
    if isinstance(samples, Path):
        return pq.ParquetFile(samples).metadata.num_rows
    return len(samples)
