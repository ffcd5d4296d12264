"""packed_blocks: each sample's cached tokens packed into fixed-length blocks (algorithm 18.2).

A sample's tokens come from the token cache (``tokens.cache``, the ``policies.tokenizer`` spec:
``[BOS] + content + [EOS]``), memory-mapped per canonical chunk; the index lists the cache refs
and the tokenizer spec. Each sample is atomic; one longer than the block is split into
block-sized pieces first (policy ``split``). A sample that does not fit in the current block
seals it with PAD. Tokens are stored little-endian, uint16 (uint32 when the vocabulary exceeds
65,536 ids), ``blocks * block_tokens`` of them; the spans table maps every half-open [start, end)
range of a block to its record and the offset in that record's token stream.
"""

import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layers import (
    LayerIndex,
    LayerResult,
    publish_index,
    read_layer_index,
)
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import BINARY, get_table, put_bytes, put_table
from corpus_assets.core.tokens.cache import TokenArrays, TokenCache, open_tokens, token_cache
from corpus_assets.core.tokens.spec import UTF8_IDS, resolve_tokenizer

CODE = stage_code("packed_blocks.atomic-split.v2", __name__)  # its closure, hashed at import
EOS, PAD = UTF8_IDS["eos"], UTF8_IDS["pad"]  # utf8-bytes-v1's (the default tokenizer)
SPAN_COLUMNS = pa.schema(
    [
        ("block", pa.int64()),
        ("start", pa.int32()),
        ("end", pa.int32()),
        ("record_id", pa.string()),
        ("record_offset", pa.int64()),
    ]
)


@dataclass
class Packed:
    tokens: array
    spans: dict[str, list] = field(default_factory=lambda: {f.name: [] for f in SPAN_COLUMNS})
    blocks: int = 0
    pad: int = 0


def pack(
    samples: Iterable[tuple[str, Sequence[int]]],
    block_tokens: int,
    pad: int = PAD,
    typecode: str = "H",
) -> Packed:
    """Greedy first-fit in stream order; every block is exactly ``block_tokens`` long.

    ``typecode`` is the ``array`` type of the tokens (``H`` uint16, ``I`` uint32)."""
    packed = Packed(tokens=array(typecode))
    used = 0

    def seal() -> None:
        nonlocal used
        packed.tokens.extend([pad] * (block_tokens - used))
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
            packed.tokens.frombytes(np.asarray(piece, dtype=packed.tokens.typecode).tobytes())
            used += len(piece)
    if used:
        seal()
    return packed


def token_bytes(tokens: array) -> bytes:
    """Little-endian bytes of the packed tokens, whatever the host's byte order."""
    if sys.byteorder == "big":
        tokens = array(tokens.typecode, tokens)
        tokens.byteswap()
    return tokens.tobytes()


def sample_tokens(
    ws: Workspace,
    canonical: CanonicalIndex,
    cache: TokenCache,
    order: list[str],
    dedup: LayerIndex,
) -> Iterator[tuple[str, np.ndarray]]:
    """(record id, its cached tokens) in stream order. A sample is a member, so its row is the
    dedup representative's (object, line): a repeated id elsewhere (excluded) never stands in."""
    columns = ["record_id", "object", "line", "is_representative"]
    clusters = get_table(ws.cas, dedup.output("clusters"), "dedup clusters", columns)
    chosen = clusters.filter(clusters.column("is_representative"))
    rows = zip(*(chosen.column(c).to_pylist() for c in columns[:3]), strict=True)
    member_at = {record_id: (name, line) for record_id, name, line in rows}
    arrays: list[TokenArrays] = []
    where: dict[str, tuple[int, int]] = {}
    for n, (chunk, cached) in enumerate(zip(canonical.chunks(), cache.chunks, strict=True)):
        arrays.append(open_tokens(ws, cached, cache.spec))
        table = chunk.table(ws.cas, columns[:3])
        located = zip(*(table.column(c).to_pylist() for c in columns[:3]), strict=True)
        for row, (record_id, name, line) in enumerate(located):
            if member_at.get(record_id) == (name, line):
                where[record_id] = (n, row)
    for record_id in order:
        chunk_at, row = where[record_id]
        yield record_id, arrays[chunk_at].record(row)


def build_packed_blocks(ws: Workspace, partition_key: str) -> LayerResult:
    mixed_ref, mixed = read_layer_index(ws, partition_key, "mixed_samples")
    canonical_ref, canonical = CanonicalIndex.read(ws, partition_key)
    dedup_ref, dedup = read_layer_index(ws, partition_key, "dedup_clusters")
    order = get_table(ws.cas, mixed.output("samples"), "mixed samples").column("record_id")
    cache = token_cache(ws, canonical.chunks(), resolve_tokenizer(ws))
    spec = cache.spec
    policy = ws.config.policies.packing
    samples = sample_tokens(ws, canonical, cache, order.to_pylist(), dedup)
    typecode = "H" if spec.dtype.itemsize == 2 else "I"
    packed = pack(samples, policy.block_tokens, spec.pad.id, typecode)
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
        "eos_tokens": len(order),  # one per sample (each record's tokens end with EOS)
        "samples": len(order),
        "spans": spans.num_rows,
    }
    outputs = {
        "tokens": tokens_ref,
        "spans": spans_ref,
        "dtype": spec.dtype_name,
        "tokenizer": spec.document(),
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
    )
    return LayerResult(
        layer="packed_blocks",
        digest=ref["digest"],
        counts=counts,
        preview=spans.slice(0, 10).to_pylist(),
        digests={"tokens": tokens_ref["digest"], "spans": spans_ref["digest"]},
        run_stats=cache.run_stats(),
    )
