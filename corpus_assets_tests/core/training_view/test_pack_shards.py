"""Shards built a shard per job on the task runner are the bytes one writer makes."""

import resource
from pathlib import Path

import pyarrow as pa

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import read_layer_index
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.storage.shards import ShardWriter
from corpus_assets.core.tokens.cache import token_cache
from corpus_assets.core.tokens.spec import resolve_tokenizer
from corpus_assets.core.training_view.packing.blocks import iter_block_batches
from corpus_assets.core.training_view.packing.build import plan_for, shard_fields
from corpus_assets.core.training_view.packing.samples import SampleTokens, locate_samples
from corpus_assets.core.training_view.packing.shards import build_shards

SMALL = 40 * 64 * 9  # 40 blocks of 64 tokens of input_ids, segment_ids, positions, labels


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def test_shards_from_a_worker_pool_equal_one_writers(demo_home: Path) -> None:
    config = demo_home / "corpus.yaml"
    text = config.read_text().replace("block_tokens: 256", "block_tokens: 64")
    config.write_text(text + "execution: {in_process_bytes: 0}\n")  # workers=2: the pool, always
    with open_workspace() as ws:
        build_all(ws, "p1")
        canonical = CanonicalIndex.read(ws, "p1")[1]
        _ref, dedup = read_layer_index(ws, "p1", "dedup_clusters")
        _ref, mixed = read_layer_index(ws, "p1", "mixed_samples")
        order = get_table(ws.cas, mixed.output("samples"), "samples", ["record_id"])
        cache = token_cache(ws, canonical.chunks(), resolve_tokenizer(ws))
        rows = locate_samples(ws, canonical, cache, order.column("record_id"), dedup)
        plan = plan_for(rows, ws.config.policies.packing)
        fields = shard_fields(cache.spec, plan.block_tokens)
        with (
            SampleTokens(ws, cache, rows.chunk, rows.row) as fetch,
            ShardWriter(ws.cas, plan.block_tokens, fields, SMALL) as one,
        ):
            batches = iter_block_batches(
                plan, fetch, batch_blocks=7, pad_id=cache.spec.pad.id, targets=fetch.targets_fetch
            )
            for batch in batches:
                one.write({name: getattr(batch, name) for name in fields})
        assert one.index is not None and len(one.index.shards) > 3
        here = build_shards(ws, plan, rows, cache, fields, SMALL, workers=1)
        before = _children_cpu()
        pooled = build_shards(ws, plan, rows, cache, fields, SMALL, workers=2)
        assert _children_cpu() - before > 0.1  # the spawn pool built them
    assert here[0] == pooled[0] == one.index
    assert here[1] == pooled[1] == one.ref
    assert here[2] == pooled[2] and here[2]["label_tokens"] > 0
    assert isinstance(order, pa.Table)
