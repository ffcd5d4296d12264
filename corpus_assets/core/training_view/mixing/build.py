"""mixed_samples: the training stream drawn from the train split under ``policies.mixing``.

The plan (:mod:`.plan`) says how many documents or tokens each source contributes; the
selection (:mod:`.select`) picks them by a content-keyed 64-bit key per source and pass
(vectorised numpy) and orders the stream by the same key. Token counts are the packing
tokenizer's (``policies.tokenizer``, specials included), read from the per-chunk token cache
(``tokens.cache``), whose refs and the tokenizer spec the index lists. The layer outputs the
samples table and a per-source report (also in ``counts`` and the run's details; it names
sources whose importance weight exceeds ``max_weight``, which is also logged as a warning).
"""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.records.index import CanonicalIndex, ChunkRecords
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layer_index import (
    LayerIndex,
    LayerResult,
    publish_index,
    read_layer_index,
)
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.cas_queries import (
    VerifiedFiles,
    cas_parquet,
    sorted_file,
    sorted_rows,
    sql_literal,
    streamed,
)
from corpus_assets.core.storage.memory import hand_back_duckdb
from corpus_assets.core.storage.parquet_sink import put_tables
from corpus_assets.core.storage.table_lookup import TrustedFiles
from corpus_assets.core.tokens.cache import TokenCache, open_tokens, token_cache
from corpus_assets.core.tokens.spec import resolve_tokenizer
from corpus_assets.core.training_view import view_queries
from corpus_assets.core.training_view.mixing.plan import MixingError, Population, plan_mixture
from corpus_assets.core.training_view.mixing.select import (
    MIX_COLUMNS,
    Members,
    digest_bits,
    mix_groups,
    report,
)
from corpus_assets.core.training_view.row_tokens import load_row_tokens
from corpus_assets.core.training_view.splits import TRAIN, row_order

CODE = stage_code("mixed_samples.planned.v4", __name__)  # its closure, hashed at import
MEMBER_COLUMNS = ("record_id", "source_id", "record_digest")
_BATCH = 1 << 16


@dataclass(frozen=True)
class RowValues:
    """Every clusters row's selection input (D of its record digest) and token count, by its
    clusters position: the members join names positions only, numpy takes the values."""

    bits: np.ndarray  # uint64
    tokens: np.ndarray  # int64


def train_members(
    ws: Workspace,
    con: duckdb.DuckDBPyConnection,
    splits: LayerIndex,
    dedup: LayerIndex,
    canonical: CanonicalIndex,
    tokens: TokenCache,
) -> RowValues | None:
    """Table ``train_members``: record_id, source_id and the clusters position ``pos`` of the
    train records, whose bits and tokens the returned ``RowValues`` hold - or, matched on
    keys, record_id, source_id, ``record_digest`` and tokens (and None returned).

    The splits table names the train members, the dedup table each member's row (the row dedup
    kept), so a record id repeated in another row is one candidate. A record's tokens are its
    count in the token cache (only the offsets are read). With the dedup layer's decisions
    table the kept rows are matched on their clusters-table position (integers, no canonical
    string read but the digests; a DuckDB join of every row's values on position was ~40 MB
    of the layer's peak at 1.1 GB); without it, on (record_id, object, line)."""
    files = TrustedFiles(ws.cas, ws.catalog)
    chunks = canonical.chunks()
    order = row_order(files, dedup, sum(c.count for c in chunks))
    table = cas_parquet(ws.cas, splits.output("splits"), "splits table")
    train = f"(SELECT record_id FROM {table} WHERE split = '{TRAIN}')"
    if order is None:
        _members_by_keys(ws, con, dedup, canonical, tokens, train)
        return None
    clusters = view_queries.dedup_clusters(VerifiedFiles(ws.cas), dedup, numbered=True)
    positions = pq.read_table(order, columns=["pos"])["pos"].to_numpy()
    values = _row_values(ws, files, chunks, tokens, positions)
    con.execute(
        "CREATE TABLE train_members AS SELECT c.record_id, c.source_id, c.file_row_number AS pos "
        f"FROM {clusters} c JOIN {train} t ON c.record_id = t.record_id WHERE c.is_representative"
    )
    return values


def _row_values(
    ws: Workspace,
    files: TrustedFiles,
    chunks: list[ChunkRecords],
    tokens: TokenCache,
    positions: np.ndarray,
) -> RowValues:
    """Each canonical row's bits and tokens placed at its clusters position (``positions``,
    by global row): each chunk's digest column read and parsed a batch at a time (16 bytes a
    row stay, no strings; a whole column of 71-character digests read and parsed at once
    raised the layer's RSS by ~100 MB at 1.1 GB)."""
    values = RowValues(np.empty(len(positions), np.uint64), np.empty(len(positions), np.int64))
    start = 0
    for chunk, cached in zip(chunks, tokens.chunks, strict=True):
        path = files.path(chunk.records["digest"], chunk.what)
        at = start
        for batch in streamed(path, _BATCH, ["record_digest"]):
            values.bits[positions[at : at + batch.num_rows]] = digest_bits(batch.column(0))
            at += batch.num_rows
        counts = open_tokens(ws, cached, tokens.spec, ids=False).counts()
        if at - start != chunk.count or len(counts) != chunk.count:
            raise MixingError(
                f"{chunk.what}: {at - start} digests and {len(counts)} token counts, "
                f"not its {chunk.count} rows"
            )
        values.tokens[positions[start : start + chunk.count]] = counts
        start += chunk.count
    return values


def _members_by_keys(
    ws: Workspace,
    con: duckdb.DuckDBPyConnection,
    dedup: LayerIndex,
    canonical: CanonicalIndex,
    tokens: TokenCache,
    train: str,
) -> None:
    """``train_members`` joined on (record_id, object, line), with the digests: a dedup
    layer without this code's decisions table."""
    load_row_tokens(ws, con, canonical, tokens, (*MEMBER_COLUMNS, "object", "line"))
    clusters = view_queries.dedup_clusters(VerifiedFiles(ws.cas), dedup)
    con.execute(
        "CREATE TABLE train_members AS SELECT r.record_id, r.source_id, r.record_digest, "
        f"r.tokens FROM row_tokens r JOIN (SELECT c.record_id, c.object, c.line FROM {clusters} c "
        f"JOIN {train} t ON c.record_id = t.record_id WHERE c.is_representative) k "
        "ON r.record_id = k.record_id AND r.object = k.object AND r.line = k.line"
    )
    con.execute("DROP TABLE row_tokens")


def source_members(
    con: duckdb.DuckDBPyConnection,
    sources: list[str],
    folder: Path,
    values: RowValues | None = None,
) -> dict[str, Members]:
    """Each source's train members by record_id: their bits and tokens taken from ``values``
    by position, or (a table matched on keys) their digests parsed a batch at a time. Each
    source's sort goes to a file in ``folder`` (``sorted_file``), then ``train_members`` is
    dropped and DuckDB's pages handed back before any file is read (the layer's peak at 1.1
    GB: streamed from DuckDB 328.7 MB, each read back from its file with the table alive 321,
    the table dropped first 295; medians of three, same bytes)."""
    columns = "pos" if values is not None else "record_digest, tokens"
    files: dict[str, Path] = {}
    for source in sources:
        sql = (
            f"SELECT record_id, {columns} FROM train_members "
            f"WHERE source_id = {sql_literal(source)} ORDER BY record_id"
        )
        files[source] = sorted_file(con, sql, folder)
    con.execute("DROP TABLE train_members")
    hand_back_duckdb(con)
    return {s: _members(sorted_rows(files[s], _BATCH), values) for s in sources}


def _members(batches: Iterator[pa.RecordBatch], values: RowValues | None) -> Members:
    """One source's members from its sorted batches."""
    ids, bits, tokens = [], [np.empty(0, np.uint64)], [np.empty(0, np.int64)]
    for batch in batches:
        ids.append(batch.column("record_id").cast(pa.string()))
        if values is not None:
            at = batch.column("pos").to_numpy()
            bits.append(values.bits[at])
            tokens.append(values.tokens[at])
        else:
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
    # one DuckDB thread, as splits: the members join fills its buffers per thread (two: peak
    # 343 MB against 329 median of three at 1.1 GB, same bytes)
    scratch = view_queries.spilling(ws.home, 1)
    with scratch as con:
        values = train_members(ws, con, splits, dedup, canonical, tokens)
        members = source_members(con, sources, scratch.dir, values)
        del values
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
