"""mixed_samples: the training stream drawn from the train split under ``policies.mixing``.

The plan (:mod:`.plan`) says how many documents or tokens each source contributes; the
selection (:mod:`.select`) picks them by a content-keyed 64-bit key per source and pass
(vectorised numpy) and orders the stream by the same key. Token counts are the packing
tokenizer's (``policies.tokenizer``, specials included), read from the per-chunk token cache
(``tokens.cache``), whose refs and the tokenizer spec the index lists. The layer outputs the
samples table and a per-source report (also in ``counts`` and the run's details; it names
sources whose importance weight exceeds ``max_weight``, which is also logged as a warning).
"""

import duckdb
import numpy as np
import pyarrow as pa

from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layer_index import (
    LayerIndex,
    LayerResult,
    publish_index,
    read_layer_index,
)
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.cas_queries import batches, cas_parquet
from corpus_assets.core.storage.parquet_sink import put_tables
from corpus_assets.core.tokens.cache import TokenCache, token_cache
from corpus_assets.core.tokens.spec import resolve_tokenizer
from corpus_assets.core.training_view import view_queries
from corpus_assets.core.training_view.mixing.plan import Population, plan_mixture
from corpus_assets.core.training_view.mixing.select import (
    MIX_COLUMNS,
    Members,
    digest_bits,
    mix_groups,
    report,
)
from corpus_assets.core.training_view.row_tokens import load_row_tokens
from corpus_assets.core.training_view.splits import TRAIN

CODE = stage_code("mixed_samples.planned.v4", __name__)  # its closure, hashed at import
MEMBER_COLUMNS = ("record_id", "source_id", "record_digest")
_BATCH = 1 << 16


def train_members(
    ws: Workspace,
    con: duckdb.DuckDBPyConnection,
    splits: LayerIndex,
    dedup: LayerIndex,
    canonical: CanonicalIndex,
    tokens: TokenCache,
) -> None:
    """Table ``train_members``: record_id, source_id, record_digest and tokens of the train
    records.

    The splits table names the train members, the dedup table each member's row (record_id,
    object, line: the row dedup kept), so a record id repeated in another row is one candidate.
    A record's tokens are its count in the token cache (only the offsets are read)."""
    load_row_tokens(ws, con, canonical, tokens, (*MEMBER_COLUMNS, "object", "line"))
    table = cas_parquet(ws.cas, splits.output("splits"), "splits table")
    clusters = cas_parquet(ws.cas, dedup.output("clusters"), "dedup clusters")
    con.execute(
        "CREATE TABLE train_members AS SELECT r.record_id, r.source_id, r.record_digest, "
        f"r.tokens FROM row_tokens r JOIN (SELECT c.record_id, c.object, c.line FROM {clusters} c "
        f"JOIN (SELECT record_id FROM {table} WHERE split = '{TRAIN}') t "
        "ON c.record_id = t.record_id WHERE c.is_representative) k "
        "ON r.record_id = k.record_id AND r.object = k.object AND r.line = k.line"
    )
    con.execute("DROP TABLE row_tokens")


def source_members(con: duckdb.DuckDBPyConnection, source: str) -> Members:
    """One source's train members by record_id; digests are parsed a batch at a time."""
    literal = "'" + source.replace("'", "''") + "'"
    reader = batches(
        con,
        "SELECT record_id, record_digest, tokens FROM train_members "
        f"WHERE source_id = {literal} ORDER BY record_id",
        _BATCH,
    )
    ids, bits, tokens = [], [np.empty(0, np.uint64)], [np.empty(0, np.int64)]
    for batch in reader:
        ids.append(batch.column("record_id").cast(pa.string()))
        bits.append(digest_bits(batch.column("record_digest")))
        tokens.append(batch.column("tokens").to_numpy().astype(np.int64))
    record_id = pa.concat_arrays(ids) if ids else pa.array([], pa.string())
    return Members(record_id, None, np.concatenate(tokens), np.concatenate(bits))


def build_mixed_samples(ws: Workspace, partition_key: str) -> LayerResult:
    splits_ref, splits = read_layer_index(ws, partition_key, "splits")
    canonical_ref, canonical = CanonicalIndex.read(ws, partition_key)
    dedup_ref, dedup = read_layer_index(ws, partition_key, "dedup_clusters")
    tokens = token_cache(ws, canonical.chunks(), resolve_tokenizer(ws))
    policy = ws.config.policies.mixing
    sources = [s.id for s in ws.config.sources]
    with view_queries.spilling(ws.home, ws.config.execution.workers) as con:
        train_members(ws, con, splits, dedup, canonical, tokens)
        members = {s: source_members(con, s) for s in sources}
    populations = [
        Population(s, len(members[s].record_id), int(np.sum(members[s].tokens))) for s in sources
    ]
    plans = plan_mixture(policy, populations)
    weighted = any(p.target != p.natural for p in plans if p.amount)
    groups, picks = mix_groups(policy.seed, policy.unit, plans, members, weighted)
    out, head = put_tables(ws.cas, groups, MIX_COLUMNS)
    rows = report(plans, members, picks, policy.max_weight)
    counts = {
        "samples": sum(pick.docs for pick in picks.values()),
        "tokens": sum(r["selected_tokens"] for r in rows),
    }
    for row in rows:
        counts[f"source.{row['source']}"] = row["selected_docs"]
        counts[f"tokens.{row['source']}"] = row["selected_tokens"]
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
        preview=head.to_pylist(),
        digests={"samples": out["digest"]},
        details={"mixing_report": rows, "mixing_unit": policy.unit},
        run_stats=tokens.run_stats(),
    )
