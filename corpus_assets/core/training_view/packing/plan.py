"""Packing plans on sample lengths only: which piece of which
sample goes where in which block, decided before any token is read.

Input: the token count of every sample in mixed (stream) order; a sample's index is its stream
position. Output: a ``PackPlan`` of numpy arrays, one row per placed piece (block, start offset in
the block, sample index, offset in the sample, length), sorted by (block, start), plus the
accounting a packer owes (blocks, pad, dropped tokens, utilisation, data-loss rate).

Modes, declared:

- ``atomic``: samples are never split across blocks. The overlong policy runs first so every
  piece fits: ``truncate`` keeps the first T tokens (the rest counted as dropped), ``split`` cuts
  T-sized pieces (each its own piece; the last is packed like any sample), ``quarantine`` drops
  the sample whole and lists it. Pieces are then placed by global best-fit-decreasing: by length
  descending, ties by (sample, offset) ascending; each goes into the open block with the least
  room that still fits it (among equal rooms, the block that reached that room last), else into
  a new block. Pieces of exactly T tokens take a block each, up front.
- ``next_fit``: the same pieces in stream order; a piece that does not fit seals the block (the
  previous behaviour of the layer, kept as the named baseline).
- ``continuous``: the samples' tokens as one stream cut every T tokens (documents cross blocks);
  the partial last block is dropped (``tail="drop"``) or padded (``tail="pad"``).

Atomic samples, declared per sample (``atomic_samples``, e.g. preference pairs): never cut; one
longer than T is quarantined whatever the overlong policy, and ``continuous`` mode refuses them.
``split_pairs`` then turns each pair's one piece into its two sequences (two adjacent segments of
one block, both naming the pair's sample), after planning and ordering.

Inside a block, pieces sit in stream order (by sample, then offset), contiguous from offset 0;
the rest of the block is pad. With a ``seed``, blocks are then reordered by a keyed hash: a
block's content key is the little-endian int64 pairs (sample, offset) of its pieces in that
order, and blocks are sorted by ``sha256(seed + b"\\0" + key)`` ascending (keys are unique, so
the order is total). It depends only on the lengths, the mode, T and the seed: never on workers.
"""

from array import array
from bisect import bisect_left, insort
from dataclasses import dataclass, replace
from hashlib import sha256

import numpy as np

MODES = ("atomic", "next_fit", "continuous")
OVERLONG = ("truncate", "split", "quarantine")
TAILS = ("drop", "pad")


@dataclass(frozen=True)
class Pieces:
    """Pieces of samples, each at most T tokens, in stream order (sample, offset)."""

    sample: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    dropped_tokens: int
    quarantined: np.ndarray  # sample indices dropped whole


@dataclass(frozen=True)
class PackPlan:
    """Where every piece goes; rows sorted by (block, start). Pad is the complement of pieces."""

    mode: str
    block_tokens: int
    blocks: int
    block: np.ndarray
    start: np.ndarray
    sample: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    quarantined: np.ndarray
    input_tokens: int
    dropped_tokens: int

    def block_bounds(self) -> np.ndarray:
        """Row index where each block's pieces begin; ``blocks + 1`` entries."""
        return np.searchsorted(self.block, np.arange(self.blocks + 1), side="left")

    def accounting(self) -> dict[str, int | float | str]:
        """Utilisation alone hides a dropped tail, so loss is reported."""
        capacity = self.blocks * self.block_tokens
        content = int(self.length.sum())
        return {
            "mode": self.mode,
            "block_tokens": self.block_tokens,
            "blocks": self.blocks,
            "pieces": int(self.length.size),
            "capacity_tokens": capacity,
            "content_tokens": content,
            "pad_tokens": capacity - content,
            "input_tokens": self.input_tokens,
            "dropped_tokens": self.dropped_tokens,
            "quarantined_samples": int(self.quarantined.size),
            "utilisation": content / capacity if capacity else 0.0,
            "data_loss_rate": self.dropped_tokens / self.input_tokens if self.input_tokens else 0.0,
        }


def _lengths(lengths: np.ndarray, block_tokens: int) -> np.ndarray:
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.ndim != 1 or (lengths.size and lengths.min() < 0):
        raise ValueError("lengths must be a 1-D array of non-negative token counts")
    return lengths


def apply_overlong(
    lengths: np.ndarray, block_tokens: int, overlong: str, atomic: np.ndarray | None = None
) -> Pieces:
    """The declared overlong policy, so every piece entering a packer is 1..T tokens.

    ``atomic`` (bool per sample) marks samples never cut, whatever the policy: one longer than
    T is quarantined (a preference pair cut in two is no pair)."""
    if overlong not in OVERLONG:
        raise ValueError(f"overlong must be one of {OVERLONG}, got {overlong!r}")
    lengths = _lengths(lengths, block_tokens)
    if atomic is not None:
        atomic = np.asarray(atomic, dtype=bool)
        if atomic.shape != lengths.shape:
            raise ValueError(f"atomic_samples has {atomic.size} entries for {lengths.size} samples")
        whole = atomic & (lengths > block_tokens)
        if whole.any():
            pieces = apply_overlong(np.where(whole, 0, lengths), block_tokens, overlong)
            quarantined = np.union1d(pieces.quarantined, np.flatnonzero(whole))
            dropped = pieces.dropped_tokens + int(lengths[whole].sum())
            return Pieces(pieces.sample, pieces.offset, pieces.length, dropped, quarantined)
    index = np.arange(lengths.size, dtype=np.int64)
    over = lengths > block_tokens
    empty = np.empty(0, dtype=np.int64)
    if overlong == "quarantine":
        keep = (lengths > 0) & ~over
        return Pieces(index[keep], np.zeros(int(keep.sum()), np.int64), lengths[keep],
                      int(lengths[over].sum()), index[over])  # fmt: skip
    if overlong == "truncate":
        keep = lengths > 0
        cut = np.minimum(lengths[keep], block_tokens)
        dropped = int((lengths - np.minimum(lengths, block_tokens)).sum())
        return Pieces(index[keep], np.zeros(cut.size, np.int64), cut, dropped, empty)
    counts = -(-lengths // block_tokens)  # ceil; 0 for an empty sample
    sample = np.repeat(index, counts)
    del index, over
    first = np.cumsum(counts)
    first -= counts  # each sample's first piece
    offset = np.arange(sample.size, dtype=np.int64)
    offset -= np.repeat(first, counts)  # the piece's number within its sample ...
    del first, counts
    offset *= block_tokens  # ... times T: in place, one piece-sized temporary at a time
    length = lengths[sample]
    length -= offset
    np.minimum(length, block_tokens, out=length)
    return Pieces(sample, offset, length, 0, empty)


def best_fit_blocks(length: np.ndarray, block_tokens: int) -> np.ndarray:
    """Block of each piece by best-fit-decreasing (rule in the module docstring)."""
    order = np.argsort(-length, kind="stable")  # length desc, stream position asc
    block = np.empty(length.size, dtype=np.int64)
    full = length[order] == block_tokens
    n_full = int(full.sum())
    block[order[:n_full]] = np.arange(n_full)  # sorted desc, so full pieces come first
    rest = order[n_full:]
    block[rest] = _best_fit_loop(_int64s(length[rest]), block_tokens, n_full)
    return block


def _int64s(values: np.ndarray) -> array:
    """The values as a packed ``array('q')``: iterated one Python int at a time, so a loop over
    n pieces holds 8 bytes each, not a list of n int objects (~36 bytes each)."""
    packed = array("q")
    packed.frombytes(memoryview(np.ascontiguousarray(values, dtype=np.int64)).cast("B"))
    return packed


def _best_fit_loop(needs: array, block_tokens: int, first_block: int) -> np.ndarray:
    """Open blocks bucketed by remaining room; ``rooms`` is the sorted list of non-empty
    buckets (at most T + 1 entries), so each placement is one bisect: O(n log T). Memory: the
    two packed arrays (8 bytes a piece) and the ids of the open blocks."""
    buckets: list[list[int]] = [[] for _ in range(block_tokens + 1)]
    rooms: list[int] = []
    placed = array("q", bytes(8 * len(needs)))
    next_block = first_block
    for i, need in enumerate(needs):
        at = bisect_left(rooms, need)
        if at < len(rooms):
            room = rooms[at]
            bucket = buckets[room]
            block = bucket.pop()
            if not bucket:
                del rooms[at]
        else:
            room, block = block_tokens, next_block
            next_block += 1
        placed[i] = block
        room -= need
        if room:
            bucket = buckets[room]
            if not bucket:
                insort(rooms, room)
            bucket.append(block)
    return np.frombuffer(placed, dtype=np.int64)


def next_fit_blocks(length: np.ndarray, block_tokens: int) -> np.ndarray:
    """Block of each piece when a piece that does not fit seals the current block."""
    placed = array("q", bytes(8 * length.size))
    block, used = -1, block_tokens
    for i, need in enumerate(_int64s(length)):
        if used + need > block_tokens:
            block, used = block + 1, 0
        placed[i] = block
        used += need
    return np.frombuffer(placed, dtype=np.int64)


def continuous_pieces(
    lengths: np.ndarray, block_tokens: int, tail: str
) -> tuple[Pieces, np.ndarray, int]:
    """Cut the concatenated stream every T tokens: the pieces, the block of each, the blocks."""
    if tail not in TAILS:
        raise ValueError(f"tail must be one of {TAILS}, got {tail!r}")
    lengths = _lengths(lengths, block_tokens)
    total = int(lengths.sum())
    blocks = total // block_tokens if tail == "drop" else -(-total // block_tokens)
    kept = blocks * block_tokens
    begin = np.cumsum(lengths) - lengths
    end = np.minimum(begin + lengths, kept)
    live = end > begin
    index = np.arange(lengths.size, dtype=np.int64)[live]
    begin, end = begin[live], end[live]
    first = begin // block_tokens
    counts = (end - 1) // block_tokens - first + 1
    sample = np.repeat(index, counts)
    row_first = np.cumsum(counts) - counts
    block = np.repeat(first, counts) + np.arange(sample.size) - np.repeat(row_first, counts)
    lo = np.maximum(np.repeat(begin, counts), block * block_tokens)
    hi = np.minimum(np.repeat(end, counts), (block + 1) * block_tokens)
    offset = lo - np.repeat(begin, counts)
    empty = np.empty(0, dtype=np.int64)
    return Pieces(sample, offset, hi - lo, total - min(total, kept), empty), block, blocks


def layout_pieces(pieces: Pieces, block: np.ndarray) -> tuple[np.ndarray, ...]:
    """Sort pieces by (block, sample, offset) and give each its start: contiguous from 0.
    The pieces' arrays and ``block`` are the caller's to give up: they are sorted in place,
    one at a time (a piece array is ~4 MB at 500k pieces, and the plan's peak is the arrays
    alive at once: sorted copies beside the inputs were +24 bytes a piece)."""
    order = np.lexsort((pieces.offset, pieces.sample, block))
    for values in (block, pieces.length, pieces.sample, pieces.offset):
        values[...] = values[order]
    del order
    start = np.cumsum(pieces.length)
    start -= pieces.length  # each piece's begin in the stream of pieces
    block_begin = np.where(_firsts(block), start, 0)
    np.maximum.accumulate(block_begin, out=block_begin)
    start -= block_begin
    del block_begin
    return block, start, pieces.sample, pieces.offset, pieces.length


def _firsts(block: np.ndarray) -> np.ndarray:
    """Whether each row (sorted by block) is its block's first."""
    first = np.ones(block.size, dtype=bool)
    np.not_equal(block[1:], block[:-1], out=first[1:])
    return first


KEY_BLOCKS = 1 << 14  # blocks whose keys are laid out at a time for hashing


def block_order(
    block: np.ndarray, sample: np.ndarray, offset: np.ndarray, blocks: int, seed: bytes
) -> np.ndarray:
    """New id of each block: rank of ``sha256(seed NUL key)`` (rows sorted by block).

    Digests go into one (blocks, 32) byte array, ranked by a lexsort of its four big-endian
    words (the same order as comparing the digests as bytes): 40 bytes a block, not a list of
    bytes objects and a sorted list of ints."""
    bounds = _int64s(np.searchsorted(block, np.arange(blocks + 1)))
    prefix = sha256(seed + b"\0")
    digests = np.empty((blocks, 32), dtype=np.uint8)
    for first in range(0, blocks, KEY_BLOCKS):  # keys of a batch of blocks at a time
        last = min(first + KEY_BLOCKS, blocks)
        lo, hi = bounds[first], bounds[last]
        keys = np.empty((hi - lo, 2), dtype="<i8")  # the bytes hashed: (sample, offset) LE
        keys[:, 0], keys[:, 1] = sample[lo:hi], offset[lo:hi]
        raw = memoryview(keys).cast("B")
        for b in range(first, last):
            h = prefix.copy()
            h.update(raw[(bounds[b] - lo) * 16 : (bounds[b + 1] - lo) * 16])
            digests[b] = np.frombuffer(h.digest(), np.uint8)
    order = _digest_order(digests)
    del digests
    rank = np.empty(blocks, dtype=np.int64)
    rank[order] = np.arange(blocks)
    return rank


def _digest_order(digests: np.ndarray) -> np.ndarray:
    """The rows of ``digests`` (n, 32 bytes) in byte order: by their first big-endian word,
    which distinct digests all but never share, else by all four words (a lexsort copies each
    word column: 40 bytes a block where this takes 17)."""
    first = np.ascontiguousarray(digests[:, :8]).view(">u8").ravel()
    order = np.argsort(first, kind="stable")
    ordered = first[order]
    if len(ordered) and (ordered[1:] == ordered[:-1]).any():
        return np.lexsort(digests.view(">u8").T[::-1])
    return order


def plan_packing(
    lengths: np.ndarray,
    block_tokens: int,
    mode: str = "atomic",
    *,
    overlong: str = "split",
    tail: str = "pad",
    seed: bytes | None = None,
    atomic_samples: np.ndarray | None = None,
) -> PackPlan:
    """Plan the packing of samples of these token counts (stream order); see the module doc.

    ``atomic_samples`` (bool per sample, e.g. ``pair_split > 0``) are never cut: longer than T,
    they are quarantined whatever ``overlong`` says; ``continuous`` mode refuses them."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    lengths = _lengths(lengths, block_tokens)
    if mode == "continuous":
        if atomic_samples is not None and np.any(atomic_samples):
            raise ValueError(
                "continuous packing cuts samples at block boundaries, so it cannot keep atomic "
                "samples (preference pairs) whole; pack them in atomic or next_fit mode"
            )
        pieces, block, blocks = continuous_pieces(lengths, block_tokens, tail)
    else:
        pieces = apply_overlong(lengths, block_tokens, overlong, atomic_samples)
        pack = best_fit_blocks if mode == "atomic" else next_fit_blocks
        block = pack(pieces.length, block_tokens)
        blocks = int(block.max()) + 1 if block.size else 0
    quarantined, dropped = pieces.quarantined, pieces.dropped_tokens
    block, start, sample, offset, length = layout_pieces(pieces, block)
    del pieces  # its arrays: the laid-out copies stand for them
    if seed is not None and blocks:
        block = block_order(block, sample, offset, blocks, seed)[block]
        order = np.lexsort((start, block))
        block, start = block[order], start[order]  # one array replaced at a time
        sample, offset = sample[order], offset[order]
        length = length[order]
        del order
    return PackPlan(mode, block_tokens, blocks, block, start, sample, offset, length,
                    quarantined, int(lengths.sum()), dropped)  # fmt: skip


def split_pairs(
    plan: PackPlan, pair_split: np.ndarray, lengths: np.ndarray | None = None
) -> PackPlan:
    """Each preference pair's piece as two adjacent segments of one block: (offset 0, ``split``
    tokens) then (offset ``split``, the rest), both naming the pair's sample (the pair id).

    ``pair_split`` is per sample (0 = not a pair). A pair must have been planned whole (see
    ``atomic_samples``): a cut or moved piece is an error; with ``lengths``, so is a truncated
    one. Block order is not recomputed (the keyed hash saw the pair as one piece)."""
    pair_split = np.asarray(pair_split, dtype=np.int64)
    split = pair_split[plan.sample] if plan.sample.size else np.empty(0, np.int64)
    is_pair = split > 0
    if not is_pair.any():
        return plan
    if plan.mode == "continuous":
        raise ValueError("continuous packing cannot keep preference pairs whole; use atomic")
    whole = (plan.offset == 0) & (plan.length > split)
    if lengths is not None:
        whole &= plan.length == np.asarray(lengths, dtype=np.int64)[plan.sample]
    if (is_pair & ~whole).any() or np.unique(plan.sample[is_pair]).size != int(is_pair.sum()):
        bad = sorted(set(plan.sample[is_pair & ~whole].tolist())) or "a repeated pair"
        raise ValueError(f"pair samples {bad} were cut by the plan; plan pairs as atomic_samples")
    copies = 1 + is_pair
    rows = np.repeat(np.arange(plan.sample.size), copies)
    second = np.zeros(rows.size, dtype=bool)
    second[np.cumsum(copies)[is_pair] - 1] = True
    first_of_pair = np.repeat(is_pair, copies) & ~second
    cut = np.repeat(split, copies)
    start, offset, length = plan.start[rows], plan.offset[rows], plan.length[rows]
    length = np.where(first_of_pair, cut, np.where(second, length - cut, length))
    start = np.where(second, start + cut, start)
    offset = np.where(second, cut, offset)
    return replace(
        plan, block=plan.block[rows], start=start, sample=plan.sample[rows], offset=offset,
        length=length,
    )  # fmt: skip
