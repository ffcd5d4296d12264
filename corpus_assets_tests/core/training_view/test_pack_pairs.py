"""Preference pairs and target masks through packing: pairs planned atomically and laid out as
two segments of one block, labels from per-token targets, and the gates over built blocks."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus_assets.core.tokens.chat import encode_structured
from corpus_assets.core.tokens.spec import utf8_spec
from corpus_assets.core.training_view.packing.blocks import (
    BlockBatch,
    build_batch,
    iter_block_batches,
    unpack_segments,
)
from corpus_assets.core.training_view.packing.checks import (
    check_block_invariants,
    check_pair_prompts,
)
from corpus_assets.core.training_view.packing.plan import plan_packing, split_pairs

SPEC = utf8_spec()


def chat_samples(payloads: list[tuple[str, dict]]):
    """Encode (kind, payload) records; returns lengths, pair splits, and token/target fetches."""
    encoded = encode_structured(
        SPEC, [k for k, _ in payloads], [json.dumps(p) for _, p in payloads], None
    )
    ends = np.cumsum(encoded.counts)
    begins = ends - encoded.counts

    def tokens(i: int) -> np.ndarray:
        return encoded.ids[begins[i] : ends[i]]

    def targets(i: int) -> np.ndarray:
        return encoded.targets[begins[i] : ends[i]]

    return encoded.counts, encoded.pair_split, tokens, targets


PAIRS = [
    ("preference", {"prompt": "Name a river.", "chosen": "The Tagus.", "rejected": "Paris."}),
    (
        "messages",
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
            ]
        },
    ),
    ("preference", {"prompt": "2+2?", "chosen": "4", "rejected": "5"}),
]


def test_a_pair_is_two_segments_of_one_block_naming_one_sample():
    lengths, pair_split, tokens, targets = chat_samples(PAIRS)
    plan = plan_packing(lengths, 256, "atomic", atomic_samples=pair_split > 0, seed=b"k")
    plan = split_pairs(plan, pair_split, lengths)
    batch = build_batch(plan, 0, plan.blocks, tokens, SPEC.pad.id, targets)
    for sample in (0, 2):
        rows = np.flatnonzero(batch.span_sample == sample)
        assert rows.size == 2 and len(set(batch.span_block[rows].tolist())) == 1
        first, second = rows
        assert batch.span_end[first] == batch.span_start[second]
        assert batch.span_offset[[first, second]].tolist() == [0, pair_split[sample]]
        block = int(batch.span_block[first]) - batch.first_block
        seg = batch.segment_ids[block]
        a, b = int(batch.span_start[first]), int(batch.span_start[second])
        assert seg[b] == seg[a] + 1 and batch.positions[block][b] == 0
        labels = batch.label_mask[block]
        prompt = int(np.flatnonzero(targets(sample))[0])
        assert not labels[a : a + prompt - 1].any() and labels[a + prompt - 1] == 1
        assert not labels[b : b + prompt - 1].any() and labels[b + prompt - 1] == 1
        assert labels[b - 1] == 0  # the chosen sequence's EOS predicts nothing
    unpacked = {(s, o): t.tolist() for s, o, t in unpack_segments(batch)}
    split = int(pair_split[0])
    assert unpacked[(0, 0)] == tokens(0)[:split].tolist()
    assert unpacked[(0, split)] == tokens(0)[split:].tolist()
    assert check_block_invariants(batch) == []
    assert check_pair_prompts(batch, pair_split, targets) == []


def test_a_pair_longer_than_the_block_is_quarantined_whatever_the_overlong_policy():
    lengths = np.array([30, 30, 5])
    pairs = np.array([0, 12, 0])
    for overlong in ("split", "truncate", "quarantine"):
        plan = plan_packing(lengths, 16, "atomic", overlong=overlong, atomic_samples=pairs > 0)
        assert 1 in plan.quarantined.tolist() and 1 not in plan.sample.tolist()
        assert (0 in plan.sample.tolist()) == (overlong != "quarantine")
        figures = plan.accounting()
        assert figures["content_tokens"] + figures["dropped_tokens"] == int(lengths.sum())
    with pytest.raises(ValueError, match="atomic_samples has 2 entries"):
        plan_packing(lengths, 16, atomic_samples=np.array([True, False]))


def test_continuous_packing_and_cut_pairs_are_refused():
    lengths = np.array([10, 8])
    pairs = np.array([4, 0])
    with pytest.raises(ValueError, match="continuous"):
        plan_packing(lengths, 8, "continuous", atomic_samples=pairs > 0)
    with pytest.raises(ValueError, match="continuous"):
        split_pairs(plan_packing(lengths, 8, "continuous"), pairs)
    cut = plan_packing(lengths, 8, "atomic", overlong="split")  # pairs not declared atomic
    with pytest.raises(ValueError, match=r"pair samples \[0\] were cut"):
        split_pairs(cut, pairs)
    truncated = plan_packing(lengths, 8, "atomic", overlong="truncate")
    with pytest.raises(ValueError, match="were cut"):
        split_pairs(truncated, pairs, lengths)
    assert split_pairs(cut, np.zeros(2, np.int64)) is cut


def tamper_first_prompt_token(batch: BlockBatch, sample: int) -> int:
    """Change the second sequence's first prompt token of ``sample``; returns its block."""
    second = np.flatnonzero(batch.span_sample == sample)[1]
    block = int(batch.span_block[second]) - batch.first_block
    batch.input_ids[block, int(batch.span_start[second]) + 1] ^= 1
    return block + batch.first_block


def test_the_gate_names_a_tampered_pair_and_the_block_checker_a_tampered_block():
    lengths, pair_split, tokens, targets = chat_samples(PAIRS)
    plan = plan_packing(lengths, 160, "atomic", atomic_samples=pair_split > 0)
    plan = split_pairs(plan, pair_split)
    batch = build_batch(plan, 0, plan.blocks, tokens, SPEC.pad.id, targets)
    block = tamper_first_prompt_token(batch, 2)
    (violation,) = check_pair_prompts(batch, pair_split, targets)
    assert f"pair sample 2 in block {block}" in violation and "prompt tokens differ" in violation
    assert check_block_invariants(batch) == []  # token values are not a block invariant
    labels = batch.label_mask.copy()
    pad = np.argwhere(batch.segment_ids == 0)[0]
    batch.label_mask[tuple(pad)] = 1
    last = int(batch.span_end[0]) - 1  # the last token of a segment
    batch.label_mask[int(batch.span_block[0]), last] = 1
    found = check_block_invariants(batch)
    assert any(f"label on pad: block {pad[0]}" in f for f in found), found
    assert any("across a segment boundary" in f for f in found), found
    batch.label_mask[:] = labels
    batch.segment_ids[int(batch.span_block[0]), 0] = 7
    assert any("segment ids" in f for f in check_block_invariants(batch))


# --- properties --------------------------------------------------------------------------------


@st.composite
def samples_with_targets(draw):
    """(lengths, pair splits, tokens, targets): some samples are pairs whose two sequences share
    a prompt (leading non-targets) and end differently; targets are random elsewhere."""
    n = draw(st.integers(0, 25))
    lengths, splits, tokens, targets = [], [], [], []
    for i in range(n):
        if draw(st.booleans()):
            prompt = draw(st.integers(1, 6))
            answers = draw(st.integers(1, 6)), draw(st.integers(1, 6))
            head = np.arange(prompt) + 1000 * i + 1
            seqs = [
                np.concatenate([head, np.arange(a) + 1000 * i + 500 + 50 * s])
                for s, a in enumerate(answers)
            ]
            marks = [np.r_[np.zeros(prompt), np.ones(a)] for a in answers]
            splits.append(prompt + answers[0])
            tokens.append(np.concatenate(seqs))
            targets.append(np.concatenate(marks))
        else:
            length = draw(st.integers(0, 20))
            splits.append(0)
            tokens.append(np.arange(length) + 1000 * i + 1)
            marked = draw(st.lists(st.booleans(), min_size=length, max_size=length))
            targets.append(np.array(marked))
        lengths.append(len(tokens[-1]))
    return (
        np.array(lengths, np.int64),
        np.array(splits, np.int64),
        [t.astype(np.uint32) for t in tokens],
        [t.astype(np.uint8) for t in targets],
    )


@settings(max_examples=80, deadline=None)
@given(
    samples_with_targets(),
    st.integers(4, 24),
    st.sampled_from(["atomic", "next_fit"]),
    st.sampled_from(["truncate", "split", "quarantine"]),
)
def test_label_sum_is_the_targets_after_each_segment_start_and_pairs_pass_the_gates(
    data, block, mode, overlong
):
    lengths, pair_split, tokens, targets = data
    plan = plan_packing(lengths, block, mode, overlong=overlong, atomic_samples=pair_split > 0)
    plan = split_pairs(plan, pair_split, lengths)
    rows = zip(plan.sample.tolist(), plan.offset.tolist(), plan.length.tolist(), strict=True)
    expected = sum(int(targets[s][o + 1 : o + n].sum()) for s, o, n in rows)
    labels = 0
    for batch in iter_block_batches(
        plan, tokens.__getitem__, batch_blocks=3, pad_id=0, targets=targets.__getitem__
    ):
        labels += int(batch.label_mask.sum())
        assert check_block_invariants(batch) == []
        assert check_pair_prompts(batch, pair_split, targets.__getitem__) == []
        for sample, offset, got in unpack_segments(batch):
            assert got.tolist() == tokens[sample][offset : offset + got.size].tolist()
    assert labels == expected
    pairs = set(np.flatnonzero(pair_split).tolist())
    placed = set(plan.sample.tolist()) & pairs
    assert placed | (set(plan.quarantined.tolist()) & pairs) == pairs
    for sample in placed:  # every placed pair: exactly its two sequences, one block
        rows = plan.sample == sample
        assert plan.offset[rows].tolist() == [0, pair_split[sample]]
        assert len(set(plan.block[rows].tolist())) == 1
        assert plan.length[rows].sum() == lengths[sample] <= block
