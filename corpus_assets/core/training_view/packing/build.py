"""packed_blocks: the mixed samples' cached tokens packed into verified block shards.

The plan is made on token counts alone (``packing.plan``: ``policies.packing`` mode, overlong rule,
tail, keyed block order), then blocks are built a batch at a time from the token cache
(``packing.blocks``), a shard per job on the task runner (``packing.shards``: the spawn pool or Ray,
the same bytes either way), and written as chunk-verified shards (``storage.shards``): per block
``input_ids`` (the tokenizer's dtype), ``segment_ids`` and ``positions`` (uint16, uint32 when
T > 65,535) and ``label_mask`` (uint8); ``cu_seqlens`` follow from the segment ids
(``publication.block_reader.cu_seqlens``). The spans table maps every half-open [start, end) of a
block to its record, the offset in that record's token stream, the sample (stream position: a
repeat of a record is another sample; both halves of a preference pair share one), its shard,
the transform that made the tokens and the rule that inserted the special tokens inside it; pad
has no span; it is written from the plan alone (a span is a piece), beside no block.
Memory: the plan (five int64 per piece), the samples' located columns (``packing.samples``: fixed
width, memory-mapped; record ids read a span batch at a time) and at most one Parquet row group
of spans here; one batch of blocks and one shard buffer per worker.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.config import PackingPolicy
from corpus_assets.core.runtime.layer_index import (
    LayerIndex,
    LayerResult,
    publish_index,
    read_layer_index,
)
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import (
    BINARY,
    Ref,
    make_ref,
    put_json,
    put_table,
)
from corpus_assets.core.storage.memory import release_memory
from corpus_assets.core.storage.parquet_sink import TableWriter
from corpus_assets.core.storage.shards import ShardIndex
from corpus_assets.core.storage.table_lookup import TrustedFiles
from corpus_assets.core.tokens import cache as token_cache_module
from corpus_assets.core.tokens.cache import TokenCache, token_cache
from corpus_assets.core.tokens.spec import TokenizerSpec, resolve_tokenizer
from corpus_assets.core.training_view.packing.incremental import (
    Decision,
    ParentPack,
    child_pieces,
    extra_padding,
    full_reason,
    incremental_plan,
    kept_blocks,
    padding_bound,
    parent_pack,
    sample_map,
)
from corpus_assets.core.training_view.packing.kept_shards import fields_of, reused_shards
from corpus_assets.core.training_view.packing.plan import PackPlan, plan_packing, split_pairs
from corpus_assets.core.training_view.packing.samples import DOCUMENT, SampleRows, locate_samples
from corpus_assets.core.training_view.packing.shards import (
    BATCH_BLOCKS,
    KINDS,
    ShardOutcome,
    build_shards,
)

CODE = stage_code("packed_blocks.incremental.v4", __name__)  # its closure, hashed at import
PREVIEW_SPANS = 10
PPM = 1_000_000
SPAN_COLUMNS = pa.schema(
    [
        ("block", pa.int64()),
        ("start", pa.int32()),
        ("end", pa.int32()),
        ("record_id", pa.string()),
        ("record_offset", pa.int64()),
        ("sample", pa.int64()),
        ("shard", pa.int32()),
        ("transform", pa.string()),
        ("specials", pa.string()),
    ]
)


def shard_fields(spec: TokenizerSpec, block_tokens: int) -> dict[str, str]:
    """The per-token fields of a block and their little-endian dtypes."""
    small = "<u2" if block_tokens <= 0xFFFF else "<u4"
    return {
        "input_ids": spec.dtype.newbyteorder("<").str,
        "segment_ids": small,
        "positions": small,
        "label_mask": "|u1",
    }


class PackingError(ValueError):
    """The packing policy cannot pack these samples as declared; names the rule and a record."""


def plan_for(rows: SampleRows, policy: PackingPolicy) -> PackPlan:
    """The policy's plan; preference pairs are atomic and become two segments of one block.
    The block order is keyed by the policy seed, never by workers."""
    pairs = rows.pair_split > 0
    if policy.mode == "continuous" and pairs.any():
        first = rows.record_ids.take(np.flatnonzero(pairs)[:1])[0].as_py()
        raise PackingError(
            f"policies.packing.mode continuous cuts samples at block boundaries, so it cannot "
            f"keep {int(pairs.sum())} preference pairs whole (e.g. {first!r}); use atomic"
        )
    plan = plan_packing(
        rows.length,
        policy.block_tokens,
        policy.mode,
        overlong=policy.overlong,
        tail=policy.tail,
        seed=f"packed_blocks/{policy.seed}".encode(),
        atomic_samples=pairs if pairs.any() else None,
    )
    return split_pairs(plan, rows.pair_split, rows.length)


class SpanRules:
    """The transform and special-token rule of each span, as dictionary strings.

    A span at record offset ``o`` of ``n`` tokens of a record of ``L`` holds the declared BOS
    when ``o == 0`` and the EOS the tokenizer rule appended when ``o + n == L`` (for a
    preference pair, its sequence's); ``messages`` and ``preference`` spans also hold what the
    pinned chat template inserted, so their rule and transform name the template."""

    def __init__(self, spec: TokenizerSpec, rows: SampleRows) -> None:
        template = spec.chat_template
        tokens = f"{token_cache_module.code_version()} tokenizer {spec.digest}"
        self.transform_names = [tokens, f"{tokens} chat-template {template.digest}"]
        bases = ["document", f"chat.{template.name}"]
        suffixes = ["", ".bos", ".eos", ".bos+eos"]
        self.names = pa.array([f"{base}{suffix}" for base in bases for suffix in suffixes])
        self.bos = spec.bos is not None
        self.length, self.pair_split = rows.length, rows.pair_split
        self.chat = np.asarray(rows.kind) != DOCUMENT

    def specials(self, sample: np.ndarray, offset: np.ndarray, length: np.ndarray) -> pa.Array:
        split = self.pair_split[sample]
        starts = (offset == 0) | ((split > 0) & (offset == split))
        ends = (offset + length == self.length[sample]) | ((split > 0) & (offset + length == split))
        code = (starts & self.bos).astype(np.int8) + 2 * ends.astype(np.int8)
        code += 4 * self.chat[sample].astype(np.int8)
        return pa.DictionaryArray.from_arrays(pa.array(code), self.names).cast(pa.string())

    def transforms(self, sample: np.ndarray) -> pa.Array:
        codes = pa.array(self.chat[sample].astype(np.int8))
        return pa.DictionaryArray.from_arrays(codes, self.transform_names).cast(pa.string())


def span_batch(
    plan: PackPlan, lo: int, hi: int, rows: SampleRows, rules: SpanRules, shard_blocks: int
) -> pa.RecordBatch:
    """Plan rows ``[lo, hi)`` as spans: a span is a piece, so no block needs building."""
    block, start, sample = plan.block[lo:hi], plan.start[lo:hi], plan.sample[lo:hi]
    offset, length = plan.offset[lo:hi], plan.length[lo:hi]
    return pa.RecordBatch.from_arrays(
        [
            pa.array(block, pa.int64()),
            pa.array(start, pa.int32()),
            pa.array(start + length, pa.int32()),
            rows.record_ids.take(sample),
            pa.array(offset, pa.int64()),
            pa.array(sample, pa.int64()),
            pa.array(block // shard_blocks, pa.int32()),
            rules.transforms(sample),
            rules.specials(sample, offset, length),
        ],
        schema=SPAN_COLUMNS,
    )


@dataclass(frozen=True)
class BuiltSpans:
    """The spans table as stored: its ref, row count and first rows (the layer's preview)."""

    ref: Ref
    rows: int
    preview: list[dict]


def write_spans(
    ws: Workspace, plan: PackPlan, rows: SampleRows, spec: TokenizerSpec, shard_blocks: int
) -> BuiltSpans:
    """The spans table, ``BATCH_BLOCKS`` blocks of plan rows at a time into a ``TableWriter``
    (a row group of them held at most)."""
    rules = SpanRules(spec, rows)
    spans = TableWriter(ws.cas, SPAN_COLUMNS)
    preview: list[dict] = []
    bounds = plan.block_bounds()
    for first in range(0, plan.blocks, BATCH_BLOCKS):
        lo, hi = int(bounds[first]), int(bounds[min(first + BATCH_BLOCKS, plan.blocks)])
        made = span_batch(plan, lo, hi, rows, rules, shard_blocks)
        if len(preview) < PREVIEW_SPANS:
            preview += made.slice(0, PREVIEW_SPANS - len(preview)).to_pylist()
        spans.write(made)
    return BuiltSpans(ref=spans.close(), rows=spans.rows, preview=preview)


def write_blocks(
    ws: Workspace,
    plan: PackPlan,
    rows: SampleRows,
    spec: TokenizerSpec,
    cache: TokenCache,
    reused: Callable[[int], dict[int, ShardOutcome]] | None = None,
) -> tuple[ShardIndex, Ref, BuiltSpans, dict[str, Any]]:
    """Every block in shards (``packing.shards``: a shard per job on the task runner), then the
    spans; (index, its ref, spans, label and special-token counts). A preference pair whose
    two sequences do not start with the same prompt tokens stops the build before the spans
    (``check_pair_prompts``): a pair gate that fails here never reaches a trainer."""
    fields = shard_fields(spec, plan.block_tokens)
    index, ref, built, broken = build_shards(ws, plan, rows, cache, fields, reused=reused)
    if broken:
        raise PackingError(f"preference pairs with different prompts: {broken[:5]}")
    return index, ref, write_spans(ws, plan, rows, spec, index.shard_blocks), built


def packing_counts(plan: PackPlan, built: dict, rows: SampleRows, spans: int) -> dict[str, int]:
    """Integer counts (ratios in parts per million: hashed documents hold no floats)."""
    planned = plan.accounting()
    capacity = max(int(planned["capacity_tokens"]), 1)
    return {
        "blocks": plan.blocks,
        "block_tokens": plan.block_tokens,
        "tokens": int(planned["capacity_tokens"]),
        "content_tokens": int(planned["content_tokens"]),
        "pad_tokens": int(planned["pad_tokens"]),
        "input_tokens": int(planned["input_tokens"]),
        "dropped_tokens": int(planned["dropped_tokens"]),
        "quarantined_samples": int(planned["quarantined_samples"]),
        "label_tokens": int(built["label_tokens"]),
        "special_tokens": int(built["special_tokens"]),
        "utilisation_ppm": int(planned["content_tokens"]) * PPM // capacity,
        "data_loss_ppm": int(planned["dropped_tokens"]) * PPM // max(plan.input_tokens, 1),
        "label_occupancy_ppm": int(built["label_tokens"]) * PPM // capacity,
        "special_occupancy_ppm": int(built["special_tokens"]) * PPM // capacity,
        "samples": len(rows.length),
        "pairs": int((rows.pair_split > 0).sum()),
        "spans": spans,
    }


def shard_counts(shards: list[list[int]]) -> pa.Table:
    """Label and special tokens per shard: what a child reusing the shard counts for it."""
    columns = np.asarray(shards, dtype=np.int64).reshape(-1, len(KINDS))
    return pa.table(
        {
            "shard": pa.array(np.arange(len(shards)), pa.int64()),
            **{f"{kind}_tokens": pa.array(columns[:, n]) for n, kind in enumerate(KINDS)},
        }
    )


def quarantined_table(plan: PackPlan, rows: SampleRows) -> pa.Table:
    """Samples the overlong rule dropped whole, with their token counts."""
    index = pa.array(plan.quarantined, pa.int64())
    return pa.table(
        {
            "sample": index,
            "record_id": rows.record_ids.take(plan.quarantined),
            "tokens": pa.array(rows.length[plan.quarantined], pa.int64()),
        }
    )


@dataclass(frozen=True)
class Upstream:
    """The layers packing reads, as the incremental plan needs them."""

    partition_key: str
    samples: Ref
    canonical: CanonicalIndex
    dedup: LayerIndex


@dataclass(frozen=True)
class Chosen:
    """The plan to build, why, and for an incremental one its parent and the parent's shards
    it reuses as they are."""

    plan: PackPlan
    decision: Decision
    parent: ParentPack | None = None
    reused: Callable[[int], dict[int, ShardOutcome]] | None = None


@dataclass(frozen=True)
class Candidate:
    """The parent a child may keep blocks of (None, and why not, for a full repack), and each
    parent sample's child sample (``packing.incremental.sample_map``)."""

    parent: ParentPack | None
    reason: str | None
    child_of: np.ndarray | None = None
    rows: SampleRows | None = None  # the child's samples, located by the same join


def candidate(ws: Workspace, up: Upstream, cache: TokenCache) -> Candidate:
    """Whether the policy and the parent allow an incremental plan; the sample map if so, and
    the child's samples located by its join (``sample_map``)."""
    policy, spec = ws.config.policies.packing, cache.spec
    parent = parent_pack(ws, up.partition_key) if policy.incremental else None
    mine = {"tokenizer": spec.document(), "chat_template": spec.chat_template.document()}
    layout = layout_document(policy, shard_fields(spec, policy.block_tokens), spec)
    reason = full_reason(policy, parent, mine, layout)
    if reason is not None or parent is None:
        return Candidate(parent, reason or "no parent snapshot")
    mapped = sample_map(ws, parent, up.samples, up.canonical, up.dedup, cache)
    release_memory()  # DuckDB's and Arrow's buffers, back before any partitioned lookup
    return Candidate(parent, None, mapped.child_of, mapped.rows)


def choose_plan(ws: Workspace, can: Candidate, rows: SampleRows, spec: TokenizerSpec) -> Chosen:
    """The full plan, or the parent-preserving one (``packing.incremental``) when the policy, the
    parent and the padding bound allow it; the decision says which and why."""
    policy = ws.config.policies.packing
    parent = can.parent
    digest = parent.ref["digest"] if parent else None
    if can.reason is not None or parent is None or can.child_of is None:
        why = can.reason or "no parent snapshot"
        return Chosen(plan_for(rows, policy), Decision("full", why, digest))
    pieces = child_pieces(rows.length, rows.pair_split, policy)
    kept = kept_blocks(ws, parent, can.child_of, pieces, rows.pair_split)
    plan, placed = incremental_plan(kept, pieces, rows.length, rows.pair_split, policy)
    if padding_bound(plan) > policy.max_extra_padding:  # else no full plan can exceed it
        full = plan_for(rows, policy)
        extra = extra_padding(plan, full)
        if extra > policy.max_extra_padding:
            bound = policy.max_extra_padding
            why = f"extra padding {extra:.6f} of positions over a full repack > bound {bound}"
            return Chosen(full, Decision("full", why, digest))
    held = int(kept.blocks.sum())
    why = f"kept {held} of {kept.blocks.size} parent blocks, {plan.blocks - held} new"
    fields = shard_fields(spec, policy.block_tokens)
    reused = partial(reused_shards, ws, parent, placed, plan, CODE, fields)
    return Chosen(plan, Decision("incremental", why, digest), parent, reused)


def build_packed_blocks(ws: Workspace, partition_key: str) -> LayerResult:
    mixed_ref, mixed = read_layer_index(ws, partition_key, "mixed_samples")
    canonical_ref, canonical = CanonicalIndex.read(ws, partition_key)
    dedup_ref, dedup = read_layer_index(ws, partition_key, "dedup_clusters")
    samples = TrustedFiles(ws.cas, ws.catalog).path(mixed.output("samples")["digest"], "samples")
    cache = token_cache(ws, canonical.chunks(), resolve_tokenizer(ws))
    spec, policy = cache.spec, ws.config.policies.packing
    can = candidate(ws, Upstream(partition_key, mixed.output("samples"), canonical, dedup), cache)
    located = can.rows or locate_samples(ws, canonical, cache, Path(samples), dedup)
    with located as rows:
        chosen = choose_plan(ws, can, rows, spec)
        plan, decision, parent = chosen.plan, chosen.decision, chosen.parent
        index, index_ref, spans, built = write_blocks(ws, plan, rows, spec, cache, chosen.reused)
        counts = packing_counts(plan, built, rows, spans.rows)
        quarantined = put_table(ws.cas, quarantined_table(plan, rows))
    spans_ref = spans.ref
    outputs = {
        "shard_index": index_ref,
        "shards": [make_ref(s.digest, BINARY, s.size) for s in index.shards],
        "spans": spans_ref,
        "quarantined": quarantined,
        "layout": put_json(ws.cas, layout_document(policy, fields_of(index), spec)),
        "packing": decision.document(),
        "shard_counts": put_table(ws.cas, shard_counts(built["shards"])),
        "dtype": spec.dtype_name,
        "tokenizer": spec.document(),
        "chat_template": spec.chat_template.document(),
        "eos": spec.eos.id,
        "pad": spec.pad.id,
        "token_cache": cache.refs(ws),
    }
    ref = publish_index(
        ws,
        partition_key,
        "packed_blocks",
        CODE,
        ws.config.policy_digest("packing"),
        [mixed_ref, canonical_ref, dedup_ref, cache.tokenizer_ref(ws)],
        outputs,
        counts,
        parents=[parent.ref] if parent else None,  # an incremental layout depends on it
    )
    return LayerResult(
        layer="packed_blocks",
        digest=ref["digest"],
        counts=counts,
        preview=spans.preview,
        digests={"shard_index": index_ref["digest"], "spans": spans_ref["digest"]},
        run_stats={
            **cache.run_stats(),
            "shards_reused": built["reused"],
            "shard_blocks_copied": built["blocks_copied"],
        },
        details={"packing": decision.document()},
    )


def layout_document(policy: PackingPolicy, fields: dict[str, str], spec: TokenizerSpec) -> dict:
    """What a reader must know to use the blocks, declared once (the fields' meaning)."""
    return {
        "schema": "corpus.packed-layout.v1",
        "mode": policy.mode,
        "overlong": policy.overlong,
        "tail": policy.tail if policy.mode == "continuous" else None,
        "positions": policy.positions,
        "block_order": f"sha256 keyed by packed_blocks/{policy.seed}",
        "block_tokens": policy.block_tokens,
        "fields": fields,
        "segment_ids": "0 = pad; 1, 2, ... per piece in its block",
        "label_mask": "1 at t when token t+1 is a target in the same segment",
        "pad": spec.pad.id,
        "eos": spec.eos.id,
        "bos": spec.bos.id if spec.bos is not None else None,
    }
