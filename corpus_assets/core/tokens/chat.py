"""Structured records as token ids with a per-token target mask, by record kind.

Every record becomes one or two sequences, each ``[BOS] + tokens + [EOS]`` (BOS only when
declared, as for documents), with ``targets`` (uint8, one per token): 1 where the token is a
training target. The label rule lives in ``training_view.packing.blocks``: position t carries a
label when t + 1 is in its segment and ``targets[t + 1] == 1``.

- ``document``: the ``text`` column, every token a target (``encode.encode_batch``: the fast path).
- ``messages``: the payload's turns through the spec's pinned chat template
  (``chat_template``); targets are the template's generation parts (default: each assistant
  turn's content, tool calls and ``<|im_end|>``); BOS, EOS and everything else are context.
- ``preference``: two sequences, prompt + chosen then prompt + rejected, each the template's
  render of ``[user: prompt, assistant: answer]``, stored back to back as one record with
  ``pair_split`` = the first sequence's length (0 for every other kind). Targets are the
  answer parts only. Each part is encoded on its own, so the prompt's tokens are the same in
  both sequences whatever the tokenizer (a BPE merge never crosses a part).
"""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
from tokenizers import Tokenizer

from corpus_assets.core.tokens.encode import byte_slices, encode_batch
from corpus_assets.core.tokens.spec import UTF8_BYTES, TokenizerSpec

DOCUMENT, MESSAGES, PREFERENCE = "document", "messages", "preference"
KINDS = (DOCUMENT, MESSAGES, PREFERENCE)
Part = tuple[str, bool]


@dataclass(frozen=True)
class EncodedRecords:
    """Consecutive records' tokens and targets back to back, with per-record counts and splits."""

    ids: np.ndarray
    targets: np.ndarray | None  # uint8, len(ids); None: every token is a target (documents)
    counts: np.ndarray  # int64 tokens per record
    pair_split: np.ndarray  # int64 per record: first sequence's length of a pair, else 0


def sequences(spec: TokenizerSpec, kind: str, payload: dict[str, Any]) -> list[list[Part]]:
    """The rendered parts of each sequence of one structured record (one, or two for a pair)."""
    template = spec.chat_template
    if kind == MESSAGES:
        return [template.render_parts(payload["messages"])]
    if kind == PREFERENCE:
        prompt = {"role": "user", "content": payload["prompt"]}
        return [
            template.render_parts([prompt, {"role": "assistant", "content": payload[side]}])
            for side in ("chosen", "rejected")
        ]
    raise ValueError(f"record kind {kind!r} is not structured (one of {KINDS[1:]})")


def encode_structured(
    spec: TokenizerSpec, kinds: list[str], payloads: list[str], tokenizer: Tokenizer | None
) -> EncodedRecords:
    """Encode ``messages`` / ``preference`` records (payloads as the canonical JSON strings)."""
    per_record = [sequences(spec, k, json.loads(p)) for k, p in zip(kinds, payloads, strict=True)]
    texts = [text for record in per_record for seq in record for text, _ in seq]
    encoded = iter(_encode_texts(spec, texts, tokenizer))
    bos = [] if spec.bos is None else [spec.bos.id]
    ids: list[np.ndarray] = []
    targets: list[np.ndarray] = []
    counts = np.zeros(len(per_record), np.int64)
    split = np.zeros(len(per_record), np.int64)
    for n, record in enumerate(per_record):
        for s, seq in enumerate(record):
            parts = [next(encoded) for _ in seq]
            seq_ids = np.concatenate([np.asarray(bos, spec.dtype), *parts, [spec.eos.id]])
            flags = [np.full(len(p), t, np.uint8) for p, (_, t) in zip(parts, seq, strict=True)]
            seq_targets = np.concatenate([np.zeros(len(bos), np.uint8), *flags, [0]])
            ids.append(seq_ids.astype(spec.dtype))
            targets.append(seq_targets.astype(np.uint8))
            if s == 0 and len(record) == 2:
                split[n] = len(seq_ids)
            counts[n] += len(seq_ids)
    return EncodedRecords(_joined(ids, spec.dtype), _joined(targets, np.uint8), counts, split)


def _joined(arrays: list[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype) if arrays else np.empty(0, dtype)


def _encode_texts(
    spec: TokenizerSpec, texts: list[str], tokenizer: Tokenizer | None
) -> list[np.ndarray]:
    """Each text's content tokens (no specials), in the spec's dtype."""
    if spec.kind == UTF8_BYTES:
        return [np.frombuffer(t.encode("utf-8"), np.uint8).astype(spec.dtype) for t in texts]
    if tokenizer is None:
        raise ValueError(f"tokenizer {spec.digest} is a file: pass the parsed tokenizer")
    encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    return [np.asarray(e.ids, spec.dtype) for e in encodings]


def encode_documents(
    spec: TokenizerSpec, texts: pa.Array, tokenizer: Tokenizer | None, slice_bytes: int
) -> Iterator[EncodedRecords]:
    """Document texts through the fast path, ``slice_bytes`` of text per call; every token is a
    target (``targets`` None: no array is made unless a mixed chunk writes one)."""
    for piece in byte_slices(texts, slice_bytes):
        tokens, counts = encode_batch(spec, piece, tokenizer)
        yield EncodedRecords(tokens, None, counts, np.zeros(len(counts), np.int64))


def encode_records(
    spec: TokenizerSpec, batch: pa.RecordBatch, tokenizer: Tokenizer | None, slice_bytes: int
) -> Iterator[EncodedRecords]:
    """A batch of canonical rows in row order. Without a ``kind`` column every row is a
    document; otherwise runs of documents take the fast path and runs of structured rows
    (``kind`` and ``payload`` columns) go through the chat template."""
    texts = batch.column("text")
    if "kind" not in batch.schema.names:
        yield from encode_documents(spec, texts, tokenizer, slice_bytes)
        return
    kinds = batch.column("kind").to_numpy(zero_copy_only=False).astype(str)
    unknown = set(np.unique(kinds).tolist()) - set(KINDS)
    if unknown:
        raise ValueError(f"record kinds {sorted(unknown)} have no encoder (known: {KINDS})")
    is_doc = kinds == DOCUMENT
    cuts = np.flatnonzero(is_doc[1:] != is_doc[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(kinds)]
    for start, end in pairwise(bounds):
        if start == end:
            continue
        if is_doc[start]:
            run = texts.slice(start, end - start)
            yield from encode_documents(spec, run, tokenizer, slice_bytes)
            continue
        payloads = batch.column("payload").slice(start, end - start).to_pylist()
        yield encode_structured(spec, kinds[start:end].tolist(), payloads, tokenizer)
