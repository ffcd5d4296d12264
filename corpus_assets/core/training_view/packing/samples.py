"""Where each mixed sample's tokens are in the token cache, and a reader of them.

A sample is a member, so its tokens are those of the dedup representative's row (record id,
object, line): a repeated record id elsewhere (excluded by dedup) never stands in. The lookup is
a partitioned join (``packing.locate``): samples, members and canonical rows hash-partitioned by
record id under the data home's ``tmp``, each partition joined on its own (on the task runner
when there are workers), the result memory-mapped columns by stream position. The driver holds
no string per sample (record ids are read a batch at a time from a flat file) and no table of
every row. The token arrays stay on disk: a sample's tokens are read only when a block is built.
A child's sample map joins the same members and rows already, so it hands its places to
``located_from`` instead (no partitioning, no second join).
"""

import shutil
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import LayerIndex
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import Workspace, pooled
from corpus_assets.core.storage.memory import release_memory
from corpus_assets.core.storage.table_lookup import TrustedFiles
from corpus_assets.core.tokens.cache import TokenArrays, TokenCache, open_tokens
from corpus_assets.core.training_view.packing.blocks import FileSamples
from corpus_assets.core.training_view.packing.locate import (
    BATCH_ROWS,
    KINDS,
    LOCATED,
    ObjectCodes,
    PartitionWriter,
    PartJob,
    PartReport,
    RecordIds,
    RecordIdSink,
    join_part,
    left_join_rows,
    local_when_small,
    partition_count,
    sample_batches,
    scatter,
)

ROW_KEY = ["record_id", "object", "line"]
# The joins cost about a CPU-second per million member and sample rows, less than two spawn
# workers' imports: up to this many, they run here unless the build's pool is up.
LOCAL_JOIN_ROWS = 1 << 21
DOCUMENT = KINDS.index("document")  # the kind code of a plain document
_lookup = left_join_rows  # the name the lookup's tests know


class SampleLookupError(ValueError):
    """A mixed sample has no cached tokens: the layers it was drawn from disagree."""


class SampleRows:
    """Per sample in stream order, memory-mapped from ``folder`` (``packing.locate.LOCATED``):
    its token-cache ``chunk`` and ``row``, ``length``, ``pair_split`` (a preference record's
    first sequence length; 0 for every other record) and ``kind`` (a code into
    ``packing.locate.KINDS``); ``record_ids.take(samples)`` reads record ids a batch at a time.
    The folder (under the home's ``tmp``, shared with the workers) goes on ``close``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._removed = weakref.finalize(self, shutil.rmtree, folder, True)
        for name in LOCATED:
            setattr(self, name, np.load(folder / f"{name}.npy", mmap_mode="r"))
        self.chunk: np.ndarray
        self.row: np.ndarray
        self.length: np.ndarray
        self.pair_split: np.ndarray
        self.kind: np.ndarray
        self.record_ids = RecordIds(folder)

    def close(self) -> None:
        self._removed()

    def __enter__(self) -> "SampleRows":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def locate_samples(
    ws: Workspace,
    canonical: CanonicalIndex,
    cache: TokenCache,
    samples: pa.ChunkedArray | Path,
    dedup: LayerIndex,
    workers: int | None = None,
    partitions: int | None = None,
) -> SampleRows:
    """Each sample's place in the cache (``samples``: record ids in stream order, or the
    mixed samples' Parquet file, read a batch at a time). ``workers``: as
    ``execution.workers`` (None: the config's); ``partitions``: None for one per
    ``packing.locate.PARTITION_ROWS`` member rows (at least one per worker)."""
    (ws.home / "tmp").mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="pack-samples-", dir=ws.home / "tmp"))
    try:
        _locate(ws, canonical, cache, samples, dedup, folder, workers, partitions)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return SampleRows(folder)


def _locate(
    ws: Workspace,
    canonical: CanonicalIndex,
    cache: TokenCache,
    samples: pa.ChunkedArray | Path,
    dedup: LayerIndex,
    folder: Path,
    workers: int | None,
    partitions: int | None,
) -> None:
    """Partition the three sides, join each partition, scatter the places into ``folder``."""
    clusters = PartedTable.read(ws.cas, dedup.output("clusters"), "dedup clusters")
    paths = clusters.paths(TrustedFiles(ws.cas, ws.catalog), "dedup clusters")
    members = sum(pq.read_metadata(path).num_rows for path in paths)
    many = workers if workers is not None else ws.config.execution.workers
    parts = partitions or partition_count(members, many)
    root = folder / "parts"
    root.mkdir()
    writer, ids, count = PartitionWriter(root, parts), RecordIdSink(folder), 0
    for batch in sample_batches(samples):
        ids.write(batch)
        positions = np.arange(count, count + len(batch), dtype=np.int64)
        writer.write("samples", pa.table({"pos": positions, "record_id": batch}))
        count += len(batch)
    ids.close()
    objects = ObjectCodes()
    for path in paths:
        _write_members(writer, objects, path)
    release_memory()  # the partitioning's transient batches, back before the joins
    for table in _canonical_rows(ws, canonical, cache):
        at = table.schema.get_field_index("object")
        writer.write("rows", table.set_column(at, "object", objects.of_rows(table.column(at))))
    writer.close()
    jobs = [PartJob(str(root), part) for part in range(parts)]
    small = members + count <= LOCAL_JOIN_ROWS
    workers = local_when_small(ws, workers, small)
    reports = pooled(ws, join_part, jobs, workers=workers, input_bytes=writer.bytes)
    release_memory()  # an in-process join's tables, back before the places are scattered
    _raise_on(reports, count)
    scatter(root, parts, count, folder)
    shutil.rmtree(root)
    release_memory()


def _write_members(writer: PartitionWriter, objects: ObjectCodes, path: str) -> None:
    """The representatives' rows (record id, object code, line) of one clusters part, a batch
    at a time: a part is a whole table's rows or one chunk's, in any order (the join is by key)."""
    with pq.ParquetFile(path, read_dictionary=["object"]) as part:
        for batch in part.iter_batches(BATCH_ROWS, columns=[*ROW_KEY, "is_representative"]):
            kept = pa.Table.from_batches([batch.filter(batch.column("is_representative"))])
            codes = objects.of_members(kept.column("object").combine_chunks())
            kept = kept.set_column(kept.schema.get_field_index("object"), "object", codes)
            writer.write("members", kept.select(ROW_KEY))


def located_from(
    ws: Workspace,
    cache: TokenCache,
    samples: Path,
    count: int,
    places: Iterable[pa.RecordBatch],
) -> SampleRows | None:
    """``SampleRows`` from the places a caller's join found (``pos``, ``chunk``, ``row``,
    ``kind`` batches, any order), or None unless it found each of the ``count`` samples
    exactly once (the partitioned lookup then names what is wrong): a child's sample map joins
    the same members and canonical rows, so its packing need not partition and join them
    again. Token counts and pair splits are read a chunk's offsets at a time; record ids from
    ``samples``."""
    (ws.home / "tmp").mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="pack-samples-", dir=ws.home / "tmp"))
    try:
        ids = RecordIdSink(folder)
        for batch in sample_batches(samples):
            ids.write(batch)
        ids.close()
        columns = {
            name: np.lib.format.open_memmap(folder / f"{name}.npy", "w+", dtype, (count,))
            for name, dtype in LOCATED.items()
        }
        seen, found = np.zeros(count, dtype=bool), 0
        for batch in places:
            pos = batch.column("pos").to_numpy()
            seen[pos], found = True, found + len(pos)
            for name in ("chunk", "row", "kind"):
                columns[name][pos] = batch.column(name).to_numpy()
        if found != count or not seen.all():
            del columns
            shutil.rmtree(folder, ignore_errors=True)
            return None
        _token_counts(ws, cache, columns)
        for column in columns.values():
            column.flush()
        del columns
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return SampleRows(folder)


def _token_counts(ws: Workspace, cache: TokenCache, columns: dict[str, np.ndarray]) -> None:
    """Each sample's ``length`` and ``pair_split`` from its chunk's cached offsets and splits,
    one chunk's arrays at a time (the samples taken in chunk order)."""
    chunk = np.asarray(columns["chunk"])
    order = np.argsort(chunk, kind="stable")
    bounds = np.searchsorted(chunk[order], np.arange(len(cache.chunks) + 1))
    for n, cached in enumerate(cache.chunks):
        at = order[bounds[n] : bounds[n + 1]]
        if not at.size:
            continue
        arrays = open_tokens(ws, cached, cache.spec, ids=False)
        row = np.asarray(columns["row"])[at]
        columns["length"][at] = arrays.counts()[row]
        columns["pair_split"][at] = np.asarray(arrays.pair_splits)[row]


def _canonical_rows(
    ws: Workspace, canonical: CanonicalIndex, cache: TokenCache
) -> Iterator[pa.Table]:
    """Every canonical row, a batch at a time: its key, kind, token-cache chunk and row,
    token count and pair split."""
    files = TrustedFiles(ws.cas, ws.catalog)  # a parent's chunks: hashed by its build's check
    for n, (chunk, cached) in enumerate(zip(canonical.chunks(), cache.chunks, strict=True)):
        parquet = pq.ParquetFile(files.path(chunk.records["digest"], chunk.what))
        arrays = open_tokens(ws, cached, cache.spec, ids=False)
        counts, splits = arrays.counts(), np.asarray(arrays.pair_splits)
        row = 0
        for batch in parquet.iter_batches(BATCH_ROWS, columns=[*ROW_KEY, "kind"]):
            end = row + batch.num_rows
            yield (
                pa.Table.from_batches([batch])
                .append_column("chunk", pa.array(np.full(batch.num_rows, n, np.int64)))
                .append_column("row", pa.array(np.arange(row, end, dtype=np.int64)))
                .append_column("length", pa.array(counts[row:end], pa.int64()))
                .append_column("pair_split", pa.array(splits[row:end], pa.int64()))
            )
            row = end


def _raise_on(reports: list[PartReport], count: int) -> None:
    """``SampleLookupError`` naming the first sample (in stream order) with two rows or none."""
    found = sum(report.found for report in reports)
    if found != count:
        _pos, record = min(r.first_twice for r in reports if r.first_twice[0] >= 0)
        raise SampleLookupError(
            f"{found} cache rows for {count} samples: a member has two rows "
            f"(e.g. sample record {record!r})"
        )
    missing = sum(report.missing for report in reports)
    if missing:
        _pos, first = min(r.first_missing for r in reports if r.first_missing[0] >= 0)
        raise SampleLookupError(
            f"sample record {first!r} has no kept canonical row with cached tokens "
            f"({missing} samples in all)"
        )


class SampleTokens:
    """``fetch(sample)``: a sample's tokens, read with one ``pread`` from its chunk's verified
    cache file (``packing.blocks.FileSamples``: a memory map read in mixed order would leave the
    whole token cache resident in the process); ``targets(sample)``: its training-target mask
    (``targets_fetch`` is None when every token of every chunk is a target, so blocks of
    documents skip the mask). ``chunk`` and ``row``: each sample's place in the cache. At most
    ``open_files`` chunk files are open at once; ``verify=False`` for a worker of a caller
    that verified the cache."""

    def __init__(
        self,
        ws: Workspace,
        cache: TokenCache,
        chunk: np.ndarray,
        row: np.ndarray,
        open_files: int = 64,
        verify: bool = True,
    ) -> None:
        self._arrays: list[TokenArrays] = [
            open_tokens(ws, c, cache.spec, verify=verify) for c in cache.chunks
        ]
        self._chunk, self._row = chunk, row
        self._files: OrderedDict[int, FileSamples] = OrderedDict()
        self._open_files = max(1, open_files)
        everywhere = all(arrays.all_targets for arrays in self._arrays)
        self.targets_fetch = None if everywhere else self.targets

    def __call__(self, sample: int) -> np.ndarray:
        return self._file(int(self._chunk[sample]))(int(self._row[sample]))

    def piece(self, sample: int, offset: int, length: int) -> np.ndarray:
        """Only the planned piece of the sample (``packing.blocks.PieceReader``)."""
        return self._file(int(self._chunk[sample])).piece(int(self._row[sample]), offset, length)

    def targets(self, sample: int) -> np.ndarray:
        return self._arrays[self._chunk[sample]].targets(int(self._row[sample]))

    def _file(self, chunk: int) -> FileSamples:
        if chunk in self._files:
            self._files.move_to_end(chunk)
            return self._files[chunk]
        arrays = self._arrays[chunk]
        assert arrays.ids_path is not None  # opened with ids
        self._files[chunk] = FileSamples(arrays.ids_path, arrays.offsets)
        if len(self._files) > self._open_files:
            self._files.popitem(last=False)[1].close()
        return self._files[chunk]

    def close(self) -> None:
        while self._files:
            self._files.popitem()[1].close()

    def __enter__(self) -> "SampleTokens":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
