"""One source row to one canonical record, through separate stages with their own reason codes.

parse (``parse.*``) -> adapter (``schema.*``) -> normalise (``parse.*``) -> governance
(``governance.*``) -> PII redaction (``pii.*`` counts; the record is kept, the values never
leave) -> quality (``quality.*``) -> benchmark contamination (``contamination.benchmark``, run
per chunk in one batch by ``contaminated``).
Parse and schema failures are *quarantined* (the structure could not be interpreted); governance,
quality and contamination are *rejections* (interpretable, but excluded by policy). Both keep
only the location and the reason: the raw text stays behind the raw snapshot's access.
"""

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

from corpus_assets.core.records.adapters import (
    ADAPTERS,
    Adapter,
    SchemaMismatch,
    render,
    replace,
    strings,
)
from corpus_assets.core.records.adapters import field as row_field
from corpus_assets.core.records.contamination import BenchmarkIndex, Match
from corpus_assets.core.records.envelope import CANONICAL, digest_with, record_digest, template_for
from corpus_assets.core.records.normalize import (
    ParseReject,
    dedup_key,
    is_blank,
    normalize_parts,
    normalize_text,
)
from corpus_assets.core.records.pii import redact, redact_parts
from corpus_assets.core.records.quality import QualityPolicy, check_quality
from corpus_assets.core.records.scripts import script_of, scripts_of
from corpus_assets.core.records.text_chunks import utf8
from corpus_assets.core.runtime.config import CorpusConfig, PiiConfig, Source
from corpus_assets.core.storage.digests import sha256_digest

QUARANTINE_PREFIXES = ("parse.", "schema.")


class Excluded(ValueError):
    """The row is not a member; ``reason`` is a stage reason code, ``detail`` never holds text."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    @property
    def quarantined(self) -> bool:
        return self.reason.startswith(QUARANTINE_PREFIXES)


@dataclass
class Stages:
    """Everything a chunk needs to canonicalise rows, and the per-stage account it keeps."""

    purpose: str
    quality: QualityPolicy
    index: BenchmarkIndex | None
    redact_pii: bool = PiiConfig().redact  # the config's default: one source
    pii: Counter[str] = field(default_factory=Counter)
    normalized: Counter[str] = field(default_factory=Counter)

    @classmethod
    def for_config(cls, config: CorpusConfig, index: BenchmarkIndex | None) -> "Stages":
        q = config.policies.quality
        quality = QualityPolicy(**q.model_dump())
        return cls(config.purpose, quality, index, config.policies.pii.redact)


# Bytes -> b"0" for digits, b"." otherwise: a run of 19 digits may be an integer orjson reads as
# a float (it keeps 64-bit integers only); only then is the parsed object searched for one.
_DIGITS_AS_ZERO = bytes(48 if 48 <= b <= 57 else 46 for b in range(256))
_LONG_NUMBER = b"0" * 19
_INT64_LIMIT = 2.0**63


def _may_hold_wide_int(value: Any) -> bool:
    """Whether orjson may have read an integer beyond 64 bits as a float: it gives such a token
    as a float of magnitude >= 2**63, so no smaller float (and no string) is one."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if abs(item) >= _INT64_LIMIT:
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def parse_line(raw: bytes) -> dict[str, Any]:
    """One JSONL line to a JSON object, or ``Excluded`` with a ``parse.*`` reason.

    orjson parses the common line (~3x faster); whatever it refuses (NaN, lone surrogate
    escapes, floats out of range, invalid UTF-8 or JSON, deep nesting) and any line where it
    may have read a wide integer as a float goes to ``json.loads``, whose result and error
    messages are the contract. A digit run inside a string (a number in a long text) keeps
    orjson's object: the standard library would hold the line decoded and parsed at once.
    """
    if not raw.strip():
        raise Excluded("parse.blank_line", "line is empty")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:
        if isinstance(obj, dict) and (
            _LONG_NUMBER not in raw.translate(_DIGITS_AS_ZERO) or not _may_hold_wide_int(obj)
        ):
            return obj
        del obj  # not held while the standard library parses the line again
    return _parse_stdlib(raw)


def _parse_stdlib(raw: bytes) -> dict[str, Any]:
    """``parse_line`` by the standard library: the reference semantics and error details."""
    try:
        text_line = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise Excluded("parse.invalid_utf8", f"byte {error.start}: {error.reason}") from None
    try:
        obj = json.loads(text_line)
    except json.JSONDecodeError as error:
        raise Excluded("parse.invalid_json", f"column {error.colno}: {error.msg}") from None
    except RecursionError:
        raise Excluded("parse.invalid_json", "nested too deeply") from None
    if not isinstance(obj, dict):
        raise Excluded("parse.not_an_object", f"top level is {type(obj).__name__}")
    return obj


def contaminated(
    index: BenchmarkIndex | None, texts: list[str]
) -> dict[int, tuple[Excluded, Match]]:
    """Position -> (exclusion, match) for the texts that contain a registered benchmark item.

    The detail names the item, its benchmark and the evidence (v2: shared n-grams or the whole
    item), never its text."""
    if index is None or not texts:
        return {}
    return {
        n: (Excluded("contamination.benchmark", _evidence(match)), match)
        for n, match in enumerate(index.match_many(texts))
        if match is not None
    }


def _evidence(match: Match) -> str:
    """The item, its containment, the evidence (whole or shared n-grams) and the benchmark."""
    detail = f"item {match.item_id} containment {match.containment_ppm / 10_000:.2f}%"
    detail += " (whole item)" if match.whole else f" ({match.shared} shared n-grams)"
    return detail + (f" of benchmark {match.benchmark}" if match.benchmark else "")


def _local_id(source: Source, obj: dict[str, Any], object_name: str, row_no: int) -> str:
    """The row's own id, or its location when the source declares none (``schema.bad_id``)."""
    value = row_field(obj, source.id_field)
    if value is None:
        return f"{object_name}#L{row_no}"
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise Excluded("schema.bad_id", f"{source.id_field!r} is {type(value).__name__}")
    return str(value)


def canonicalize(
    source: Source, object_name: str, row_no: int, obj: dict[str, Any], stages: Stages
) -> dict[str, Any]:
    """The canonical record columns for one row, or ``Excluded`` naming stage and reason."""
    record = canonical_record(source, object_name, row_no, dict(obj), stages)
    finish_records([record])
    del record["text_utf8"]
    record["payload"] = record["payload"].decode("utf-8")
    return record


def canonical_record(
    source: Source, object_name: str, row_no: int, obj: dict[str, Any], stages: Stages
) -> dict[str, Any]:
    """``canonicalize`` as the layer keeps it: ``payload`` as UTF-8 bytes, plus ``text_utf8``
    (the text's UTF-8), so neither large column is encoded twice, and ``script`` and
    ``record_digest`` possibly left to :func:`finish_records` (call it on every record).
    A document's text is taken out of ``obj`` (see ``_take_text``): the caller owns the row.

    The stages run in the module docstring's order; each helper raises its own reason codes.
    """
    adapter = ADAPTERS[source.adapter]
    if adapter.kind == "document" and isinstance(row_field(obj, source.text_field), str):
        return _document(source, adapter, object_name, row_no, obj, stages)
    payload = _adapt(adapter, source, obj)
    record_id, group_id = _identity(source, obj, object_name, row_no)
    _normalise_strings(source, adapter.kind, payload, stages)
    _check_text(adapter.kind, payload, record_id, group_id)
    _check_governance(source, stages)
    pii = _redact_pii(adapter.kind, payload, stages)
    text = render(adapter.kind, payload)
    _check_quality(source, text, stages)
    return _record(source, obj, adapter, payload, record_id, group_id, pii, text)


def _document(
    source: Source,
    adapter: Adapter,
    object_name: str,
    row_no: int,
    obj: dict[str, Any],
    stages: Stages,
) -> dict[str, Any]:
    """``canonical_record`` of a row whose adapter gave ``{"text": text}``: the same stages
    and reason codes, inlined for the one-string payload (most rows), so a record costs
    fewer calls and no intermediate objects."""
    record_id, group_id = _identity(source, obj, object_name, row_no)
    text = _take_text(source, obj)
    try:
        text, changes = normalize_parts(text, source.content == "code")
    except ParseReject as error:
        raise Excluded(error.reason, error.detail) from None
    if changes:
        stages.normalized.update(changes)
    _check_encodable(record_id, group_id, text)
    _check_governance(source, stages)
    pii: dict[str, int] = {}
    if stages.redact_pii:
        text, pii = redact_parts(text)
        if pii:
            stages.pii.update(pii)
    _check_quality(source, text, stages)
    return _record(source, obj, adapter, {"text": text}, record_id, group_id, pii, text)


def _take_text(source: Source, obj: dict[str, Any]) -> str:
    """The row's text, taken out of the row when it is a top-level field no other declared
    field reads, so the only reference is the stage's: a record at ``max_chars`` is not held
    twice once normalisation or redaction replaces its text."""
    name = source.text_field
    if "." in name or name in (source.lang_field, source.time_field, source.group_field):
        text: str = row_field(obj, name)
        return text
    text = obj.pop(name)
    return text


def _adapt(adapter: Adapter, source: Source, obj: dict[str, Any]) -> dict[str, Any]:
    """Adapter stage: the row as the adapter's typed payload (``schema.*``)."""
    try:
        return adapter.parse(source, obj)
    except SchemaMismatch as error:
        raise Excluded(error.reason, error.detail) from None


def _identity(
    source: Source, obj: dict[str, Any], object_name: str, row_no: int
) -> tuple[str, str]:
    """``(record_id, group_id)``; a row without a group is its own group (``schema.bad_id``)."""
    record_id = f"{source.id}/{_local_id(source, obj, object_name, row_no)}"
    group = row_field(obj, source.group_field) if source.group_field else None
    group_id = f"{source.id}/{group}" if isinstance(group, str | int) and group != "" else record_id
    return record_id, group_id


def _normalise_strings(source: Source, kind: str, payload: dict[str, Any], stages: Stages) -> None:
    """Normalise stage, in place on every payload string (``parse.*`` from the normaliser)."""
    for path, value in strings(kind, payload):
        try:
            normalized = normalize_text(value, kind=source.content)
        except ParseReject as error:
            raise Excluded(error.reason, error.detail) from None
        if normalized.changes:  # a clean string comes back as the same object
            stages.normalized.update(normalized.changes)
            replace(payload, path, normalized.text)


def _check_text(kind: str, payload: dict[str, Any], record_id: str, group_id: str) -> None:
    """End of the normalise stage for a rendered payload (see ``_check_encodable``)."""
    _check_encodable(record_id, group_id, render(kind, payload))


def _check_encodable(record_id: str, group_id: str, text: str) -> None:
    """End of the normalise stage: ids and text must encode, and some text must be left."""
    for label, value in (("id", record_id), ("group", group_id), ("text", text)):
        if not value.isascii():  # O(1); only non-ASCII can hold a lone surrogate
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                raise Excluded(
                    "parse.invalid_unicode", f"{label} has a lone surrogate at {error.start}"
                ) from None
    if is_blank(text):
        raise Excluded("parse.empty_text", "no text after normalisation")


def _check_governance(source: Source, stages: Stages) -> None:
    """Governance stage: the chunk's purpose must be one the source allows."""
    if source.purposes is not None and stages.purpose not in source.purposes:
        raise Excluded("governance.purpose", f"source allows {sorted(source.purposes)}")


def _redact_pii(kind: str, payload: dict[str, Any], stages: Stages) -> Counter[str]:
    """PII stage, in place: placeholders replace the values; only the counts are kept."""
    pii: Counter[str] = Counter()
    if stages.redact_pii:
        for path, value in strings(kind, payload):
            redaction = redact(value)
            if redaction.counts:
                pii.update(redaction.counts)
                replace(payload, path, redaction.text)
        if pii:
            stages.pii.update(pii)
    return pii


def _check_quality(source: Source, text: str, stages: Stages) -> None:
    """Quality stage on the rendered, redacted text (``quality.*``)."""
    rejected = check_quality(text, source.content, stages.quality)
    if rejected:
        raise Excluded(rejected, f"{len(text)} characters")


def _record(
    source: Source,
    obj: dict[str, Any],
    adapter: Adapter,
    payload: dict[str, Any],
    record_id: str,
    group_id: str,
    pii: dict[str, int],
    text: str,
) -> dict[str, Any]:
    """The record columns; ``record_digest`` hashes the envelope with the payload.

    On the common path script and digest are left to :func:`finish_records` (a batch of
    scripts is one array lookup); whatever orjson refuses takes the reference path here, so
    it fails where it always did.
    """
    lang, event_time = _lang_and_time(source, obj)
    counts = dict(sorted(pii.items())) if pii else {}
    template = template_for(
        source.id, adapter.kind, adapter.name, source.licence, source.purposes, source.retention
    )
    script = digest = None
    try:
        if adapter.kind == "document" and len(payload) == 1:
            payload_json = b'{"text":' + orjson.dumps(payload["text"]) + b"}"
        else:
            payload_json = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
        orjson.dumps((lang, event_time))  # what finish_records will encode
    except (TypeError, orjson.JSONEncodeError):
        template = None
    if template is None:
        script = script_of(text)
        varying = (record_id, group_id, lang, script, event_time, counts)
        digest = _reference_digest(source, adapter, varying, payload)
        payload_json = CANONICAL.encode(payload).encode("utf-8")
        opened = None
    else:
        opened = (template, record_id, group_id, lang, event_time, counts)
    text_utf8 = utf8(text)
    return {
        "record_id": record_id,
        "group_id": group_id,
        "kind": adapter.kind,
        "adapter": adapter.name,
        "lang": lang,
        "script": script,
        "modality": "text",
        "licence": source.licence,
        "pii": json.dumps(counts, sort_keys=True) if counts else "{}",
        "event_time": event_time,
        "record_digest": digest,
        "text_digest": sha256_digest(text_utf8),
        "dedup_key": dedup_key(text, source.content),
        "payload": payload_json,
        "text": text,
        "text_utf8": text_utf8,
        OPEN: opened,
    }


def _lang_and_time(source: Source, obj: dict[str, Any]) -> tuple[str | None, str | None]:
    """The row's language (a string, else None) and event time (as a string) when declared."""
    lang = row_field(obj, source.lang_field) if source.lang_field else None
    event_time = row_field(obj, source.time_field) if source.time_field else None
    return (
        lang if isinstance(lang, str) else None,
        str(event_time) if event_time is not None else None,
    )


def _reference_digest(
    source: Source,
    adapter: Adapter,
    varying: tuple[str, str, str | None, str, str | None, dict[str, int]],
    payload: dict[str, Any],
) -> str:
    """``record_digest`` by the standard library's encoder: for what orjson refuses."""
    record_id, group_id, lang, script, event_time, counts = varying
    return record_digest(
        record_id=record_id,
        group_id=group_id,
        source_id=source.id,
        kind=adapter.kind,
        adapter=adapter.name,
        lang=lang,
        script=script,
        licence=source.licence,
        purposes=source.purposes,
        retention=source.retention,
        pii=counts,
        event_time=event_time,
        payload_json=CANONICAL.encode(payload),
    )


OPEN = "_open"  # a record's key holding what finish_records needs, or None when finished


def finish_records(records: list[dict[str, Any]]) -> None:
    """Fill ``script`` and ``record_digest`` of records ``canonical_record`` left open, in place
    (scripts of the whole batch at once); drops the ``OPEN`` key of every record."""
    opened = [record for record in records if record[OPEN] is not None]
    scripts = scripts_of([record["text"] for record in opened])
    for record, script in zip(opened, scripts, strict=True):
        template, record_id, group_id, lang, event_time, counts = record[OPEN]
        varying = (record_id, group_id, lang, script, event_time, counts)
        record["script"] = script
        record["record_digest"] = digest_with(template, varying, record["payload"])
    for record in records:
        del record[OPEN]
