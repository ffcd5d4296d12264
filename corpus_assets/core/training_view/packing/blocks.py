"""Per-block training arrays from a ``PackPlan`` (segment isolation, labels,
provenance spans), built a batch of blocks at a time so memory is bounded by the batch.

A sample's tokens come from ``fetch(sample_index)``, any callable returning a 1-D integer numpy
array (typically a memory-mapped view of the token cache); only the planned slices are copied.
Its training targets come likewise from ``targets(sample_index)`` (uint8 aligned with the
tokens, 1 = target: ``TokenArrays.targets``); without it every token is a target.

Layout of every block (T = ``plan.block_tokens``), declared:

- ``input_ids`` uint32: the pieces in plan order from offset 0, then ``pad_id`` to T;
- ``segment_ids`` int32: 0 on pad, 1, 2, ... per piece in the block (a split or continuous piece
  is its own segment: attention never crosses a block, so neither does a segment);
- ``positions`` int32: restart at 0 at every segment (0 on pad);
- ``label_mask`` uint8, aligned with the inputs: 1 at t when token t + 1 is the target, i.e.
  t + 1 is in the same segment and the sample's targets at t + 1's sample offset is 1 (a chat
  turn that is context, a preference prompt: 0). No label crosses a segment boundary, none on
  pad, none on the last token of a segment. So a segment of n tokens at sample offset o carries
  as many labels as there are targets among sample offsets o+1 .. o+n-1;
- ``cu_seqlens`` int32 (flash-attention varlen): per block 0 and every segment's end; the pad
  after the last entry is no segment. Flat over the batch; block i's entries are
  ``cu_seqlens[cu_bounds[i]:cu_bounds[i + 1]]``;
- provenance spans: half-open [start, end) of a block -> sample index, source token offset
  (``span_*``, one row per piece). Pad has no span and so no source.
"""

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from corpus_assets.core.training_view.packing.plan import PackPlan

Fetch = Callable[[int], np.ndarray]


@runtime_checkable
class PieceReader(Protocol):
    """A ``Fetch`` that can also read just a piece of a sample: a sample split over many blocks
    (an overlong document) is then read once in total, not once per piece (43x the tokens on
    the race corpus, whose longest sample has 823k tokens)."""

    def __call__(self, sample: int) -> np.ndarray: ...

    def piece(self, sample: int, offset: int, length: int) -> np.ndarray: ...


class FileSamples:
    """A ``Fetch`` over one flat token array in a ``.npy`` file, sample ``i`` being
    ``tokens[offsets[i]:offsets[i + 1]]``, each read with one ``pread`` into a fresh array.

    Not a memory map on purpose: packing reads samples in mixed order, and every first touch of
    a mapped, cached file maps its neighbourhood too (fault-around, large folios: about 0.5 MB
    per random read here), so within a few thousand reads the whole file is resident in the
    process and counted in its RSS, growing with the corpus; releasing the pages
    (``madvise(MADV_DONTNEED)``) every 1,024 reads did not bound it. Read pages stay in the
    page cache, which the kernel reclaims, not in the process.
    """

    def __init__(self, path: Path, offsets: np.ndarray) -> None:
        with Path(path).open("rb") as handle:
            version = np.lib.format.read_magic(handle)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read_header(handle)
            header = handle.tell()
        if len(shape) != 1 or fortran or int(offsets[-1]) > shape[0]:
            raise ValueError(f"{path}: want a flat array of >= {int(offsets[-1])} tokens")
        self.dtype, self.offsets, self._header = np.dtype(dtype), offsets, header
        self._fd = os.open(path, os.O_RDONLY)

    def __call__(self, sample: int) -> np.ndarray:
        return self._read(sample, int(self.offsets[sample]), int(self.offsets[sample + 1]))

    def piece(self, sample: int, offset: int, length: int) -> np.ndarray:
        """Tokens ``offset .. offset + length - 1`` of the sample (fewer if it is shorter)."""
        end = int(self.offsets[sample + 1])
        lo = min(int(self.offsets[sample]) + offset, end)
        return self._read(sample, lo, min(lo + length, end))

    def _read(self, sample: int, lo: int, hi: int) -> np.ndarray:
        out = np.empty(hi - lo, self.dtype)
        read = os.preadv(self._fd, [out], self._header + lo * self.dtype.itemsize)
        if read != out.nbytes:
            raise ValueError(f"sample {sample}: read {read} of {out.nbytes} bytes")
        return out

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> "FileSamples":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class BlockBatch:
    """Blocks ``first_block .. first_block + blocks - 1`` of a plan, arrays shaped (blocks, T)."""

    first_block: int
    input_ids: np.ndarray
    segment_ids: np.ndarray
    positions: np.ndarray
    label_mask: np.ndarray
    cu_seqlens: np.ndarray
    cu_bounds: np.ndarray
    span_block: np.ndarray
    span_start: np.ndarray
    span_end: np.ndarray
    span_sample: np.ndarray
    span_offset: np.ndarray

    @property
    def blocks(self) -> int:
        return int(self.input_ids.shape[0])


def _copy_slices(
    fetch: Fetch,
    out: np.ndarray,
    dest: np.ndarray,
    sample: np.ndarray,
    offset: np.ndarray,
    length: np.ndarray,
    what: str = "tokens",
) -> None:
    """Copy each planned slice straight to its place; a sample shorter than its plan is an
    error, not pad."""  # fmt: skip
    read = fetch.piece if isinstance(fetch, PieceReader) else (lambda s, o, n: fetch(s)[o : o + n])
    rows = zip(dest.tolist(), sample.tolist(), offset.tolist(), length.tolist(), strict=True)
    for d, s, o, n in rows:
        part = read(s, o, n)
        if part.size != n:
            raise ValueError(f"sample {s} has {o + part.size} {what}, the plan needs {o + n}")
        out[d : d + n] = part


def _runs(block: np.ndarray, length: np.ndarray, k: int, width: int) -> tuple[np.ndarray, ...]:
    """The batch as runs in flat order: per block its pieces, then its pad (maybe empty).
    Returns each run's length, whether it is a piece, and each piece's run index."""
    pieces = np.bincount(block, minlength=k)
    run_of_piece = np.arange(block.size) + block  # one pad run precedes per earlier block
    pad_run = np.cumsum(pieces) + np.arange(k)
    run_length = np.empty(block.size + k, dtype=np.int64)
    run_length[run_of_piece] = length
    run_length[pad_run] = width - np.bincount(block, weights=length, minlength=k).astype(np.int64)
    is_piece = np.zeros(block.size + k, dtype=bool)
    is_piece[run_of_piece] = True
    return run_length, is_piece, run_of_piece


def _segment_rank(block: np.ndarray) -> np.ndarray:
    """0-based rank of each piece in its block (rows sorted by block)."""
    rows = np.arange(block.size)
    new = np.ones(block.size, dtype=bool)
    new[1:] = block[1:] != block[:-1]
    return rows - np.maximum.accumulate(np.where(new, rows, 0))


def _cu_seqlens(block: np.ndarray, ends: np.ndarray, rank: np.ndarray, blocks: int):
    """Flat cu_seqlens (0 then each segment end, per block) and each block's bounds in it."""
    per_block = np.bincount(block, minlength=blocks) + 1
    bounds = np.zeros(blocks + 1, dtype=np.int64)
    np.cumsum(per_block, out=bounds[1:])
    cu = np.zeros(int(bounds[-1]), dtype=np.int32)
    cu[bounds[block] + 1 + rank] = ends
    return cu, bounds


def build_batch(
    plan: PackPlan,
    first: int,
    last: int,
    fetch: Fetch,
    pad_id: int = 0,
    targets: Fetch | None = None,
) -> BlockBatch:
    """The arrays of blocks ``first .. last - 1`` of ``plan`` (layout in the module docstring);
    ``targets``: each sample's target mask (None: every token is a target)."""
    lo, hi = np.searchsorted(plan.block, [first, last])
    block = plan.block[lo:hi] - first
    start, sample = plan.start[lo:hi], plan.sample[lo:hi]
    offset, length = plan.offset[lo:hi], plan.length[lo:hi]
    k, width = last - first, plan.block_tokens
    input_ids = np.full(k * width, pad_id, dtype=np.uint32)
    dest = block * width + start
    _copy_slices(fetch, input_ids, dest, sample, offset, length)
    rank = _segment_rank(block)
    run_length, is_piece, run_of_piece = _runs(block, length, k, width)
    run_segment = np.zeros(run_length.size, dtype=np.int32)
    run_segment[run_of_piece] = rank + 1
    segment_ids = np.repeat(run_segment, run_length)
    run_first = (np.cumsum(run_length) - run_length).astype(np.int32)
    positions = np.arange(k * width, dtype=np.int32) - np.repeat(run_first, run_length)
    positions *= segment_ids != 0  # pad: 0
    last_label = np.where(is_piece, run_length - 1, 0).astype(np.int32)  # pad runs: none
    label = positions < np.repeat(last_label, run_length)
    if targets is not None:  # the next token (same segment, by the line above) is a target
        is_target = np.zeros(k * width, dtype=np.uint8)
        _copy_slices(targets, is_target, dest, sample, offset, length, "targets")
        label[:-1] &= is_target[1:] != 0
    label_mask = label.view(np.uint8)
    cu, bounds = _cu_seqlens(block, start + length, rank, k)
    shape = (k, width)
    return BlockBatch(
        first, input_ids.reshape(shape), segment_ids.reshape(shape), positions.reshape(shape),
        label_mask.reshape(shape), cu, bounds,
        block + first, start, start + length, sample, offset,
    )  # fmt: skip


def iter_block_batches(
    plan: PackPlan,
    fetch: Fetch,
    *,
    batch_blocks: int = 256,
    pad_id: int = 0,
    targets: Fetch | None = None,
) -> Iterator[BlockBatch]:
    """Every block of the plan, in block order, ``batch_blocks`` at a time."""
    if batch_blocks < 1:
        raise ValueError(f"batch_blocks must be >= 1, got {batch_blocks}")
    for first in range(0, plan.blocks, batch_blocks):
        last = min(first + batch_blocks, plan.blocks)
        yield build_batch(plan, first, last, fetch, pad_id, targets)


def unpack_segments(batch: BlockBatch) -> Iterator[tuple[int, int, np.ndarray]]:
    """(sample, source offset, tokens) of every segment, read back through the segment ids
    (not the spans' bounds), so a packing that mislabels a segment shows up as wrong tokens."""
    rank = _segment_rank(batch.span_block)
    for row in range(batch.span_block.size):
        local = int(batch.span_block[row]) - batch.first_block
        ids, segments = batch.input_ids[local], batch.segment_ids[local]
        yield (
            int(batch.span_sample[row]),
            int(batch.span_offset[row]),
            ids[segments == rank[row] + 1],
        )


@dataclass
class BuildAccounting:
    """Label and special-token occupancy over built blocks (the plan's accounting has the rest):
    they are counted apart from utilisation because each can be far lower."""

    special_ids: Iterable[int] = ()
    blocks: int = 0
    capacity_tokens: int = 0
    content_tokens: int = 0
    label_tokens: int = 0
    special_tokens: int = 0
    _special: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._special = np.asarray(sorted(set(self.special_ids)), dtype=np.uint32)

    def add(self, batch: BlockBatch) -> None:
        content = batch.segment_ids != 0
        self.blocks += batch.blocks
        self.capacity_tokens += int(batch.input_ids.size)
        self.content_tokens += int(content.sum())
        self.label_tokens += int(batch.label_mask.sum(dtype=np.int64))
        special = np.isin(batch.input_ids, self._special) & content
        self.special_tokens += int(special.sum())

    def as_dict(self) -> dict[str, int | float]:
        capacity = self.capacity_tokens or 1
        return {
            "blocks": self.blocks,
            "capacity_tokens": self.capacity_tokens,
            "content_tokens": self.content_tokens,
            "label_tokens": self.label_tokens,
            "special_tokens": self.special_tokens,
            "label_occupancy": self.label_tokens / capacity if self.capacity_tokens else 0.0,
            "special_occupancy": self.special_tokens / capacity if self.capacity_tokens else 0.0,
        }
