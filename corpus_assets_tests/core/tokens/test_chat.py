"""Chat records as tokens: the pinned template's exact text and digest, assistant-only targets,
preference pairs with one prompt, both tokenizer kinds, and the token cache's mixed chunks."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from corpus_assets.core.records.index import RECORD_COLUMNS, ChunkRecords
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import get_json, put_table
from corpus_assets.core.tokens.bpe import train_byte_level_bpe
from corpus_assets.core.tokens.cache import ensure_tokens, open_tokens
from corpus_assets.core.tokens.chat import encode_records, encode_structured
from corpus_assets.core.tokens.chat_template import (
    CHATML_V1,
    DEFAULT_CHAT_TEMPLATE,
    ChatTemplate,
    ChatTemplateError,
)
from corpus_assets.core.tokens.spec import HUGGINGFACE, Special, TokenizerSpec, utf8_spec

TOOL_CHAT = [
    {"role": "user", "content": "Weather in Lisbon?"},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [{"id": "t1", "name": "weather"}],
    },
    {"role": "tool", "tool_call_id": "t1", "content": "18 C"},
    {"role": "assistant", "content": "It is 18 C."},
]
GOLDEN = (
    "<|im_start|>user\nWeather in Lisbon?<|im_end|>\n"
    "<|im_start|>assistant\n"
    'Let me look.\n<tool_call>{"id": "t1", "name": "weather"}</tool_call><|im_end|>\n'
    '<|im_start|>tool\n<tool_response>"t1"\n18 C</tool_response><|im_end|>\n'
    "<|im_start|>assistant\nIt is 18 C.<|im_end|>\n"
)
ASSISTANT_BODIES = [
    'Let me look.\n<tool_call>{"id": "t1", "name": "weather"}</tool_call><|im_end|>',
    "It is 18 C.<|im_end|>",
]
PAIR = {"prompt": "2+2?", "chosen": "4", "rejected": "5, surely"}
SPECIALS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]


def encode_one(spec: TokenizerSpec, kind: str, payload: dict, tokenizer=None):
    return encode_structured(spec, [kind], [json.dumps(payload)], tokenizer)


def target_text(ids: np.ndarray, targets: np.ndarray) -> bytes:
    return bytes(ids[targets == 1].astype(np.uint8).tolist())


# --- the template ------------------------------------------------------------------------------


def test_the_default_template_renders_a_tool_chat_exactly_and_its_digest_is_its_bytes():
    assert DEFAULT_CHAT_TEMPLATE.render(TOOL_CHAT) == GOLDEN
    digest = "sha256:" + hashlib.sha256(CHATML_V1.encode("utf-8")).hexdigest()
    assert DEFAULT_CHAT_TEMPLATE.digest == digest
    # pinned: any edit of the shipped template must show up here (and re-keys the token cache)
    assert digest == "sha256:78e48e1ef27ca9340f22e1f38fade6fa7cc4c59684f8e2ba9f7f2bcea7f9384b"
    assert DEFAULT_CHAT_TEMPLATE.document() == {
        "schema": "corpus.chat-template.v1",
        "name": "chatml.v1",
        "digest": digest,
    }
    parts = DEFAULT_CHAT_TEMPLATE.render_parts(TOOL_CHAT)
    assert [text for text, target in parts if target] == ASSISTANT_BODIES
    prompt = DEFAULT_CHAT_TEMPLATE.render(TOOL_CHAT[:1], add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nWeather in Lisbon?<|im_end|>\n<|im_start|>assistant\n"


def test_a_broken_template_is_named_by_its_digest():
    broken = ChatTemplate("broken", "{% for m in messages %}{{ m.content }}")
    with pytest.raises(ChatTemplateError, match=broken.digest):
        broken.render(TOOL_CHAT)
    missing = ChatTemplate("strict", "{{ messages[0].nope }}")
    with pytest.raises(ChatTemplateError, match="nope"):
        missing.render(TOOL_CHAT)


# --- targets -----------------------------------------------------------------------------------


def test_targets_are_exactly_the_assistant_content_and_end_marker():
    spec = utf8_spec(bos=True)
    encoded = encode_one(spec, "messages", {"messages": TOOL_CHAT})
    ids, targets = encoded.ids, encoded.targets
    assert encoded.counts.tolist() == [len(ids)] and encoded.pair_split.tolist() == [0]
    assert (ids[0], ids[-1]) == (spec.bos.id, spec.eos.id)  # type: ignore[union-attr]
    assert bytes(ids[1:-1].astype(np.uint8).tolist()) == GOLDEN.encode()
    expected = np.zeros(len(ids), np.uint8)
    for body in ASSISTANT_BODIES:
        at = GOLDEN.index(body) + 1  # after BOS
        expected[at : at + len(body.encode())] = 1
    assert targets.tolist() == expected.tolist()
    assert target_text(ids, targets) == "".join(ASSISTANT_BODIES).encode()


CONTENT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
TURNS = st.lists(
    st.tuples(st.sampled_from(["system", "user", "assistant"]), CONTENT), min_size=1, max_size=6
)


@settings(max_examples=60, deadline=None)
@given(TURNS)
def test_target_bytes_are_the_assistant_turns_whatever_their_text(turns):
    """Even content that looks like the template's own markers never moves the mask."""
    messages = [{"role": r, "content": c} for r, c in turns]
    encoded = encode_one(utf8_spec(), "messages", {"messages": messages})
    wanted = "".join(c + "<|im_end|>" for r, c in turns if r == "assistant")
    assert target_text(encoded.ids, encoded.targets) == wanted.encode()
    rendered = DEFAULT_CHAT_TEMPLATE.render(messages).encode()
    assert bytes(encoded.ids[:-1].astype(np.uint8).tolist()) == rendered


def test_a_preference_is_two_sequences_with_one_prompt_and_answer_only_targets():
    spec = utf8_spec()
    encoded = encode_one(spec, "preference", PAIR)
    split = int(encoded.pair_split[0])
    first, second = encoded.ids[:split], encoded.ids[split:]
    t_first, t_second = encoded.targets[:split], encoded.targets[split:]
    assert first[-1] == second[-1] == spec.eos.id
    prompt = b"<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    for ids, targets, answer in ((first, t_first, "4"), (second, t_second, "5, surely")):
        assert bytes(ids[: len(prompt)].astype(np.uint8).tolist()) == prompt
        assert int(np.flatnonzero(targets)[0]) == len(prompt)  # the prompt is context
        assert target_text(ids, targets) == f"{answer}<|im_end|>".encode()
    assert encoded.counts.tolist() == [len(encoded.ids)]


def _chat_bpe() -> tuple[Tokenizer, TokenizerSpec]:
    texts = [GOLDEN, "The weather is fine.", "2+2? 4. 5, surely"] * 5
    tokenizer = Tokenizer.from_str(train_byte_level_bpe([texts], 400, SPECIALS).decode())
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    spec = TokenizerSpec(
        kind=HUGGINGFACE,
        digest="sha256:" + "1" * 64,
        file=None,
        vocab_size=max(vocab.values()) + 1,
        eos=Special(SPECIALS[0], vocab[SPECIALS[0]]),
        pad=Special(SPECIALS[1], vocab[SPECIALS[1]]),
    )
    return tokenizer, spec


def test_huggingface_parts_are_encoded_alone_and_markers_are_their_special_ids():
    tokenizer, spec = _chat_bpe()
    encoded = encode_one(spec, "messages", {"messages": TOOL_CHAT}, tokenizer)
    parts = DEFAULT_CHAT_TEMPLATE.render_parts(TOOL_CHAT)
    expected_ids: list[int] = []
    expected_targets: list[int] = []
    for text, target in parts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        expected_ids += ids
        expected_targets += [int(target)] * len(ids)
    assert encoded.ids.tolist() == [*expected_ids, spec.eos.id]
    assert encoded.targets.tolist() == [*expected_targets, 0]
    im_end = tokenizer.token_to_id("<|im_end|>")
    assert encoded.ids.tolist().count(im_end) == 4  # one token each, not bytes
    target_ids = encoded.ids[encoded.targets == 1].tolist()
    assert tokenizer.decode(target_ids, skip_special_tokens=False) == "".join(ASSISTANT_BODIES)
    pair = encode_one(spec, "preference", PAIR, tokenizer)
    split = int(pair.pair_split[0])
    prompt = int(np.flatnonzero(pair.targets[:split])[0])
    assert prompt == int(np.flatnonzero(pair.targets[split:])[0])
    assert pair.ids[:prompt].tolist() == pair.ids[split : split + prompt].tolist()


def test_a_mixed_batch_keeps_row_order_and_documents_are_all_targets():
    rows = [
        ("document", "plain one", {"text": "plain one"}),
        ("messages", "x", {"messages": TOOL_CHAT}),
        ("preference", "y", PAIR),
        ("document", "plain two", {"text": "plain two"}),
    ]
    batch = pa.RecordBatch.from_pydict(
        {
            "kind": [k for k, _, _ in rows],
            "payload": [json.dumps(p) for _, _, p in rows],
            "text": [t for _, t, _ in rows],
        }
    )
    spec = utf8_spec()
    parts = list(encode_records(spec, batch, None, 1 << 20))
    counts = np.concatenate([p.counts for p in parts])
    ids = np.concatenate([p.ids for p in parts])
    targets = np.concatenate(
        [np.ones(len(p.ids), np.uint8) if p.targets is None else p.targets for p in parts]
    )
    assert parts[0].targets is None  # documents: all targets, no array
    splits = np.concatenate([p.pair_split for p in parts])
    assert len(counts) == 4 and splits[[0, 1, 3]].tolist() == [0, 0, 0] and splits[2] > 0
    ends = np.cumsum(counts)
    assert ids[: ends[0]].tolist() == [*b"plain one", 256]
    assert targets[: ends[0]].all() and targets[ends[2] :].all()
    assert ids[ends[2] :].tolist() == [*b"plain two", 256]
    with pytest.raises(ValueError, match="novel"):
        bad = pa.RecordBatch.from_pydict({"kind": ["novel"], "payload": ["{}"], "text": ["t"]})
        list(encode_records(spec, bad, None, 1 << 20))


# --- the token cache ---------------------------------------------------------------------------


@pytest.fixture
def catalog_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'catalog.sqlite'}"


def descriptor_targets(ws: Workspace, digest: str):
    return get_json(ws.cas, digest)["targets"]


def _chunk(ws: Workspace, rows: list[tuple[str, dict, str]]) -> ChunkRecords:
    """A records table with every canonical column (only kind, payload and text matter)."""
    columns = {f.name: [None] * len(rows) for f in RECORD_COLUMNS}
    columns["record_id"] = [f"mixed/r{n}" for n in range(len(rows))]
    columns["kind"] = [kind for kind, _, _ in rows]
    columns["payload"] = [json.dumps(payload) for _, payload, _ in rows]
    columns["text"] = [text for _, _, text in rows]
    ref = put_table(ws.cas, pa.table(columns, schema=RECORD_COLUMNS))
    return ChunkRecords("mixed/chunk-0", ref, len(rows))


def test_a_mixed_chunk_round_trips_ids_targets_and_pair_splits_through_the_cas(
    workspace: Workspace,
):
    rows = [
        ("document", {"text": "essay"}, "essay"),
        ("preference", PAIR, "rendered elsewhere"),
        ("messages", {"messages": TOOL_CHAT}, "rendered elsewhere"),
        ("document", {"text": ""}, ""),
    ]
    spec = utf8_spec()
    chunk = _chunk(workspace, rows)
    (cached,) = ensure_tokens(workspace, [chunk], spec, 1)
    arrays = open_tokens(workspace, cached, spec)
    for row, (kind, payload, _) in enumerate(rows):
        alone = encode_one(spec, kind, payload) if kind != "document" else None
        if alone is None:
            assert arrays.record(row).tolist() == [*payload["text"].encode(), 256]
            assert arrays.targets(row).tolist() == [1] * (len(payload["text"]) + 1)
            assert arrays.pair_split(row) == 0
            continue
        assert arrays.record(row).tolist() == alone.ids.tolist()
        assert arrays.targets(row).tolist() == alone.targets.tolist()
        assert arrays.pair_split(row) == int(alone.pair_split[0])
    assert arrays.pair_split(1) > 0 and isinstance(arrays.target_mask, np.memmap)
    assert not arrays.all_targets and descriptor_targets(workspace, cached.digest) is not None
    assert arrays.counts().tolist() == [len(arrays.record(r)) for r in range(4)]
    counts_only = open_tokens(workspace, cached, spec, ids=False)
    assert counts_only.pair_split(1) == arrays.pair_split(1)
    with pytest.raises(ValueError, match="counts only"):
        counts_only.targets(0)
    descriptor = get_json(workspace.cas, cached.digest)
    assert descriptor["schema"] == "corpus.tokens.v2"
    assert descriptor["chatTemplate"] == DEFAULT_CHAT_TEMPLATE.digest
    other = TokenizerSpec(**{**spec.__dict__, "chat_template": ChatTemplate("x", "{{ 1 }}")})
    with pytest.raises(ValueError, match="chat template"):
        open_tokens(workspace, cached, other)
    (again,) = ensure_tokens(workspace, [chunk], other, 1)  # another template is another key
    assert again.tokenized and again.digest != cached.digest


def test_a_chunk_of_documents_stores_no_targets_file_and_reads_all_targets(
    workspace: Workspace,
):
    rows = [("document", {"text": t}, t) for t in ("one", "", "three")]
    spec = utf8_spec()
    (cached,) = ensure_tokens(workspace, [_chunk(workspace, rows)], spec, 1)
    descriptor = get_json(workspace.cas, cached.digest)
    assert descriptor["targets"] is None
    arrays = open_tokens(workspace, cached, spec)
    assert arrays.all_targets and [arrays.pair_split(r) for r in range(3)] == [0, 0, 0]
    assert [arrays.targets(r).tolist() for r in range(3)] == [[1] * 4, [1], [1] * 6]
    assert arrays.record(2).tolist() == [*b"three", 256]
