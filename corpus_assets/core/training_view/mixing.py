"""mixed_samples: the training stream drawn from the train split under ``policies.mixing``.

The plan (``mixing_plan``) says how many documents or tokens each source contributes; the
selection (``mixing_select``) picks them by a content-keyed 64-bit key per source and pass
(vectorised numpy) and orders the stream by the same key. Token counts are the packing
tokenizer's (``policies.tokenizer``, specials included), read from the per-chunk token cache
(``tokens.cache``), whose refs and the tokenizer spec the index lists. The layer outputs the
samples table and a per-source report (also in ``counts`` and the run's details; it names
sources whose importance weight exceeds ``max_weight``, which is also logged as a warning).
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layers import (
    LayerIndex,
    LayerResult,
    publish_index,
    read_layer_index,
)
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import Ref, get_table, put_table
from corpus_assets.core.tokens.cache import TokenCache, open_tokens, token_cache
from corpus_assets.core.tokens.spec import resolve_tokenizer
from corpus_assets.core.training_view.mixing_plan import Population, plan_mixture
from corpus_assets.core.training_view.mixing_select import Members, mix, report
from corpus_assets.core.training_view.splits import TRAIN

CODE = stage_code("mixed_samples.planned.v4", __name__)  # its closure, hashed at import
MEMBER_COLUMNS = ["record_id", "source_id", "record_digest"]


def train_members(
    ws: Workspace, train: pa.Table, canonical: CanonicalIndex, tokens: TokenCache
) -> pa.Table:
    """record_id, source_id, record_digest and tokens of the train records, by record_id.

    ``train`` names each member's row (record_id, object, line: the row dedup kept), so a
    record id repeated in another row is one candidate. A record's tokens are its count in the
    token cache (only the offsets are read)."""
    parts = []
    for chunk, cached in zip(canonical.chunks(), tokens.chunks, strict=True):
        table = chunk.table(ws.cas, [*MEMBER_COLUMNS, "object", "line"])
        counts = open_tokens(ws, cached, tokens.spec, ids=False).counts()
        table = table.append_column("tokens", pa.array(counts, pa.int64()))
        kept = table.join(train, ["record_id", "object", "line"], join_type="inner")
        parts.append(kept.select([*MEMBER_COLUMNS, "tokens"]))
    schema = pa.schema([(c, pa.string()) for c in MEMBER_COLUMNS] + [("tokens", pa.int64())])
    merged = pa.concat_tables(parts) if parts else schema.empty_table()
    return merged.sort_by("record_id")


def train_rows(ws: Workspace, partition_key: str, splits: LayerIndex) -> tuple[Ref, pa.Table]:
    """The dedup index (an input) and the kept row (record_id, object, line) of each train
    member."""
    table = get_table(ws.cas, splits.output("splits"), "splits table")
    train = table.filter(pc.equal(table.column("split"), TRAIN)).select(["record_id"])
    dedup_ref, dedup = read_layer_index(ws, partition_key, "dedup_clusters")
    columns = ["record_id", "object", "line", "is_representative"]
    clusters = get_table(ws.cas, dedup.output("clusters"), "dedup clusters", columns)
    kept = clusters.filter(clusters.column("is_representative")).select(columns[:3])
    return dedup_ref, kept.join(train, "record_id", join_type="inner")


def source_members(table: pa.Table, source: str) -> Members:
    own = table.filter(pc.equal(table.column("source_id"), source))
    return Members(
        own.column("record_id").combine_chunks(),
        own.column("record_digest").combine_chunks(),
        own.column("tokens").to_numpy().astype(np.int64),
    )


def build_mixed_samples(ws: Workspace, partition_key: str) -> LayerResult:
    splits_ref, splits = read_layer_index(ws, partition_key, "splits")
    canonical_ref, canonical = CanonicalIndex.read(ws, partition_key)
    dedup_ref, train = train_rows(ws, partition_key, splits)
    tokens = token_cache(ws, canonical.chunks(), resolve_tokenizer(ws))
    members_table = train_members(ws, train, canonical, tokens)
    policy = ws.config.policies.mixing
    sources = [s.id for s in ws.config.sources]
    members = {s: source_members(members_table, s) for s in sources}
    del members_table  # each source holds its own copy; keep one set of plan arrays
    populations = [
        Population(s, len(members[s].record_id), int(np.sum(members[s].tokens))) for s in sources
    ]
    plans = plan_mixture(policy, populations)
    weighted = any(p.target != p.natural for p in plans if p.amount)
    mixed, picks = mix(policy.seed, policy.unit, plans, members, weighted)
    rows = report(plans, members, picks, policy.max_weight)
    counts = {"samples": mixed.num_rows, "tokens": sum(r["selected_tokens"] for r in rows)}
    for row in rows:
        counts[f"source.{row['source']}"] = row["selected_docs"]
        counts[f"tokens.{row['source']}"] = row["selected_tokens"]
    out = put_table(ws.cas, mixed)
    outputs = {"samples": out, "unit": policy.unit, "policy": policy.policy, "report": rows}
    outputs.update(tokenizer=tokens.spec.document(), token_cache=tokens.refs(ws))
    inputs = [splits_ref, dedup_ref, canonical_ref, tokens.tokenizer_ref(ws)]
    ref = publish_index(
        ws,
        partition_key,
        "mixed_samples",
        CODE,
        ws.config.policy_digest("mixing"),
        inputs,
        outputs,
        counts,
    )
    return LayerResult(
        layer="mixed_samples",
        digest=ref["digest"],
        counts=counts,
        preview=mixed.slice(0, 10).to_pylist(),
        digests={"samples": out["digest"]},
        details={"mixing_report": rows},
        run_stats=tokens.run_stats(),
    )
