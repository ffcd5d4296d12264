"""The record envelope and its ``record_digest``, written without re-encoding per record.

``record_digest`` is ``json_digest({**envelope, "payload": payload})``. Most of an envelope is
the same for every record of a source (schema, source, kind, adapter, modality, licence,
purposes, retention), so the canonical JSON around the seven members that vary is written once
per source by the same encoder (:func:`_template`) and a record only encodes its own strings,
its PII counts and the payload (whose JSON is also its column). ``test_canonical_fast_paths``
checks the result against ``json_digest`` of the whole record.
"""

import functools
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

import orjson

from corpus_assets.core.records.index import RECORD_SCHEMA
from corpus_assets.core.records.scripts import NO_SCRIPT, SCRIPTS
from corpus_assets.core.storage.digests import hasher_digest, json_digest, sha256_digest

# What ``canonical_json`` writes for strings, small ints, None, lists and dicts with ASCII keys -
# every envelope and payload canonicalisation builds - so a payload's column JSON is its part of
# the record digest's JSON too.
CANONICAL = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))

# The members that vary per record, in the order ``record_digest`` takes them.
_VARYING = ("record_id", "group_id", "lang", "script", "event_time", "pii", "payload")
_MARK = re.compile(r'"\\u0000(\d)\\u0000"')  # how CANONICAL writes the string "\0<n>\0"


def envelope(
    *,
    record_id: Any,
    group_id: Any,
    source_id: str,
    kind: str,
    adapter: str,
    lang: Any,
    script: Any,
    licence: str | None,
    purposes: Sequence[str] | None,
    retention: str | None,
    pii: Any,
    event_time: Any,
) -> dict[str, Any]:
    """The record envelope: who, what kind, which script, under which governance."""
    return {
        "schema": RECORD_SCHEMA,
        "record_id": record_id,
        "group_id": group_id,
        "source_id": source_id,
        "kind": kind,
        "adapter": adapter,
        "lang": lang,
        "script": script,
        "modality": "text",
        "governance": {
            "licence": licence,
            "purposes": sorted(purposes) if purposes is not None else None,
            "retention": retention,
            "pii": pii,
        },
        "event_time": event_time,
    }


@functools.lru_cache(maxsize=256)
def _template(
    source_id: str,
    kind: str,
    adapter: str,
    licence: str | None,
    purposes: tuple[str, ...] | None,
    retention: str | None,
) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
    """(literal JSON pieces, which varying member goes between them), or None if a constant
    member happens to hold a marker string (then the record takes the whole-JSON path)."""
    marks = {name: f"\x00{n}\x00" for n, name in enumerate(_VARYING)}
    payload = marks.pop("payload")
    whole = {
        **envelope(
            source_id=source_id,
            kind=kind,
            adapter=adapter,
            licence=licence,
            purposes=purposes,
            retention=retention,
            **marks,
        ),
        "payload": payload,
    }
    pieces = _MARK.split(CANONICAL.encode(whole))
    order = tuple(int(n) for n in pieces[1::2])
    if sorted(order) != list(range(len(_VARYING))):
        return None
    return tuple(pieces[0::2]), order


def record_digest(
    *,
    record_id: str,
    group_id: str,
    source_id: str,
    kind: str,
    adapter: str,
    lang: str | None,
    script: str,
    licence: str | None,
    purposes: Sequence[str] | None,
    retention: str | None,
    pii: dict[str, int],
    event_time: str | None,
    payload_json: str,
) -> str:
    """``json_digest({**envelope(...), "payload": payload})`` given the payload's CANONICAL JSON."""
    constants = (source_id, kind, adapter, licence)
    template = _template(*constants, tuple(purposes) if purposes is not None else None, retention)
    if template is None:
        fields = envelope(
            record_id=record_id,
            group_id=group_id,
            source_id=source_id,
            kind=kind,
            adapter=adapter,
            lang=lang,
            script=script,
            licence=licence,
            purposes=purposes,
            retention=retention,
            pii=pii,
            event_time=event_time,
        )
        return json_digest({**fields, "payload": json.loads(payload_json)})
    literals, order = template
    varying = (record_id, group_id, lang, script, event_time, pii)
    return _digest_str((literals, order, ()), varying, payload_json)


Template = tuple[tuple[str, ...], tuple[int, ...], tuple[bytes, ...]]
Varying = tuple[str, str, str | None, str, str | None, dict[str, int]]


def template_for(
    source_id: str,
    kind: str,
    adapter: str,
    licence: str | None,
    purposes: Sequence[str] | None,
    retention: str | None,
) -> Template | None:
    """A source's envelope template, literals also as UTF-8 (None: the whole-JSON path)."""
    frozen = tuple(purposes) if purposes is not None else None
    return _bytes_template(source_id, kind, adapter, licence, frozen, retention)


@functools.lru_cache(maxsize=256)
def _bytes_template(
    source_id: str,
    kind: str,
    adapter: str,
    licence: str | None,
    purposes: tuple[str, ...] | None,
    retention: str | None,
) -> Template | None:
    pieces = _template(source_id, kind, adapter, licence, purposes, retention)
    if pieces is None:
        return None
    literals, order = pieces
    return literals, order, tuple(literal.encode("utf-8") for literal in literals)


def digest_with(template: Template, varying: Varying, payload: bytes) -> str:
    """sha256 of the envelope JSON: the template's literals around the varying members
    ``(record_id, group_id, lang, script, event_time, pii)`` and the payload's JSON bytes.

    orjson writes what ``CANONICAL`` writes for strings and int dicts (checked over every code
    point by ``test_canonical_fast_paths``); a value it refuses (a lone surrogate) takes the
    string path, which fails as it always did.
    """
    record_id, group_id, lang, script, event_time, pii = varying
    dumps = orjson.dumps
    try:
        encoded_id = dumps(record_id)
        values = (
            encoded_id,
            encoded_id if group_id == record_id else dumps(group_id),
            b"null" if lang is None else dumps(lang),
            _SCRIPT_JSON.get(script) or dumps(script),
            b"null" if event_time is None else dumps(event_time),
            dumps(pii, option=orjson.OPT_SORT_KEYS) if pii else b"{}",
            payload,
        )
    except (TypeError, orjson.JSONEncodeError):
        return _digest_str(template, varying, payload.decode("utf-8"))
    _, order, literals = template
    parts = [literals[0]]
    for n, literal in zip(order, literals[1:], strict=True):
        parts += (values[n], literal)
    return hasher_digest(hashlib.sha256(b"".join(parts)))


_SCRIPT_JSON = {code: orjson.dumps(code) for code in (*(code for _, code in SCRIPTS), NO_SCRIPT)}


def _digest_str(template: Template, varying: Varying, payload_json: str) -> str:
    """``digest_with`` by the standard library's encoder (the reference)."""
    record_id, group_id, lang, script, event_time, pii = varying
    encode = CANONICAL.encode
    values = (
        encode(record_id),
        encode(group_id),
        "null" if lang is None else encode(lang),
        encode(script),
        "null" if event_time is None else encode(event_time),
        encode(pii) if pii else "{}",
        payload_json,
    )
    literals, order, _ = template
    parts = [literals[0]]
    for n, literal in zip(order, literals[1:], strict=True):
        parts += (values[n], literal)
    return sha256_digest("".join(parts).encode("utf-8"))
