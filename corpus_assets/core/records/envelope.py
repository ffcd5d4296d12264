"""The record envelope and its ``record_digest``, written without re-encoding per record.

``record_digest`` is ``json_digest({**envelope, "payload": payload})``. Most of an envelope is
the same for every record of a source (schema, source, kind, adapter, modality, licence,
purposes, retention), so the canonical JSON around the seven members that vary is written once
per source by the same encoder (:func:`_template`) and a record only encodes its own strings,
its PII counts and the payload (whose JSON is also its column). ``test_canonical_fast_paths``
checks the result against ``json_digest`` of the whole record.
"""

import functools
import json
import re
from collections.abc import Sequence
from typing import Any

from corpus_assets.core.records.index import RECORD_SCHEMA
from corpus_assets.core.storage.digests import json_digest, sha256_digest

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
    literals, order = template
    parts = [literals[0]]
    for n, literal in zip(order, literals[1:], strict=True):
        parts += (values[n], literal)
    return sha256_digest("".join(parts).encode("utf-8"))
