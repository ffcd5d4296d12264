"""Where each mixed sample's tokens are in the token cache, found with Arrow joins.

A sample is a member, so its tokens are those of the dedup representative's row (record id,
object, line): a repeated record id elsewhere (excluded by dedup) never stands in. The lookup
holds no Python object per record and no whole-partition join: the members are read with their
object digests as dictionary codes, joined to the token cache's rows one canonical chunk at a
time (only that chunk's objects' members), and the samples are then found by record id with
``index_in`` (a three-key hash join over the partition peaked at ~1 GB for 680k records). The
token arrays stay memory-mapped: a sample's tokens are copied only when a block is built.
"""

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layers import LayerIndex
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.memory import release_memory
from corpus_assets.core.storage.table_lookup import TrustedFiles
from corpus_assets.core.tokens.cache import TokenArrays, TokenCache, open_tokens
from corpus_assets.core.training_view.pack_blocks import FileSamples

ROW_KEY = ["record_id", "object", "line"]


class SampleLookupError(ValueError):
    """A mixed sample has no cached tokens: the layers it was drawn from disagree."""


@dataclass(frozen=True)
class SampleRows:
    """Per sample in stream order: its record id, kind, token-cache chunk and row, length and
    pair split (a preference record's first sequence length; 0 for every other record)."""

    record_id: pa.ChunkedArray
    kind: pa.ChunkedArray
    chunk: np.ndarray
    row: np.ndarray
    length: np.ndarray
    pair_split: np.ndarray


def locate_samples(
    ws: Workspace,
    canonical: CanonicalIndex,
    cache: TokenCache,
    samples: pa.ChunkedArray,
    dedup: LayerIndex,
) -> SampleRows:
    """Each sample's place in the cache (``samples``: record ids in stream order)."""
    members = _members(ws, dedup)
    rows = pa.concat_tables([_ROWS.empty_table(), *_member_rows(ws, canonical, cache, members)])
    del members
    rows = rows.combine_chunks()
    sample_row, found = _lookup(samples, rows.column("record_id"))
    if found != len(samples):
        raise SampleLookupError(
            f"{found} cache rows for {len(samples)} samples: a member has two rows"
        )
    missing = sample_row < 0
    if missing.any():
        first = samples[int(np.flatnonzero(missing)[0])].as_py()
        raise SampleLookupError(
            f"sample record {first!r} has no kept canonical row with cached tokens "
            f"({int(missing.sum())} samples in all)"
        )
    take = pa.array(sample_row)
    located = SampleRows(
        record_id=pa.chunked_array([samples.combine_chunks()]),
        kind=pa.chunked_array([rows.column("kind").take(take).combine_chunks()]),
        chunk=rows.column("chunk").take(take).to_numpy(),
        row=rows.column("row").take(take).to_numpy(),
        length=rows.column("tokens").take(take).to_numpy(),
        pair_split=rows.column("pair_split").take(take).to_numpy(),
    )
    del rows
    release_memory()  # the lookup's transient tables, back to the system before packing
    return located


_ROWS = pa.schema(
    [
        ("record_id", pa.string()),
        ("kind", pa.string()),
        ("chunk", pa.int32()),
        ("row", pa.int64()),
        ("tokens", pa.int64()),
        ("pair_split", pa.int64()),
    ]
)


@dataclass(frozen=True)
class _Members:
    """The dedup representatives' row keys: record id (Arrow), object (a small int code into
    ``objects``) and line, read a batch at a time (no member's object digest string is held)."""

    record_id: pa.ChunkedArray
    object: np.ndarray
    line: np.ndarray
    objects: dict[str, int]


def _members(ws: Workspace, dedup: LayerIndex) -> _Members:
    path = TrustedFiles(ws.cas, ws.catalog).path(dedup.output("clusters")["digest"], "clusters")
    columns = [*ROW_KEY, "is_representative"]
    parquet = pq.ParquetFile(path, read_dictionary=["object"])
    objects: dict[str, int] = {}
    ids, codes, lines = [], [], []
    for batch in parquet.iter_batches(batch_size=65536, columns=columns):
        batch = batch.filter(batch.column("is_representative"))
        column = batch.column("object")
        local = [objects.setdefault(d, len(objects)) for d in column.dictionary.to_pylist()]
        codes.append(np.asarray(local, np.int32)[column.indices.to_numpy()])
        ids.append(batch.column("record_id"))
        lines.append(batch.column("line").to_numpy())
    return _Members(
        pa.chunked_array(ids, pa.string()),
        np.concatenate(codes) if codes else np.empty(0, np.int32),
        np.concatenate(lines) if lines else np.empty(0, np.int64),
        objects,
    )


def _member_rows(
    ws: Workspace, canonical: CanonicalIndex, cache: TokenCache, members: _Members
) -> Iterator[pa.Table]:
    """Per canonical chunk, its member rows: record id, kind, token-cache chunk and row, token
    count, pair split. Joined on (record id, object, line) one chunk at a time, against the
    members of that chunk's objects only, so no join ever holds the whole partition."""
    files = TrustedFiles(ws.cas, ws.catalog)  # a parent's chunks: hashed by its build's check
    for n, (chunk, cached) in enumerate(zip(canonical.chunks(), cache.chunks, strict=True)):
        path = files.path(chunk.records["digest"], chunk.what)
        table = pq.read_table(path, columns=["record_id", "object", "line", "kind"])
        arrays = open_tokens(ws, cached, cache.spec, ids=False)
        count = table.num_rows
        codes = [members.objects.get(d, -1) for d in pc.unique(table.column("object")).to_pylist()]
        mine = np.flatnonzero(np.isin(members.object, codes))
        keys = pa.table(
            {
                "record_id": members.record_id.take(pa.array(mine)),
                "object": pa.array(members.object[mine]),
                "line": pa.array(members.line[mine]),
            }
        )
        known = pa.array(list(members.objects), pa.string())
        own = pc.index_in(table.column("object"), value_set=known).fill_null(-1)
        local = pa.table(
            {
                "record_id": table.column("record_id"),
                "object": own.cast(pa.int32()),
                "line": table.column("line"),
                "kind": table.column("kind"),
                "chunk": pa.array(np.full(count, n, np.int32)),
                "row": pa.array(np.arange(count, dtype=np.int64)),
                "tokens": pa.array(arrays.counts(), pa.int64()),
                "pair_split": pa.array(np.asarray(arrays.pair_splits), pa.int64()),
            }
        )
        joined = keys.join(local, ["record_id", "object", "line"], join_type="inner")
        yield joined.select(["record_id", "kind", "chunk", "row", "tokens", "pair_split"])
        del table, keys, local, joined
        release_memory()  # the join's hash tables: Arrow's pool would keep them per chunk


def _lookup(samples: pa.ChunkedArray, record_id: pa.Array) -> tuple[np.ndarray, int]:
    """Each sample's row in ``record_id`` (-1: none), and how many rows a left join of the
    samples on record id would have (a record id on two rows counts twice)."""
    first = pc.index_in(record_id, value_set=record_id).to_numpy()
    repeats = np.bincount(first, minlength=len(record_id))
    found = pc.index_in(samples, value_set=record_id).fill_null(-1)
    sample_row = np.asarray(found.to_numpy(), dtype=np.int64)
    matched = sample_row >= 0
    total = int((~matched).sum() + repeats[sample_row[matched]].sum())
    return sample_row, total


class SampleTokens:
    """``fetch(sample)``: a sample's tokens, read with one ``pread`` from its chunk's verified
    cache file (``pack_blocks.FileSamples``: a memory map read in mixed order would leave the
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
        """Only the planned piece of the sample (``pack_blocks.PieceReader``)."""
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
