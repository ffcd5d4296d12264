"""canonical_records: typed records (envelope + typed payload) canonicalised from raw objects.

Each raw object is one chunk task whose output (records Parquet, an exclusions Parquet with
location and reason only, and an account) is keyed by (object digest, source adapter and fields,
policy digest, benchmark index digest, code identity), so an unchanged object costs nothing in the
next snapshot and a fix to a row stage (``pii``, ``normalize``, ``adapters``, ...) re-runs them.
Every row is accounted for per source and stage: rows in = kept + quarantined + rejected, each
exclusion under its reason code. Chunks may run in several processes (``execution.workers``) or
on Ray (``execution.engine``); the output is assembled in index order, so bytes never depend on it.
"""

import os
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from corpus_assets.core.governance.benchmarks import active_items
from corpus_assets.core.ingest.codecs import (
    DecompressionLimits,
    iter_located_lines,
    iter_parquet_rows,
)
from corpus_assets.core.ingest.freeze import freeze
from corpus_assets.core.ingest.pinning import CDC_LSN_FIELD
from corpus_assets.core.records.canonicalize import (
    QUARANTINE_PREFIXES,
    Excluded,
    Stages,
    canonical_record,
    parse_line,
)
from corpus_assets.core.records.contamination import (
    BenchmarkIndex,
    TokenPolicy,
    contamination_report,
)
from corpus_assets.core.records.index import (
    EXCLUSION_COLUMNS,
    RECORD_COLUMNS,
    CanonicalIndex,
    ChunkAccount,
    ChunkDescriptor,
    ChunkEntry,
    DeadLetter,
    record_schema_digest,
)
from corpus_assets.core.records.kept import ExclusionRows, KeptRecords
from corpus_assets.core.records.pieces import PiecedWriter
from corpus_assets.core.records.quality import policy_payload as quality_payload
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.config import Source
from corpus_assets.core.runtime.layer_index import (
    LayerResult,
    publish_index,
    read_layer_index,
)
from corpus_assets.core.runtime.runners import task_runner
from corpus_assets.core.runtime.workspace import Workspace, open_workspace, worker_setup
from corpus_assets.core.storage.artifacts import (
    JSON,
    make_ref,
    put_json,
)
from corpus_assets.core.storage.digests import json_digest
from corpus_assets.core.storage.parquet_sink import TableWriter
from corpus_assets.core.storage.tasks import ChunkOutcome, ChunkTask, preload, run_chunk

# The chunk tasks' and the index's code: this module's import closure holds every row stage, so a
# fix to one re-runs the chunks it could have changed. Hashed at import, from the source this
# process loaded (a long-running code server must not hash files edited after it started).
CODE = stage_code("canonical_records.v2", __name__)


def _rows(
    ws: Workspace, item: dict[str, Any], what: str
) -> Iterator[tuple[int, int | None, dict[str, Any] | Excluded]]:
    """(1-based line or row number, byte offset of the line in the decompressed object (None for
    Parquet rows), object or why it could not be parsed) of a raw object."""
    digest = item["object"]["digest"]
    if item["format"] == "parquet":
        ws.cas.verify(digest, what)
        for number, row in iter_parquet_rows(ws.cas.path(digest)):
            yield number, None, row
        return
    bounds = ws.config.limits
    limits = DecompressionLimits(
        max_output_bytes=bounds.max_output_bytes, max_ratio=bounds.max_ratio
    )
    with ws.cas.open(digest, what) as stream:
        for line_no, offset, raw in iter_located_lines(stream, what, limits):
            try:
                yield line_no, offset, parse_line(raw)
            except Excluded as excluded:
                yield line_no, offset, excluded


@dataclass
class ObjectTables:
    """What canonicalising a prefix of one raw object gave, held whole (the canary's)."""

    records: pa.Table
    excluded: pa.Table
    kept: KeptRecords
    rows_in: int


def canonical_tables(
    ws: Workspace, source: Source, item: dict[str, Any], stages: Stages, lines: int | None = None
) -> ObjectTables:
    """Canonicalise the object's rows (only the first ``lines`` when given: the canary)."""
    kept = KeptRecords(item["object"]["digest"], stages)
    excluded = ExclusionRows(item["object"]["digest"])
    rows_in = _canonicalize_rows(ws, source, item, kept, excluded, lines)
    records = kept.table()
    excluded.extend(kept.contaminated)  # after every other exclusion
    return ObjectTables(records, excluded.table(), kept, rows_in)


def _canonicalize_rows(
    ws: Workspace,
    source: Source,
    item: dict[str, Any],
    kept: KeptRecords,
    excluded: ExclusionRows,
    lines: int | None,
) -> int:
    """Every row (the first ``lines``) into ``kept`` or ``excluded``; how many were read."""
    digest = item["object"]["digest"]
    rows_in = 0
    what = f"raw object {source.id}/{item['name']} ({digest})"
    with closing(_rows(ws, item, what)) as rows:  # closed at once when the canary stops early
        for number, offset, obj in rows:
            if lines is not None and number > lines:
                break
            rows_in += 1
            try:
                if isinstance(obj, Excluded):
                    raise obj
                record = canonical_record(source, item["name"], number, obj, kept.stages)
            except Excluded as why:
                kept.reasons[why.reason] += 1
                excluded.add(number, why)
                continue
            lsn = obj.get(CDC_LSN_FIELD) if source.kind == "changelog" else None
            record.update(
                source_id=source.id, object=digest, line=number, byte_offset=offset, cdc_lsn=lsn
            )
            kept.add(record)
    return rows_in


def _canonicalize_object(
    ws: Workspace, source: Source, item: dict[str, Any], stages: Stages
) -> str:
    """The object's records (in pieces, :mod:`.pieces`) and exclusions Parquet, each written
    a row group at a time as it fills (never the whole object's rows at once), and its
    account; the descriptor's digest."""
    digest = item["object"]["digest"]
    records = PiecedWriter(ws.cas, RECORD_COLUMNS)  # each group one call: put_table's bytes
    exclusions = TableWriter(ws.cas, EXCLUSION_COLUMNS)
    try:
        kept = KeptRecords(digest, stages, sink=records.write_table)
        excluded = ExclusionRows(digest, sink=exclusions.write_table)
        rows_in = _canonicalize_rows(ws, source, item, kept, excluded, None)
        kept.finish()
        excluded.extend(kept.contaminated)  # after every other exclusion
        excluded.finish()
        pieces, excluded_ref = records.close(), exclusions.close()
    except BaseException:
        records.abort()  # no partial file left under the store's tmp
        exclusions.abort()
        raise
    reasons = kept.reasons
    quarantined = {r: n for r, n in sorted(reasons.items()) if r.startswith(QUARANTINE_PREFIXES)}
    rejected = {r: n for r, n in sorted(reasons.items()) if r not in quarantined}
    descriptor = ChunkDescriptor(
        pieces=pieces,
        count=kept.rows,
        excluded=excluded_ref,
        account=ChunkAccount(
            rows_in=rows_in,
            kept=kept.rows,
            quarantined=quarantined,
            rejected=rejected,
            pii_redacted=dict(sorted(stages.pii.items())),
            normalized=dict(sorted(stages.normalized.items())),
            chars_kept=kept.chars,
            contaminated=dict(sorted(kept.flagged.items())),
        ),
    )
    return put_json(ws.cas, descriptor.document())["digest"]


def benchmark_index(ws: Workspace, fence: int) -> BenchmarkIndex | None:
    """The contamination index of every benchmark item active at the freeze's fence."""
    with ws.catalog.begin() as conn:
        items = active_items(conn, fence)
    if not items:
        return None
    texts = [
        (row.item_id, ws.cas.get_bytes(row.text_digest, f"benchmark item {row.item_id}").decode())
        for row in items
    ]
    names = {row.item_id: row.benchmark for row in items}
    return BenchmarkIndex.build(texts, contamination_policy(ws), names)


def contamination_policy(ws: Workspace) -> TokenPolicy:
    """The configured policy (its payload is hashed into the layer's policy digest)."""
    config = ws.config.policies.contamination
    return TokenPolicy(
        ngram_words=config.ngram_words,
        ngram_chars=config.ngram_chars,
        min_whole_tokens=config.min_whole_tokens,
        min_whole_chars=config.min_whole_chars,
    )


def _policy_digest(ws: Workspace, index: BenchmarkIndex | None) -> str:
    config = ws.config
    return json_digest(
        {
            "recordSchema": record_schema_digest(),
            "quality": quality_payload(Stages.for_config(config, None).quality),
            "contamination": contamination_policy(ws).payload(),
            "benchmarkIndex": index.digest if index is not None else None,
            "pii": config.policies.pii.model_dump(mode="json"),
            "purpose": config.purpose,
        }
    )


def _task(source: Source, item: dict[str, Any], policy: str, code: str) -> ChunkTask:
    return ChunkTask(
        layer="canonical_records",
        chunk_key=f"{source.id}/{item['name']}",
        input_digest=json_digest(
            {
                "object": item["object"]["digest"],
                "format": item["format"],
                "source": source.model_dump(mode="json"),
                "policy": policy,
            }
        ),
        code_version=code,
    )


_WORKER: dict[str, Any] = {}


def _worker_init(config: str, environ: dict[str, str], fence: int, code: str) -> None:
    os.environ.update(environ)
    ws = open_workspace(config)
    _WORKER.update(ws=ws, index=benchmark_index(ws, fence), code=code)


def _worker_run(job: tuple[str, dict[str, Any], str]) -> ChunkOutcome:
    source_id, item, policy = job
    ws, index = _WORKER["ws"], _WORKER["index"]
    source = next(s for s in ws.config.sources if s.id == source_id)
    return _run(ws, source, item, policy, index, done=None, code=_WORKER["code"])


def _run(
    ws: Workspace,
    source: Source,
    item: dict[str, Any],
    policy: str,
    index: BenchmarkIndex | None,
    done: Any,
    code: str,
) -> ChunkOutcome:
    def work() -> str:
        return _canonicalize_object(ws, source, item, Stages.for_config(ws.config, index))

    return run_chunk(ws.catalog, ws.cas, _task(source, item, policy, code), work, done=done)


def build_canonical_records(ws: Workspace, partition_key: str) -> LayerResult:
    raw_ref, raw_index = read_layer_index(ws, partition_key, "raw_snapshot")
    _, spec = freeze(ws, partition_key)
    fence = spec.benchmark_fence
    index = benchmark_index(ws, fence)
    policy = _policy_digest(ws, index)
    items = raw_index.output("objects")
    outcomes = _outcomes(ws, items, policy, index, fence)
    chunks, dead, account = _assemble(ws, items, outcomes)
    skipped = sum(o.skipped for o in outcomes if o.output_digest is not None)
    counts = account.counts()
    counts.update(chunks=len(chunks), dead_letters=len(dead))
    report = contamination_report(contamination_policy(ws).version, index, account.flagged)
    ref = publish_index(
        ws,
        partition_key,
        "canonical_records",
        CODE,
        policy,
        [raw_ref],
        {
            "chunks": [c.document() for c in chunks],
            "dead_letters": [d.document() for d in dead],
            "accounting": account.by_source(),
            "contamination": report,
        },
        counts,
    )
    return LayerResult(
        layer="canonical_records",
        digest=ref["digest"],
        counts=counts,
        preview=account.table(),
        run_stats={"chunks_reused": skipped, "chunks_built": len(chunks) - skipped},
        details=_contamination_details(report),
    )


def _contamination_details(report: dict[str, Any]) -> dict[str, Any]:
    """The report as UI tables (one row per benchmark; per benchmark and source), when any."""
    if not report["benchmarks"]:
        return {}
    return {"contamination": report["benchmarks"], "contamination_by_source": report["flagged"]}


def _outcomes(
    ws: Workspace,
    items: list[dict[str, Any]],
    policy: str,
    index: BenchmarkIndex | None,
    fence: int,
) -> list[ChunkOutcome]:
    """One outcome per raw object, in index order. Finished chunks are skipped here (a dict hit
    and a stat); only the missing ones go to the runner, so an unchanged snapshot starts no
    worker processes at all, and a child's few new objects none either (``Execution``'s
    ``in_process_bytes``)."""
    sources = {s.id: s for s in ws.config.sources}
    done = preload(ws.catalog, "canonical_records", CODE)
    outcomes: list[ChunkOutcome | None] = [None] * len(items)
    missing = []
    for n, item in enumerate(items):
        task = _task(sources[item["source"]], item, policy, CODE)
        if (task.chunk_key, task.input_digest) in done:
            outcomes[n] = _run(ws, sources[item["source"]], item, policy, index, done, CODE)
        else:
            missing.append(n)
    runner = task_runner(ws.config.execution)
    if runner.wants(len(missing), sum(int(items[n]["object"]["size"]) for n in missing)):
        setup = worker_setup(ws, _worker_init, fence, CODE)  # keys = index code
        jobs = [(items[n]["source"], items[n], policy) for n in missing]
        for n, outcome in zip(missing, runner.map(_worker_run, jobs, setup), strict=True):
            outcomes[n] = outcome
    else:
        for n in missing:
            item = items[n]
            outcomes[n] = _run(ws, sources[item["source"]], item, policy, index, done, CODE)
    return [o for o in outcomes if o is not None]


def _assemble(
    ws: Workspace, items: list[dict[str, Any]], outcomes: list[ChunkOutcome]
) -> tuple[list[ChunkEntry], list[DeadLetter], "_Account"]:
    """Index entries, dead letters and the account, in index order whatever finished first."""
    chunks, dead, account = [], [], _Account()
    for item, outcome in zip(items, outcomes, strict=True):
        task, digest = outcome.task, outcome.output_digest
        if digest is None:
            error = (outcome.error or "").splitlines()[0]
            dead.append(DeadLetter(chunk=task.chunk_key, input=task.input_digest, error=error))
            continue
        output = make_ref(digest, JSON, ws.cas.size(digest))
        entry = ChunkEntry(chunk=task.chunk_key, input=task.input_digest, output=output)
        account.add(item["source"], CanonicalIndex.descriptor_at(ws.cas, entry).account)
        chunks.append(entry)
    return chunks, dead, account


class _Account:
    """Per source: rows in = kept + quarantined + rejected, with every reason code."""

    def __init__(self) -> None:
        self.sources: dict[str, Counter[str]] = {}
        self.flagged: dict[str, Counter[str]] = {}  # source -> benchmark item id -> records

    def add(self, source: str, account: ChunkAccount) -> None:
        self.flagged.setdefault(source, Counter()).update(account.contaminated)
        total = self.sources.setdefault(source, Counter())
        total["rows_in"] += account.rows_in
        total["kept"] += account.kept
        total["chars_kept"] += account.chars_kept
        excluded = {"quarantined": account.quarantined, "rejected": account.rejected}
        for group, reasons in excluded.items():
            for reason, n in reasons.items():
                total[f"{group}:{reason}"] += n
                total[group] += n
        for kind, n in account.pii_redacted.items():
            total[f"pii:{kind}"] += n

    def by_source(self) -> dict[str, dict[str, int]]:
        return {s: dict(sorted(c.items())) for s, c in sorted(self.sources.items())}

    def counts(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for counter in self.sources.values():
            total.update(counter)
        counts = {
            "records": total["kept"],
            "rows_in": total["rows_in"],
            "quarantined": total["quarantined"],
            "rejected": total["rejected"],
            "unexplained": total["rows_in"]
            - total["kept"]
            - total["quarantined"]
            - total["rejected"],
        }
        counts.update({k.replace(":", "."): v for k, v in sorted(total.items()) if ":" in k})
        return counts

    def table(self) -> list[dict[str, Any]]:
        return [
            {
                "source": source,
                "denominator": "source rows",
                "rows_in": c["rows_in"],
                "kept": c["kept"],
                "quarantined": c["quarantined"],
                "rejected": c["rejected"],
                "unexplained": c["rows_in"] - c["kept"] - c["quarantined"] - c["rejected"],
                "characters_kept": c["chars_kept"],
                "reasons": ", ".join(
                    f"{k.split(':', 1)[1]}={v}"
                    for k, v in sorted(c.items())
                    if k.startswith(("quarantined:", "rejected:"))
                ),
            }
            for source, c in sorted(self.sources.items())
        ]
