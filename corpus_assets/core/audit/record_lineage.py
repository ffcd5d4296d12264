"""Record-level lineage, both directions: one record of a snapshot through every layer.

For a record id: its origin (source, pinned object and where it was listed, line, byte offset,
the raw line's size and digest read back at that offset, record digest); its canonical row (kind,
adapter, the row stages it passed, PII counts, contamination checked, and - replayed from the raw
line when a config is at hand - its normalisation repairs); the dedup verdict with its evidence
(``dedup.explain``, the same answer as ``corpus-assets dedup``); its split and leakage group;
every mixed sample of it with its repeat; every packed span (shard by CAS digest and position,
block, [start, end) and record offset); and the training runs whose permits name the snapshot.
A record that is not a member says why: removed by dedup (then its representative's samples and
spans, which carried its content), excluded by a tombstone or a duplicate id, or excluded while
canonicalising (quarantined or rejected, with the reason ``corpus-assets excluded`` lists).

The reverse, shard/block/token range -> records, is :mod:`corpus_assets.core.audit.span_records`.
"""

import json
from typing import Any

from corpus_assets.core.audit.record_origin import (
    find_excluded,
    frozen_source,
    line_facts,
    pinned_object,
    quarantined,
    read_line,
    replay,
)
from corpus_assets.core.audit.snapshot_tables import SnapshotTables
from corpus_assets.core.dedup.explain import explain
from corpus_assets.core.governance import states
from corpus_assets.core.runtime.config import CorpusConfig
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog

# The row stages in the order ``records.canonicalize`` runs them, and the stage each reason
# prefix comes from (``parse.*`` is raised by the parser and by the normaliser).
STAGES = ("parse", "adapter", "normalise", "governance", "pii", "quality", "contamination")
STAGE_OF = {"parse": "parse", "schema": "adapter", "governance": "governance"}
STAGE_OF |= {"quality": "quality", "contamination": "contamination"}
REMOVED = ("exact_duplicate", "near_duplicate")
READS = "every packed block: the mixed samples of the train split"


class RecordNotFound(LookupError):
    """No row of the snapshot, kept or excluded, carries the record id."""


def record_lineage(
    cas: ContentStore,
    catalog: Catalog,
    snapshot: states.Snapshot,
    record_id: str,
    config: CorpusConfig | None = None,
) -> dict[str, Any]:
    """The record's lineage in ``snapshot`` (see the module docstring); ``config`` enables the
    replay of its raw line. ``RecordNotFound`` names the record and snapshot."""
    tables = SnapshotTables(cas, catalog, snapshot)
    member = tables.member(record_id)
    try:
        dedup: dict[str, Any] | None = explain(cas, tables.manifest, record_id, tables.files)
    except KeyError:
        dedup = None
    head = {**tables.head(), "record_id": record_id}
    if member is None and dedup is None:
        return {**head, **_excluded(tables, record_id, config)}
    where = member or (dedup or {})["record"]
    row = _canonical_row(tables, record_id, where)
    status, why = _status(record_id, member, dedup)
    raw = read_line(tables.files, _pinned(tables, row), row["line"], row["byte_offset"])
    answer = {
        **head,
        "status": status,
        "why": why,
        "origin": _origin(tables, row, raw),
        "canonical": _canonical(tables, row, raw, config),
        "dedup": dedup,
        "split": _split(member, dedup),
        **_consumed(tables, record_id),
    }
    representative = (dedup or {}).get("record", {}).get("representative_id")
    if member is None and representative and representative != record_id:
        answer["carried_by"] = {"record_id": representative, **_consumed(tables, representative)}
    answer["runs"] = _runs(tables, answer)
    return answer


def _canonical_row(tables: SnapshotTables, record_id: str, where: dict[str, Any]) -> dict[str, Any]:
    rows = tables.canonical_rows(where["source_id"], where["object"], [where["line"]], {record_id})
    if not rows:
        raise RecordNotFound(
            f"record {record_id!r} of snapshot {tables.snapshot.snapshot_id}: no canonical row "
            f"at line {where['line']} of object {where['object']}"
        )
    return rows[0]


def _pinned(tables: SnapshotTables, row: dict[str, Any]) -> dict[str, Any]:
    return pinned_object(tables.freeze, row["source_id"], row["object"], row["name"])


def _status(
    record_id: str, member: dict[str, Any] | None, dedup: dict[str, Any] | None
) -> tuple[str, str]:
    """(status, why) of a record with a dedup row."""
    if member is not None:
        return "member", "a member of the snapshot"
    row = (dedup or {})["record"]
    verdict = row.get("verdict")
    if verdict in REMOVED:
        return "removed_by_dedup", (
            f"not a member: dedup removed it as {verdict} of {row['match_id']} "
            f"(Jaccard {row['match_jaccard']}); {row['representative_id']} carries its content"
        )
    if verdict == "excluded":
        return "excluded_by_dedup", f"not a member: dedup excluded it ({row.get('excluded')})"
    return "not_in_a_split", (
        f"not a member: dedup kept {record_id!r} but no split holds it (a split conflict "
        "excluded it; see the splits layer's split_conflicts)"
    )


def _origin(
    tables: SnapshotTables, row: dict[str, Any], raw: bytes | dict[str, Any]
) -> dict[str, Any]:
    return {
        "source_id": row["source_id"],
        "object": {**_pinned(tables, row), "cas_uri": tables.cas.uri(row["object"])},
        "line": row["line"],
        "byte_offset": row["byte_offset"],
        "cdc_lsn": row["cdc_lsn"],
        "record_digest": row["record_digest"],
        "raw_line": line_facts(raw),
    }


def _canonical(
    tables: SnapshotTables,
    row: dict[str, Any],
    raw: bytes | dict[str, Any],
    config: CorpusConfig | None,
) -> dict[str, Any]:
    """The canonical row's envelope facts, the stages it passed and what they recorded."""
    keep = ("kind", "adapter", "lang", "script", "modality", "licence", "group_id")
    contamination = tables.manifest.contamination
    source = frozen_source(tables.freeze, row["source_id"])
    replayed = replay(config, source, tables.manifest.purpose, row["name"], row["line"], raw)
    if replayed.get("record_digest") is not None:
        replayed["reproduced"] = replayed["record_digest"] == row["record_digest"]
        if not replayed["reproduced"]:
            replayed["repairs"] = None  # another record: its account is not this record's
    return {
        **{key: row[key] for key in keep},
        "event_time": row["event_time"],
        "text_digest": row["text_digest"],
        "dedup_key": row["dedup_key"],
        "stages_passed": list(STAGES),
        "reason": None,
        "pii_redacted": json.loads(row["pii"] or "{}"),
        "contamination": {
            "policy": contamination.policy if contamination else None,
            "checked_against": [b.benchmark for b in contamination.benchmarks]
            if contamination
            else [],
            "flagged": False,
        },
        "replay": replayed,
    }


def _split(member: dict[str, Any] | None, dedup: dict[str, Any] | None) -> dict[str, Any]:
    row = (dedup or {}).get("record", {})
    return {
        "split": member["split"] if member else None,
        "group_id": member["group_id"] if member else row.get("group_id"),
        "leakage_id": row.get("leakage_id"),
    }


def _consumed(tables: SnapshotTables, record_id: str) -> dict[str, Any]:
    """Every mixed sample of the record (its repeats) and every packed span of it, each span
    with the repeat of the sample it packs."""
    samples = tables.samples_of([record_id])
    repeat_of = {s["position"]: s["repeat"] for s in samples}
    spans = [
        {**span, "repeat": repeat_of.get(span["sample"])} for span in tables.spans_of([record_id])
    ]
    spans.sort(key=lambda s: (s["block"], s["start"]))
    return {"samples": samples, "packed": spans}


def _runs(tables: SnapshotTables, answer: dict[str, Any]) -> dict[str, Any]:
    """The runs whose permits name the snapshot. A permit restricts nothing within it: a run
    reads every packed block, so it read the record exactly when the record has packed spans
    (a removed duplicate's content reached it through its representative's spans)."""
    blocks = sorted({s["block"] for s in answer.get("packed", [])})
    carried = answer.get("carried_by", {})
    carried_blocks = sorted({s["block"] for s in carried.get("packed", [])})
    runs = []
    for run in tables.runs():
        entry = {**run, "read_record": bool(blocks), "blocks": blocks}
        if carried:
            entry["read_content_via"] = carried["record_id"] if carried_blocks else None
            entry["carried_blocks"] = carried_blocks
        runs.append(entry)
    return {"reads": READS, "split_read": "train", "permits": runs}


def _excluded(
    tables: SnapshotTables, record_id: str, config: CorpusConfig | None
) -> dict[str, Any]:
    """A record no member or dedup row names: the canonical layer's exclusion that carries it,
    else ``RecordNotFound``."""
    found = find_excluded(tables.files, tables.canonical, tables.freeze, record_id)
    if not found:
        raise RecordNotFound(
            f"record {record_id!r} is not in snapshot {tables.snapshot.snapshot_id} "
            f"(partition {tables.snapshot.partition_key}): no member, no dedup row and no "
            "excluded row of its source carries that id (an excluded row can also be named "
            "SOURCE/OBJECT_NAME#L<line>)"
        )
    row = found[0]
    source_id = record_id.split("/", 1)[0]
    obj = pinned_object(tables.freeze, source_id, row["object"], row["name"])
    raw = read_line(tables.files, obj, row["line"], row["byte_offset"])
    kind = "quarantined" if quarantined(row["reason"]) else "rejected"
    stage = STAGE_OF.get(row["reason"].split(".", 1)[0], row["reason"])
    source = frozen_source(tables.freeze, source_id)
    return {
        "status": kind,
        "why": f"not a member: {kind} while canonicalising ({row['reason']}: {row['detail']})",
        "origin": {
            "source_id": source_id,
            "object": {**obj, "cas_uri": tables.cas.uri(row["object"])},
            "line": row["line"],
            "byte_offset": row["byte_offset"],
            "raw_line": line_facts(raw),
        },
        "canonical": {
            "stages_passed": list(STAGES[: STAGES.index(stage)]) if stage in STAGES else [],
            "failed_stage": stage,
            "reason": row["reason"],
            "detail": row["detail"],
            "replay": replay(
                config, source, tables.manifest.purpose, row["name"], row["line"], raw
            ),
        },
        "also": found[1:],  # the same id on other excluded rows (a repeated id)
        "dedup": None,
        "split": None,
        "samples": [],
        "packed": [],
        "runs": _runs(tables, {}),
    }
