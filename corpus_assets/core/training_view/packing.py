"""packed_blocks: UTF-8 byte tokens + EOS packed into fixed-length blocks (algorithm 18.2).

Tokenizer ``utf8-bytes-v1``: token = byte value (0-255), EOS = 256, PAD = 257. Each sample is
atomic; one longer than the block is split into block-sized pieces first (policy ``split``). A
sample that does not fit in the current block seals it with PAD. Tokens are stored as
little-endian uint16, ``blocks * block_tokens`` of them; the spans table maps every half-open
[start, end) range of a block to its record and the offset in that record's token stream.
"""

import sys
from array import array
from dataclasses import dataclass, field

import pyarrow as pa

from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layers import LayerResult, publish_index, read_layer_index
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import BINARY, get_table, put_bytes, put_table

CODE = stage_code("packed_blocks.atomic-split.v1", __name__)  # its closure, hashed at import
EOS, PAD = 256, 257
SPAN_COLUMNS = pa.schema(
    [
        ("block", pa.int64()),
        ("start", pa.int32()),
        ("end", pa.int32()),
        ("record_id", pa.string()),
        ("record_offset", pa.int64()),
    ]
)


def tokenize(text: str) -> list[int]:
    return [*text.encode("utf-8"), EOS]


@dataclass
class Packed:
    tokens: array
    spans: dict[str, list] = field(default_factory=lambda: {f.name: [] for f in SPAN_COLUMNS})
    blocks: int = 0
    pad: int = 0


def pack(samples: list[tuple[str, list[int]]], block_tokens: int) -> Packed:
    """Greedy first-fit in stream order; every block is exactly ``block_tokens`` long."""
    packed = Packed(tokens=array("H"))
    used = 0

    def seal() -> None:
        nonlocal used
        packed.tokens.extend([PAD] * (block_tokens - used))
        packed.pad += block_tokens - used
        packed.blocks += 1
        used = 0

    for record_id, tokens in samples:
        for offset in range(0, len(tokens), block_tokens):
            piece = tokens[offset : offset + block_tokens]
            if used + len(piece) > block_tokens:
                seal()
            for key, value in (
                ("block", packed.blocks),
                ("start", used),
                ("end", used + len(piece)),
                ("record_id", record_id),
                ("record_offset", offset),
            ):
                packed.spans[key].append(value)
            packed.tokens.extend(piece)
            used += len(piece)
    if used:
        seal()
    return packed


def token_bytes(tokens: array) -> bytes:
    if sys.byteorder == "big":
        tokens = array("H", tokens)
        tokens.byteswap()
    return tokens.tobytes()


def build_packed_blocks(ws: Workspace, partition_key: str) -> LayerResult:
    mixed_ref, mixed = read_layer_index(ws, partition_key, "mixed_samples")
    canonical_ref, canonical = CanonicalIndex.read(ws, partition_key)
    order = get_table(ws.cas, mixed.output("samples"), "mixed samples").column("record_id")
    records = canonical.table(["record_id", "text"])
    text_of = dict(
        zip(
            records.column("record_id").to_pylist(), records.column("text").to_pylist(), strict=True
        )
    )
    policy = ws.config.policies.packing
    packed = pack([(rid, tokenize(text_of[rid])) for rid in order.to_pylist()], policy.block_tokens)
    spans = pa.Table.from_pydict(packed.spans, schema=SPAN_COLUMNS)
    tokens_ref = put_bytes(ws.cas, token_bytes(packed.tokens), BINARY)
    spans_ref = put_table(ws.cas, spans)
    total = packed.blocks * policy.block_tokens
    counts = {
        "blocks": packed.blocks,
        "block_tokens": policy.block_tokens,
        "tokens": total,
        "content_tokens": total - packed.pad,
        "pad_tokens": packed.pad,
        "eos_tokens": len(order),
        "samples": len(order),
        "spans": spans.num_rows,
    }
    outputs = {
        "tokens": tokens_ref,
        "spans": spans_ref,
        "dtype": "uint16-le",
        "tokenizer": policy.tokenizer,
        "eos": EOS,
        "pad": PAD,
    }
    ref = publish_index(
        ws,
        partition_key,
        "packed_blocks",
        CODE,
        ws.config.policy_digest("packing"),
        [mixed_ref, canonical_ref],
        outputs,
        counts,
    )
    return LayerResult(
        layer="packed_blocks",
        digest=ref["digest"],
        counts=counts,
        preview=spans.slice(0, 10).to_pylist(),
        digests={"tokens": tokens_ref["digest"], "spans": spans_ref["digest"]},
    )
