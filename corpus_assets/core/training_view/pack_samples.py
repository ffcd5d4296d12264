"""Where each mixed sample's tokens are in the token cache, found with Arrow joins.

A sample is a member, so its tokens are those of the dedup representative's row (record id,
object, line): a repeated record id elsewhere (excluded by dedup) never stands in. The lookup is
two hash joins and one sort on columnar tables (no Python object per record), and the token
arrays stay memory-mapped: a sample's tokens are copied only when a block is built.
"""

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layers import LayerIndex
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.tokens.cache import TokenArrays, TokenCache, open_tokens, token_counts
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
    columns = [*ROW_KEY, "is_representative"]
    clusters = get_table(ws.cas, dedup.output("clusters"), "dedup clusters", columns)
    kept = clusters.filter(clusters.column("is_representative")).select(ROW_KEY)
    every = token_counts(ws, canonical.chunks(), cache, (*ROW_KEY, "kind"), located=True)
    rows = kept.join(every, ROW_KEY, join_type="inner")
    order = pa.table({"record_id": samples, "sample": np.arange(len(samples), dtype=np.int64)})
    found = order.join(
        rows.select(["record_id", "kind", "chunk", "row", "tokens", "pair_split"]),
        "record_id",
        join_type="left outer",
    ).sort_by("sample")
    if found.num_rows != len(samples):
        raise SampleLookupError(
            f"{found.num_rows} cache rows for {len(samples)} samples: a member has two rows"
        )
    missing = pc.is_null(found.column("chunk"))
    if pc.any(missing).as_py():
        first = found.filter(missing).column("record_id")[0].as_py()
        raise SampleLookupError(
            f"sample record {first!r} has no kept canonical row with cached tokens "
            f"({pc.sum(missing).as_py()} samples in all)"
        )
    return SampleRows(
        record_id=found.column("record_id"),
        kind=found.column("kind"),
        chunk=found.column("chunk").to_numpy(),
        row=found.column("row").to_numpy(),
        length=found.column("tokens").to_numpy(),
        pair_split=found.column("pair_split").to_numpy(),
    )


class SampleTokens:
    """``fetch(sample)``: a sample's tokens, read with one ``pread`` from its chunk's verified
    cache file (``pack_blocks.FileSamples``: a memory map read in mixed order would leave the
    whole token cache resident in the process); ``targets(sample)``: its training-target mask
    (``targets_fetch`` is None when every token of every chunk is a target, so blocks of
    documents skip the mask). At most ``open_files`` chunk files are open at once."""

    def __init__(
        self, ws: Workspace, cache: TokenCache, rows: SampleRows, open_files: int = 64
    ) -> None:
        self._arrays: list[TokenArrays] = [open_tokens(ws, c, cache.spec) for c in cache.chunks]
        self._chunk, self._row = rows.chunk, rows.row
        self._files: OrderedDict[int, FileSamples] = OrderedDict()
        self._open_files = max(1, open_files)
        everywhere = all(arrays.all_targets for arrays in self._arrays)
        self.targets_fetch = None if everywhere else self.targets

    def __call__(self, sample: int) -> np.ndarray:
        return self._file(int(self._chunk[sample]))(int(self._row[sample]))

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
