"""dedup_clusters: exact dedup, then MinHash/LSH near-dedup, with a stated representative order.

Every canonical record keeps its row, with a verdict:

- ``exact_duplicate``: its dedup key (sha256 of the dedup-normalised text, computed per source
  content kind at canonicalisation: prose folds whitespace and case, code keeps indentation)
  equals that of a record earlier in the total order;
- ``near_duplicate``: among exact representatives of the same class (record kind x content kind)
  it directly reaches the Jaccard threshold with a record that is kept (algorithm 18.1, see
  :mod:`corpus_assets.core.dedup.near_dedup`); ``match_id``/``match_jaccard`` name that evidence;
- ``keep``; or ``excluded`` (revoked by a tombstone at or below the freeze's watermark, or a
  record id already used earlier - ids are unique in a snapshot) with the reason.

The total order (stated, never completion order): source priority (config order - where a user
ranks sources by governance and trust), longer text first (the fuller copy wins), record id,
object, line. ``representative_id`` is the kept record that stands for a removed one, so its
lineage and source aliases stay attached to what training reads; ``leakage_id`` names the
connected component over groups, exact clusters and verified near edges (its smallest group
id), which the splits layer keeps in one split.
"""

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.dedup.fingerprint_store import SpilledFingerprints, TextLookup
from corpus_assets.core.dedup.minhash import jaccard_sorted, spec_payload
from corpus_assets.core.dedup.near_dedup import (
    BAND_KEY,
    LshParams,
    NearResult,
    SignatureBlock,
    UnionFind,
    near_dedup,
    s_curve,
)
from corpus_assets.core.dedup.signature_cache import (
    ensure_signatures,
    load_signatures,
    signature_spec,
)
from corpus_assets.core.governance.lineage import tombstone_matches
from corpus_assets.core.ingest.freeze import freeze
from corpus_assets.core.records.layer import RECORD_COLUMNS
from corpus_assets.core.runtime.config import NearDedupPolicy
from corpus_assets.core.runtime.layers import LayerResult, publish_index, read_index
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import (
    NPY,
    get_json,
    get_table,
    make_ref,
    put_json,
    put_table,
)
from corpus_assets.core.storage.cas import ContentStore

CODE = "dedup_clusters.v2"
KEEP, EXACT, NEAR, EXCLUDED = "keep", "exact_duplicate", "near_duplicate", "excluded"
CLUSTER_COLUMNS = pa.schema(
    [
        ("record_id", pa.string()),
        ("source_id", pa.string()),
        ("object", pa.string()),
        ("line", pa.int64()),
        ("group_id", pa.string()),
        ("dedup_key", pa.string()),
        ("verdict", pa.string()),
        ("representative_id", pa.string()),
        ("is_representative", pa.bool_()),
        ("match_id", pa.string()),
        ("match_jaccard", pa.float64()),
        ("leakage_id", pa.string()),
        ("excluded", pa.string()),
    ]
)
_LOADED = ["record_id", "source_id", "object", "line", "group_id", "kind", "dedup_key", "text"]


def _codes(
    column: pa.ChunkedArray | pa.Array, ordered: bool = False
) -> tuple[np.ndarray, pa.Array]:
    """Integer code per row and the distinct values; with ``ordered`` the codes follow the
    values' string order, so the smallest code is the smallest value."""
    values = pc.unique(column)
    if ordered:
        values = values.take(pc.array_sort_indices(values))
    codes = pc.index_in(column, value_set=values)
    return np.asarray(codes.to_numpy(zero_copy_only=False), dtype=np.int64), values


def total_order(records: pa.Table, source_order: dict[str, int]) -> np.ndarray:
    """Row indices in the stated total order (see module docstring); sorted in Arrow, so memory
    is a few machine words per record."""
    ranked = pa.array(sorted(source_order, key=source_order.__getitem__), pa.string())
    if "length" in records.column_names:
        length = records.column("length")
    else:
        length = pc.utf8_length(records.column("text"))
    keys = pa.table(
        {
            "source": pc.index_in(records.column("source_id"), value_set=ranked),
            "length": pc.negate(pc.cast(length, pa.int64())),
            "record_id": records.column("record_id"),
            "object": records.column("object"),
            "line": records.column("line"),
        }
    )
    order = pc.sort_indices(keys, sort_keys=[(name, "ascending") for name in keys.column_names])
    return order.to_numpy().astype(np.int64)


def _first_in_order(codes_in_order: np.ndarray) -> np.ndarray:
    """Mask of positions holding the first occurrence of their code (sort based, stable)."""
    by_code = np.argsort(codes_in_order, kind="stable")
    sorted_codes = codes_in_order[by_code]
    first = np.zeros(len(codes_in_order), dtype=bool)
    if not len(first):
        return first
    first[by_code[np.r_[True, sorted_codes[1:] != sorted_codes[:-1]]]] = True
    return first


_VERDICTS = pa.array([KEEP, EXACT, NEAR, EXCLUDED], pa.string())
_KEEP, _EXACT, _NEAR, _EXCLUDED = range(4)


def _ids_at(ids: pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """Record ids at ``rows``, "" where the row is -1."""
    taken = ids.take(pa.array(np.where(rows < 0, 0, rows), mask=rows < 0))
    return pc.fill_null(taken, "")


def cluster(
    records: pa.Table,
    source_order: dict[str, int],
    revoked: dict[int, str] | None = None,
    near: "NearStage | None" = None,
) -> tuple[pa.Table, dict[str, Any]]:
    """The dedup table (sorted by record_id, object, line) and its report.

    ``records`` needs record_id, source_id, object, line, group_id, kind, dedup_key and length
    (or text) columns, in the row order the signatures of ``near`` were computed in. Everything
    per record is an Arrow or numpy vector; Python loops run only over duplicates and edges.
    """
    n = records.num_rows
    excluded = dict(revoked or {})
    order = total_order(records, source_order)
    verdict = np.full(n, _KEEP, dtype=np.int8)
    match = np.full(n, -1, dtype=np.int64)
    match_j = np.full(n, np.nan, dtype=np.float64)

    id_codes, _ = _codes(records.column("record_id"))
    first = _first_in_order(id_codes[order])
    first_row_of = np.empty(int(id_codes.max(initial=-1)) + 1, dtype=np.int64)
    first_row_of[id_codes[order[first]]] = order[first]
    objects, lines = records.column("object"), records.column("line")
    for row in order[~first].tolist():
        at = int(first_row_of[id_codes[row]])
        excluded.setdefault(
            row, f"duplicate record_id (first at {objects[at].as_py()} line {lines[at].as_py()})"
        )
    if excluded:
        verdict[np.fromiter(excluded, dtype=np.int64, count=len(excluded))] = _EXCLUDED

    eligible = order[verdict[order] == _KEEP]
    key_codes, _ = _codes(records.column("dedup_key"))
    first = _first_in_order(key_codes[eligible])
    rep_of = np.empty(int(key_codes.max(initial=-1)) + 1, dtype=np.int64)
    rep_of[key_codes[eligible[first]]] = eligible[first]
    copies = eligible[~first]
    verdict[copies], match[copies], match_j[copies] = _EXACT, rep_of[key_codes[copies]], 1.0

    report: dict[str, Any] = {}
    edges: list[tuple[int, int]] = list(zip(copies.tolist(), match[copies].tolist(), strict=True))
    if near is not None:
        report = near.run(records, eligible[first])
        edges += [(x, y) for x, y, _ in near.edges]
        for x, (y, j) in near.matches.items():
            verdict[x], match[x], match_j[x] = _NEAR, y, j

    final = np.where(verdict == _KEEP, np.arange(n), match)
    exact = np.flatnonzero(verdict == _EXACT)
    rep = match[exact]
    final[exact] = np.where(verdict[rep] == _NEAR, match[rep], rep)  # the chain ends at a keep
    final[verdict == _EXCLUDED] = -1

    group_codes, groups = _codes(records.column("group_id"), ordered=True)
    leakage = UnionFind(len(groups))  # over group codes ordered by group id
    for x, y in edges:
        leakage.union(int(group_codes[x]), int(group_codes[y]))
    leakage_ids = groups.take(pa.array(leakage.roots()[group_codes]))

    reasons = [""] * n
    for row, reason in excluded.items():
        reasons[row] = reason
    table = pa.table(
        {
            **{c: records.column(c) for c in CLUSTER_COLUMNS.names if c in _LOADED},
            "verdict": _VERDICTS.take(pa.array(verdict)),
            "representative_id": _ids_at(records.column("record_id"), final),
            "is_representative": pa.array(verdict == _KEEP),
            "match_id": _ids_at(records.column("record_id"), match),
            "match_jaccard": pa.array(match_j, mask=match < 0),
            "leakage_id": leakage_ids,
            "excluded": pa.array(reasons, pa.string()),
        }
    )
    rows = pc.sort_indices(
        table,
        sort_keys=[("record_id", "ascending"), ("object", "ascending"), ("line", "ascending")],
    )
    return table.take(rows).cast(CLUSTER_COLUMNS).combine_chunks(), report


class NearStage:
    """Near-dedup over exact representatives, one run per class (record kind x content kind)."""

    def __init__(
        self,
        policy: NearDedupPolicy,
        signature_chunks: Sequence[SignatureBlock],
        texts: TextLookup,
        content_of: dict[str, str],
        tmp: Path,
    ) -> None:
        self.policy = policy
        self.spec = signature_spec(policy)
        self.chunks = signature_chunks
        self.texts = texts
        self.content_of = content_of
        self.tmp = tmp
        self.edges: list[tuple[int, int, float]] = []
        self.matches: dict[int, tuple[int, float]] = {}

    def run(self, records: pa.Table, eligible: np.ndarray) -> dict[str, Any]:
        params = LshParams(
            self.policy.bands,
            self.policy.rows,
            float(self.policy.threshold),
            self.policy.bucket_heads,
        )
        kind_codes, kinds = _codes(records.column("kind"))
        source_codes, sources = _codes(records.column("source_id"))
        kind_names, source_names = kinds.to_pylist(), sources.to_pylist()
        pair = kind_codes[eligible] * len(source_names) + source_codes[eligible]
        classes: dict[str, np.ndarray] = {}  # class name -> mask over eligible
        for code in np.unique(pair).tolist():
            kind, source = divmod(code, len(source_names))
            name = f"{kind_names[kind]}/{self.content_of[source_names[source]]}"
            classes[name] = classes.get(name, False) | (pair == code)
        per_class, bucket_stats = {}, []
        for name, mask in sorted(classes.items()):
            order = eligible[mask]  # still in total order
            prints = SpilledFingerprints(self.texts, self.spec, order, self.tmp)
            try:
                result = near_dedup(
                    self.chunks, order, params, prints, jaccard_sorted, prints.prefetch
                )
            finally:
                prints.close()
            per_class[name] = _class_report(result, len(order))
            bucket_stats += [{"class": name, **asdict(band)} for band in result.bands]
            for x, y, j in result.edges:
                self.edges.append((int(order[x]), int(order[y]), j))
            for x in np.flatnonzero(~result.kept).tolist():
                self.matches[int(order[x])] = (
                    int(order[result.match[x]]),
                    float(result.match_jaccard[x]),
                )
        return {
            "signature": spec_payload(self.spec),
            "band_key": BAND_KEY,
            "lsh": {k: v for k, v in asdict(params).items() if k != "threshold"}
            | {"threshold": str(self.policy.threshold)},
            # Decimal strings: a hashed payload holds no floats.
            "s_curve": [
                {"s": f"{p['s']:.2f}", "p": f"{p['p']:.6f}"}
                for p in s_curve(params.bands, params.rows)
            ],
            "classes": per_class,
            "bucket_stats": bucket_stats,  # per class and band
        }


def _class_report(result: NearResult, participants: int) -> dict[str, Any]:
    clusters = Counter(result.match[~result.kept].tolist())
    sizes = Counter(1 + n for n in clusters.values())
    return {
        "participants": participants,
        "near_duplicates": int((~result.kept).sum()),
        "candidate_pairs": result.candidate_pairs,
        "verified_pairs": result.verified_pairs,
        "verified_edges": len(result.edges),
        "skipped_same_group": result.skipped_same_group,
        "fingerprinted": result.fingerprinted,
        "cluster_sizes": _histogram(sizes),
        "bands": {
            "buckets": sum(b.buckets for b in result.bands),
            "largest_bucket": max((b.largest for b in result.bands), default=0),
            "capped_buckets": sum(b.capped_buckets for b in result.bands),
            "pairs": sum(b.pairs for b in result.bands),
            "pairs_skipped_by_cap": sum(b.pairs_skipped_by_cap for b in result.bands),
        },
    }


def _histogram(sizes: Counter[int]) -> dict[str, int]:
    """Cluster-size histogram with power-of-two bins: 2, 3-4, 5-8, ..."""
    bins: Counter[str] = Counter()
    for size, count in sizes.items():
        low = 2
        while low * 2 < size:
            low *= 2
        label = "2" if size == 2 else f"{low + 1}-{low * 2}"
        bins[label] += count
    return dict(sorted(bins.items(), key=lambda kv: int(kv[0].split("-")[0])))


def build_dedup_clusters(ws: Workspace, partition_key: str) -> LayerResult:
    canonical_ref, canonical = read_index(ws, partition_key, "canonical_records")
    records = _records_with_length(ws, canonical)
    order = {s.id: n for n, s in enumerate(ws.config.sources)}
    _, spec = freeze(ws, partition_key)
    revoked = tombstone_matches(ws.catalog, int(spec["tombstoneWatermark"]), records)
    policy = ws.config.policies.dedup.near
    near, run_stats, signature_refs = None, {}, []
    if policy.enabled:
        chunks = canonical["outputs"]["chunks"]
        sig_spec = signature_spec(policy)
        cached = ensure_signatures(ws, chunks, sig_spec, ws.config.execution.workers)
        arrays = [load_signatures(ws, c, sig_spec) for c in cached]
        texts = TextLookup(ws, chunks, [c.records for c in cached])
        content = {s.id: s.content for s in ws.config.sources}
        near = NearStage(policy, arrays, texts, content, ws.home / "tmp")
        # The signatures are inputs of this layer: listed (and so verified) with its outputs.
        signature_refs = [
            {"chunk": c.chunk, "signatures": make_ref(c.digest, NPY, ws.cas.size(c.digest))}
            for c in cached
        ]
        run_stats = {
            "signatures_hashed": sum(c.records for c in cached if c.hashed),
            "signatures_reused": sum(c.records for c in cached if not c.hashed),
        }
    table, report = cluster(records, order, revoked, near)
    by_source = _per_source(table)
    verdicts = Counter[str]()
    for per_verdict in by_source.values():
        verdicts.update(per_verdict)
    representatives = table.column("representative_id")
    kept_ids = pc.filter(representatives, pc.not_equal(representatives, ""))
    counts = {
        "records": table.num_rows,
        "kept": verdicts[KEEP],
        "removed": verdicts[EXACT] + verdicts[NEAR],
        "exact_duplicates": verdicts[EXACT],
        "near_duplicates": verdicts[NEAR],
        "tombstoned": len(revoked),
        "duplicate_ids": verdicts[EXCLUDED] - len(revoked),
        "clusters": pc.count_distinct(kept_ids).as_py(),
        "leakage_groups": pc.count_distinct(table.column("leakage_id")).as_py(),
    }
    report["per_source"] = by_source
    out: dict[str, Any] = {
        "clusters": put_table(ws.cas, table),
        "report": put_json(ws.cas, report),
        "signatures": signature_refs,
    }
    ref = publish_index(
        ws,
        partition_key,
        "dedup_clusters",
        CODE,
        ws.config.policy_digest("dedup"),
        [canonical_ref],
        out,
        counts,
    )
    return LayerResult(
        layer="dedup_clusters",
        digest=ref["digest"],
        counts=counts,
        preview=[{"source": s, **c} for s, c in by_source.items()],
        digests={name: out[name]["digest"] for name in ("clusters", "report")},
        run_stats=run_stats,
        details={k: v for k, v in report.items() if k != "per_source"},
    )


def _records_with_length(ws: Workspace, canonical: dict[str, Any]) -> pa.Table:
    """The columns dedup needs, with text length instead of text. Texts are decoded a batch at
    a time, so the transient memory is one batch, not one chunk (let alone the partition)."""
    columns = [c for c in _LOADED if c != "text"]
    tables = []
    for chunk in canonical["outputs"]["chunks"]:
        descriptor = get_json(ws.cas, chunk["output"], f"chunk {chunk['chunk']}")
        data = ws.cas.get_bytes(descriptor["records"]["digest"], f"records of {chunk['chunk']}")
        parquet = pq.ParquetFile(pa.BufferReader(data))
        table = parquet.read(columns=columns)
        lengths = [
            pc.utf8_length(batch.column(0))
            for batch in parquet.iter_batches(batch_size=4096, columns=["text"])
        ]
        length = pa.chunked_array(lengths, pa.int32())
        tables.append(table.append_column("length", length))
    if not tables:
        empty = RECORD_COLUMNS.empty_table().select(columns)
        return empty.append_column("length", pa.array([], pa.int32()))
    return pa.concat_tables(tables)


def _per_source(table: pa.Table) -> dict[str, dict[str, int]]:
    """Verdict counts per source, every verdict listed (zeros too)."""
    grouped = table.group_by(["source_id", "verdict"]).aggregate([([], "count_all")])
    out: dict[str, dict[str, int]] = {}
    for row in grouped.to_pylist():
        counts = out.setdefault(row["source_id"], dict.fromkeys((KEEP, EXACT, NEAR, EXCLUDED), 0))
        counts[row["verdict"]] = row["count_all"]
    return dict(sorted(out.items()))


def explain(cas: ContentStore, manifest: dict[str, Any], record_id: str) -> dict[str, Any]:
    """Why a record of a snapshot was kept or removed: its row, every record standing behind
    the same representative, and its leakage group with each kept member's split."""
    layers = manifest["layers"]
    dedup = get_json(cas, layers["dedup_clusters"]["digest"], "dedup_clusters index")
    table = get_table(cas, dedup["outputs"]["clusters"], "dedup clusters")
    mine = table.filter(pc.equal(table.column("record_id"), record_id)).to_pylist()
    if not mine:
        raise KeyError(f"record {record_id!r} is not in snapshot {manifest['snapshotId']}")
    row = mine[0]
    splits_index = get_json(cas, layers["splits"]["digest"], "splits index")
    splits = get_table(cas, splits_index["outputs"]["splits"], "splits table")
    split_of = dict(
        zip(splits.column("record_id").to_pylist(), splits.column("split").to_pylist(), strict=True)
    )
    cluster = table.filter(pc.equal(table.column("representative_id"), row["representative_id"]))
    group = table.filter(pc.equal(table.column("leakage_id"), row["leakage_id"]))
    columns = ["record_id", "source_id", "verdict", "match_id", "match_jaccard"]
    return {
        "record": row,
        "cluster": cluster.select(columns).to_pylist() if row["representative_id"] else [],
        "leakage_group": {
            "id": row["leakage_id"],
            "records": [
                {**r, "split": split_of.get(r["record_id"])}
                for r in group.select(["record_id", "verdict"]).to_pylist()
            ],
        },
    }
