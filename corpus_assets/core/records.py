"""canonical_records: typed records (envelope + ``document`` payload) parsed from raw objects.

Each raw object is one chunk task. Lines that cannot be interpreted are quarantined under a reason
code with their object and line, never silently dropped; the per-reason counts sit beside the
record count so every exclusion has a denominator.
"""

import json
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.artifacts import (
    JSON,
    get_json,
    get_table,
    make_ref,
    put_json,
    put_table,
)
from corpus_assets.core.codecs import DecompressionLimits, iter_lines
from corpus_assets.core.config import Source
from corpus_assets.core.digests import json_digest
from corpus_assets.core.layers import LayerResult, publish_index, read_index
from corpus_assets.core.tasks import ChunkTask, preload, run_chunk
from corpus_assets.core.workspace import Workspace

CODE = "canonical_records.v1"
RECORD_SCHEMA = "corpus.record.v1"
CHUNK_SCHEMA = "corpus.chunk.v1"

RECORD_COLUMNS = pa.schema(
    [
        ("record_id", pa.string()),
        ("source_id", pa.string()),
        ("object", pa.string()),
        ("line", pa.int64()),
        ("group_id", pa.string()),
        ("record_digest", pa.string()),
        ("text", pa.string()),
    ]
)
QUARANTINE_COLUMNS = pa.schema(
    [
        ("object", pa.string()),
        ("line", pa.int64()),
        ("reason", pa.string()),
        ("detail", pa.string()),
    ]
)


class Quarantined(ValueError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def record_schema_digest() -> str:
    """Digest of the record contract, so a manifest names the exact schema its members follow."""
    return json_digest(
        {
            "schema": RECORD_SCHEMA,
            "payload": "document",
            "columns": [[f.name, str(f.type)] for f in RECORD_COLUMNS],
        }
    )


def parse_line(raw: bytes) -> dict[str, Any]:
    """One JSONL line to a JSON object, or ``Quarantined`` with the reason."""
    if not raw.strip():
        raise Quarantined("blank_line", "line is empty")
    try:
        text_line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise Quarantined("invalid_utf8", f"byte {error.start}: {error.reason}") from None
    try:
        obj = json.loads(text_line)
    except json.JSONDecodeError as error:
        raise Quarantined("invalid_json", f"column {error.colno}: {error.msg}") from None
    if not isinstance(obj, dict):
        raise Quarantined("not_an_object", f"top level is {type(obj).__name__}")
    return obj


def parse_document(source: Source, object_name: str, line_no: int, raw: bytes) -> dict[str, Any]:
    """One JSONL line to an envelope + ``document`` payload, or ``Quarantined`` with the reason."""
    return document_from_row(source, object_name, line_no, parse_line(raw))


def document_from_row(
    source: Source, object_name: str, row_no: int, obj: dict[str, Any]
) -> dict[str, Any]:
    """One source row (a JSON object or a Parquet row) to envelope + ``document`` payload."""
    if source.text_field not in obj:
        raise Quarantined("missing_text", f"no {source.text_field!r} field")
    text = obj[source.text_field]
    if not isinstance(text, str):
        raise Quarantined("text_not_string", f"{source.text_field!r} is {type(text).__name__}")
    text = unicodedata.normalize("NFC", text)
    if not text.strip():
        raise Quarantined("empty_text", f"{source.text_field!r} is blank")
    local_id = obj.get(source.id_field)
    if local_id is None:
        local_id = f"{object_name}#L{row_no}"
    elif isinstance(local_id, bool) or not isinstance(local_id, str | int):
        raise Quarantined("bad_id", f"{source.id_field!r} is {type(local_id).__name__}")
    record_id = f"{source.id}/{local_id}"
    group = obj.get(source.group_field) if source.group_field else None
    group_id = f"{source.id}/{group}" if isinstance(group, str | int) and group != "" else record_id
    for field_name, value in (("text", text), ("id", record_id), ("group", group_id)):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise Quarantined(
                "invalid_unicode", f"{field_name} has a lone surrogate at {error.start}"
            ) from None
    payload = {
        "schema": RECORD_SCHEMA,
        "record_id": record_id,
        "source_id": source.id,
        "group_id": group_id,
        "type": "document",
        "document": {"text": text},
    }
    return {
        "record_id": record_id,
        "group_id": group_id,
        "record_digest": json_digest(payload),
        "text": text,
    }


def _source_rows(
    ws: Workspace, item: dict[str, Any], what: str
) -> Iterator[tuple[int, dict[str, Any] | Quarantined]]:
    """(1-based line or row number, object or the reason it was quarantined) of a raw object."""
    digest = item["object"]["digest"]
    if item["format"] == "parquet":
        ws.cas.verify(digest, what)
        number = 0
        for batch in pq.ParquetFile(ws.cas.path(digest)).iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                number += 1
                yield number, row
        return
    bounds = ws.config.limits
    limits = DecompressionLimits(
        max_output_bytes=bounds.max_output_bytes, max_ratio=bounds.max_ratio
    )
    with ws.cas.open(digest, what) as stream:
        for line_no, raw in iter_lines(stream, what, limits):
            try:
                yield line_no, parse_line(raw)
            except Quarantined as q:
                yield line_no, q


def _parse_object(ws: Workspace, source: Source, item: dict[str, Any]) -> str:
    digest = item["object"]["digest"]
    rows: dict[str, list[Any]] = {f.name: [] for f in RECORD_COLUMNS}
    quarantine: dict[str, list[Any]] = {f.name: [] for f in QUARANTINE_COLUMNS}
    reasons: Counter[str] = Counter()
    what = f"raw object {source.id}/{item['name']} ({digest})"
    for number, obj in _source_rows(ws, item, what):
        try:
            if isinstance(obj, Quarantined):
                raise obj
            parsed = document_from_row(source, item["name"], number, obj)
        except Quarantined as q:
            reasons[q.reason] += 1
            for key, value in (
                ("object", digest),
                ("line", number),
                ("reason", q.reason),
                ("detail", q.detail),
            ):
                quarantine[key].append(value)
            continue
        parsed.update(source_id=source.id, object=digest, line=number)
        for key, column in rows.items():
            column.append(parsed[key])
    records = pa.Table.from_pydict(rows, schema=RECORD_COLUMNS)
    descriptor = {
        "schema": CHUNK_SCHEMA,
        "layer": "canonical_records",
        "records": put_table(ws.cas, records),
        "count": records.num_rows,
        "quarantine": put_table(
            ws.cas, pa.Table.from_pydict(quarantine, schema=QUARANTINE_COLUMNS)
        ),
        "reasons": dict(sorted(reasons.items())),
    }
    return put_json(ws.cas, descriptor)["digest"]


def build_canonical_records(ws: Workspace, partition_key: str) -> LayerResult:
    raw_ref, raw_index = read_index(ws, partition_key, "raw_snapshot")
    sources = {s.id: s for s in ws.config.sources}
    chunks, dead, skipped = [], [], 0
    done = preload(ws.catalog, "canonical_records", CODE)
    reasons: Counter[str] = Counter()
    records = 0
    for item in raw_index["outputs"]["objects"]:
        source = sources[item["source"]]
        task = ChunkTask(
            layer="canonical_records",
            chunk_key=f"{source.id}/{item['name']}",
            input_digest=json_digest(
                {
                    "object": item["object"]["digest"],
                    "format": item["format"],
                    "source": source.model_dump(mode="json"),
                }
            ),
            code_version=CODE,
        )
        outcome = run_chunk(
            ws.catalog,
            ws.cas,
            task,
            lambda s=source, i=item: _parse_object(ws, s, i),
            done=done,
        )
        if outcome.output_digest is None:
            dead.append(
                {
                    "chunk": task.chunk_key,
                    "input": task.input_digest,
                    "error": (outcome.error or "").splitlines()[0],
                }
            )
            continue
        skipped += outcome.skipped
        descriptor = get_json(ws.cas, outcome.output_digest, f"chunk {task.chunk_key}")
        records += descriptor["count"]
        reasons.update(descriptor["reasons"])
        chunks.append(
            {
                "chunk": task.chunk_key,
                "input": task.input_digest,
                "output": make_ref(outcome.output_digest, JSON, ws.cas.size(outcome.output_digest)),
            }
        )
    counts = {
        "records": records,
        "quarantined": sum(reasons.values()),
        "chunks": len(chunks),
        "dead_letters": len(dead),
    }
    counts.update({f"quarantined.{k}": v for k, v in sorted(reasons.items())})
    ref = publish_index(
        ws,
        partition_key,
        "canonical_records",
        CODE,
        json_digest(
            {
                "recordSchema": record_schema_digest(),
                "sources": [s.model_dump(mode="json") for s in ws.config.sources],
            }
        ),
        [raw_ref],
        {"chunks": chunks, "dead_letters": dead},
        counts,
    )
    preview = load_records(ws, {"outputs": {"chunks": chunks[:1]}}).slice(0, 5).to_pylist()
    return LayerResult(
        layer="canonical_records",
        digest=ref["digest"],
        counts=counts,
        preview=[{k: (v[:80] if isinstance(v, str) else v) for k, v in r.items()} for r in preview],
        run_stats={"chunks_reused": skipped, "chunks_built": len(chunks) - skipped},
    )


def load_records(ws: Workspace, index: dict[str, Any]) -> pa.Table:
    """All canonical records of a layer index, in index (source, object, line) order."""
    tables = [
        get_table(
            ws.cas,
            get_json(ws.cas, c["output"], f"chunk {c['chunk']}")["records"],
            f"records of {c['chunk']}",
        )
        for c in index["outputs"]["chunks"]
    ]
    return pa.concat_tables(tables) if tables else RECORD_COLUMNS.empty_table()


def canary_replay(ws: Workspace) -> Callable[[dict[str, Any], list[str]], dict[str, str]]:
    """Re-parse chosen chunks from their pinned objects with this code, bypassing the task table
    (a replay must recompute, not reuse); returns chunk key -> chunk output digest."""

    def replay(canonical: dict[str, Any], chunk_keys: list[str]) -> dict[str, str]:
        raw = get_json(ws.cas, canonical["inputs"][0], "raw_snapshot index")
        items = {f"{o['source']}/{o['name']}": o for o in raw["outputs"]["objects"]}
        sources = {s.id: s for s in ws.config.sources}
        return {
            key: _parse_object(ws, sources[items[key]["source"]], items[key])
            for key in chunk_keys
            if key in items and items[key]["source"] in sources
        }

    return replay
