"""Where a record came from: its pinned object, the raw line at its byte offset, and a replay.

A canonical record names its object digest, its 1-based line and the byte offset of that line in
the decompressed object. Here the pinned object is looked up in the freeze (its name, format,
size and where it was listed from), the line is read back from the verified CAS copy (a plain
object by one seek; a compressed one by streaming to the offset, memory bounded by a line), and
that line can be replayed through the canonical row stages with this code and config: when the
replay gives the stored ``record_digest`` its per-stage account (normalisation repairs, PII
counts) is the record's, which the snapshot does not store per record. Rows that canonicalising
excluded keep only (object, line, reason): the row a record id names is found by reading the
excluded lines of that source's objects and applying the canonicaliser's own id rule.
"""

from collections.abc import Iterator
from contextlib import closing
from typing import Any

from pydantic import TypeAdapter

from corpus_assets.core.ingest.codecs import (
    CodecError,
    iter_located_lines,
    iter_parquet_rows,
    sniff_codec,
)
from corpus_assets.core.ingest.freeze_spec import FreezeSpec
from corpus_assets.core.records.canonicalize import (
    QUARANTINE_PREFIXES,
    Excluded,
    Stages,
    _identity,  # the id rule itself: a copy here could drift from the canonicaliser's
    canonical_record,
    finish_records,
    parse_line,
)
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.config import CorpusConfig, Source
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.storage.digests import sha256_digest

MAX_LINE = 256 << 20
SOURCE = TypeAdapter(Source)


class OriginError(RuntimeError):
    """A record's recorded location does not match its pinned object's bytes."""


def pinned_object(
    spec: FreezeSpec, source_id: str, digest: str, name: str | None = None
) -> dict[str, Any]:
    """The object as the freeze pinned it (by digest, and by name when two names of the source
    hold the same bytes): name, format, size, where it was listed from (a URL, or the source
    folder joined with the name)."""
    source_config = frozen_source(spec, source_id)
    for source, entry in spec.pinned():
        if source == source_id and entry.sha256 == digest and name in (None, entry.name):
            found = entry.model_dump(mode="json", by_alias=False, exclude_none=True)
            found.pop("sha256")
            return {"digest": digest, **found, "location": _location(source_config, entry.name)}
    raise OriginError(f"object {digest} of source {source_id!r} is not pinned in the freeze")


def _location(source: dict[str, Any], name: str) -> str:
    if "://" in name or not source.get("path"):
        return name
    return f"{source['path'].rstrip('/')}/{name}"


def frozen_source(spec: FreezeSpec, source_id: str) -> dict[str, Any]:
    """The source's entry of the config the freeze ran under."""
    for source in spec.config.sources:
        if source.get("id") == source_id:
            return source
    raise OriginError(f"source {source_id!r} is not in the freeze's config")


def object_rows(
    files: VerifiedFiles, digest: str, fmt: str, what: str
) -> Iterator[tuple[int, int | None, bytes | dict[str, Any]]]:
    """(line or row number, byte offset or None, raw line or Parquet row) of a verified object,
    streamed as the canonical layer reads it."""
    path = files.path(digest, what)
    if fmt == "parquet":
        for number, row in iter_parquet_rows(path):
            yield number, None, row
        return
    with open(path, "rb") as stream:
        yield from iter_located_lines(stream, what)


def read_line(
    files: VerifiedFiles, obj: dict[str, Any], line: int, offset: int | None
) -> bytes | dict[str, Any]:
    """The raw line (or Parquet row) a record names, checked against its line number: a plain
    object is read at the offset (the byte before must end a line), a compressed one streamed
    to it (lines counted on the way)."""
    what = f"raw object {obj['name']} ({obj['digest']})"
    path = files.path(obj["digest"], what)
    with open(path, "rb") as stream:
        plain = obj["format"] != "parquet" and sniff_codec(stream.read(4)) == "plain"
        if plain and offset is not None:
            stream.seek(max(offset - 1, 0))
            before = stream.read(1) if offset else b"\n"
            raw = stream.readline(MAX_LINE)
            if before != b"\n":
                raise OriginError(f"{what}: byte offset {offset} does not start line {line}")
            return raw.rstrip(b"\n").removesuffix(b"\r")
    with closing(object_rows(files, obj["digest"], obj["format"], what)) as rows:
        for number, at, raw in rows:
            if number == line:
                if at != offset:
                    raise OriginError(f"{what}: line {line} starts at {at}, not {offset}")
                return raw
    raise OriginError(f"{what} has no line {line}")


def line_facts(raw: bytes | dict[str, Any]) -> dict[str, Any]:
    """What the origin shows of a raw line: its size and digest, never its text."""
    if isinstance(raw, dict):
        return {"parquet_row": True, "fields": sorted(raw)}
    return {"bytes": len(raw), "sha256": sha256_digest(raw)}


def replay(
    config: CorpusConfig | None,
    source: dict[str, Any],
    purpose: str,
    name: str,
    line: int,
    raw: bytes | dict[str, Any],
) -> dict[str, Any]:
    """The row stages run again on the raw line with this code and ``config``'s row policies:
    either the record (its digest, normalisation repairs and PII counts) or the exclusion.
    Benchmark contamination runs per chunk against the fence's items and is not replayed."""
    if config is None:
        return {"replayed": False, "why": "no corpus config to replay the row stages with"}
    stages = Stages.for_config(config, None)
    stages.purpose = purpose
    try:
        obj = raw if isinstance(raw, dict) else parse_line(raw)
        record = canonical_record(SOURCE.validate_python(source), name, line, dict(obj), stages)
        finish_records([record])
    except Excluded as why:
        return {"replayed": True, "reason": why.reason, "detail": why.detail}
    return {
        "replayed": True,
        "record_digest": record["record_digest"],
        "repairs": dict(sorted(stages.normalized.items())),
        "pii": dict(sorted(stages.pii.items())),
    }


def find_excluded(
    files: VerifiedFiles,
    canonical: CanonicalIndex,
    spec: FreezeSpec,
    record_id: str,
) -> list[dict[str, Any]]:
    """The exclusion rows (``corpus-assets excluded``'s rows) whose raw row carries
    ``record_id``, or whose location ``SOURCE/NAME#L<line>`` it is; each with its byte offset.
    Only excluded lines are parsed, one object of the id's source at a time."""
    source_id = record_id.split("/", 1)[0]
    try:
        source = SOURCE.validate_python(frozen_source(spec, source_id))
    except OriginError:
        return []
    found: list[dict[str, Any]] = []
    chunk: list[dict[str, Any]] = []
    for row in canonical.excluded_rows(source_id):
        if chunk and chunk[0]["name"] != row["name"]:
            found += _matching(files, spec, source, chunk, record_id)
            chunk = []
        chunk.append(row)
    if chunk:
        found += _matching(files, spec, source, chunk, record_id)
    return found


def _matching(
    files: VerifiedFiles,
    spec: FreezeSpec,
    source: Source,
    rows: list[dict[str, Any]],
    record_id: str,
) -> list[dict[str, Any]]:
    """The exclusions of one object whose row's id (or location) is ``record_id``."""
    by_line = {row["line"]: row for row in rows}
    obj = pinned_object(spec, source.id, rows[0]["object"], rows[0]["name"])
    what = f"raw object {obj['name']} ({obj['digest']})"
    found = []
    with closing(object_rows(files, obj["digest"], obj["format"], what)) as lines:
        for number, offset, raw in lines:
            if number > max(by_line):
                break
            row = by_line.get(number)
            if row is not None and record_id in _ids(source, obj["name"], number, raw):
                found.append({**row, "byte_offset": offset, "format": obj["format"]})
    return found


def _ids(source: Source, name: str, number: int, raw: bytes | dict[str, Any]) -> set[str]:
    """The row's location id, and its own id when it parses and has a usable one."""
    ids = {f"{source.id}/{name}#L{number}"}
    try:
        obj = raw if isinstance(raw, dict) else parse_line(raw)
        ids.add(_identity(source, obj, name, number)[0])
    except (Excluded, CodecError):
        pass
    return ids


def quarantined(reason: str) -> bool:
    """Quarantine (the structure could not be read) versus rejection (excluded by policy)."""
    return reason.startswith(QUARANTINE_PREFIXES)
