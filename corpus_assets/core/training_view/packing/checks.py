"""Gates over built blocks (``packing.blocks.BlockBatch``): pure functions returning violations.

They read the block arrays as written, not the plan, so a packing bug or a tampered block shows
up; each violation names the block (and the sample for pairs). An empty list means the batch
passes. ``check_block_invariants`` needs only the batch; ``check_pair_prompts`` also needs each
sample's pair split and target mask (from the token cache) to know where a prompt ends.
"""

from collections.abc import Callable
from itertools import pairwise

import numpy as np

from corpus_assets.core.training_view.packing.blocks import BlockBatch

Targets = Callable[[int], np.ndarray]
SHOWN = 5  # positions listed per violation


def _where(block: int, mask: np.ndarray) -> str:
    at = np.flatnonzero(mask)
    more = f" (+{at.size - SHOWN} more)" if at.size > SHOWN else ""
    return f"block {block}: positions {at[:SHOWN].tolist()}{more}"


def check_block_invariants(batch: BlockBatch) -> list[str]:
    """No label on pad, on a segment's last token or across segments; positions restart at 0
    per segment and count up; segments are numbered 1, 2, ... left to right, contiguous, with
    pad only after them; ``cu_seqlens`` and the spans match the segment ids."""
    seg, labels, pos = batch.segment_ids, batch.label_mask != 0, batch.positions
    k, width = seg.shape
    nxt = np.zeros_like(seg)
    nxt[:, :-1] = seg[:, 1:]
    starts = (seg != 0) & np.concatenate([np.ones((k, 1), bool), seg[:, 1:] != seg[:, :-1]], 1)
    run_start = np.where(starts | (seg == 0), np.arange(width), 0)
    expected_pos = np.arange(width) - np.maximum.accumulate(run_start, axis=1)
    expected_pos[seg == 0] = 0
    checks = {
        "label on pad": labels & (seg == 0),
        "label across a segment boundary or on a segment's last token": labels & (nxt != seg),
        "position does not restart at 0 per segment and count up": pos != expected_pos,
        "segment ids not 1, 2, ... contiguous with pad only at the end": ~_numbered(seg),
    }
    out = []
    for name, bad in checks.items():
        for b in np.flatnonzero(bad.any(axis=1)).tolist():
            out.append(f"{name}: {_where(batch.first_block + b, bad[b])}")
    out += _check_cu_and_spans(batch)
    return out


def _numbered(seg: np.ndarray) -> np.ndarray:
    """True where a token's segment id is what numbering runs left to right from 1 gives
    (content first, then pad to the end)."""
    k, width = seg.shape
    pad = seg == 0
    first_pad = np.where(pad.any(axis=1), pad.argmax(axis=1), width)[:, None]
    content = np.arange(width) < first_pad
    change = np.concatenate([np.ones((k, 1), bool), seg[:, 1:] != seg[:, :-1]], 1)
    expected = np.cumsum(change & content, axis=1)
    return np.where(content, seg == expected, pad)


def _check_cu_and_spans(batch: BlockBatch) -> list[str]:
    out = []
    for b in range(batch.blocks):
        block = batch.first_block + b
        seg = batch.segment_ids[b]
        ends = np.flatnonzero((seg[:-1] != seg[1:]) & (seg[:-1] != 0)) + 1
        if seg.size and seg[-1] != 0:
            ends = np.append(ends, seg.size)
        cu = batch.cu_seqlens[batch.cu_bounds[b] : batch.cu_bounds[b + 1]]
        if cu.tolist() != [0, *ends.tolist()]:
            out.append(f"block {block}: cu_seqlens {cu.tolist()} != segment ends {ends.tolist()}")
        rows = batch.span_block == block
        spans = list(
            zip(batch.span_start[rows].tolist(), batch.span_end[rows].tolist(), strict=True)
        )
        bounds = list(pairwise([0, *ends.tolist()]))
        if spans != bounds:
            out.append(f"block {block}: spans {spans} != segments {bounds}")
    return out


def _prompt_length(targets: np.ndarray) -> int:
    """Leading non-target tokens of a sequence (all of it when it has no target)."""
    hits = np.flatnonzero(targets)
    return int(hits[0]) if hits.size else int(targets.size)


def check_pair_prompts(batch: BlockBatch, pair_split: np.ndarray, targets: Targets) -> list[str]:
    """Every preference pair in the batch is two adjacent segments of one block (offset 0 with
    ``split`` tokens, then offset ``split``), both sequences start with the same prompt tokens
    (read from the block, the prompt being each sequence's leading non-target tokens), and no
    label predicts a prompt token. ``pair_split`` is per sample (0 = not a pair)."""
    split_of = np.asarray(pair_split, dtype=np.int64)[batch.span_sample]
    rows = np.flatnonzero(split_of > 0)
    out: list[str] = []
    by_sample: dict[int, list[int]] = {}
    for row in rows.tolist():
        by_sample.setdefault(int(batch.span_sample[row]), []).append(row)
    for sample, pair in by_sample.items():
        problem = _pair_problem(batch, pair, int(split_of[pair[0]]), targets(sample))
        if problem:
            block = int(batch.span_block[pair[0]])
            out.append(f"pair sample {sample} in block {block}: {problem}")
    return out


def _pair_problem(batch: BlockBatch, rows: list[int], split: int, targets: np.ndarray) -> str:
    """What is wrong with one pair's two span rows, or ''."""
    if len(rows) != 2:
        return f"{len(rows)} segment(s) in this batch, not 2"
    first, second = rows
    layout = (
        int(batch.span_block[first]) == int(batch.span_block[second])
        and int(batch.span_end[first]) == int(batch.span_start[second])
        and (int(batch.span_offset[first]), int(batch.span_offset[second])) == (0, split)
        and int(batch.span_end[first] - batch.span_start[first]) == split
        and int(batch.span_end[second] - batch.span_start[second]) == targets.size - split
    )
    if not layout:
        return "not two adjacent whole sequences of one block at offsets 0 and the split"
    prompts = _prompt_length(targets[:split]), _prompt_length(targets[split:])
    if prompts[0] != prompts[1]:
        return f"prompt lengths differ ({prompts[0]} and {prompts[1]} tokens)"
    local = int(batch.span_block[first]) - batch.first_block
    ids, labels = batch.input_ids[local], batch.label_mask[local]
    a, b, n = int(batch.span_start[first]), int(batch.span_start[second]), prompts[0]
    differ = np.flatnonzero(ids[a : a + n] != ids[b : b + n])
    if differ.size:
        return f"prompt tokens differ at prompt positions {differ[:SHOWN].tolist()}"
    if labels[a : a + n - 1].any() or labels[b : b + n - 1].any():
        return "a label predicts a prompt token"
    return ""
