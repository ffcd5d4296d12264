"""Pinning source objects into the CAS at freeze time, with consistent-boundary rules.

An object is pinned by the sha256 of the bytes actually copied (plus size, and the HTTP ETag /
Last-Modified where the server gives them). Each copy is a chunk task, so a freeze killed halfway
resumes without re-copying what is already pinned. The source is listed before and after pinning:
objects added, removed or rewritten during the scan are reported as belonging to the next snapshot
and the pinned version wins. An index file is read once: the objects are listed from those bytes
and those same bytes are pinned, so the pinned index names what the freeze listed. A copy that
raced a writer (the file changed while being read) is retried, so a pinned digest is always the
digest of one consistent version. A remote zstd or gzip object is decoded while it downloads,
within the configured limits: one that is truncated, corrupt or a bomb fails its pin (naming it)
instead of a later canonicalisation.
"""

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from corpus_assets.core.ingest.changelog import fold, late_events, list_segments
from corpus_assets.core.ingest.codecs import DecompressionLimits
from corpus_assets.core.ingest.download import (
    InvalidObject,
    OverBudget,
    ResumeRefused,
    fetch_to_cas,
)
from corpus_assets.core.ingest.freeze_spec import (
    ChangelogSourceSpec,
    DeferredChange,
    FreezeSpec,
    FrozenSegment,
    ObjectsSourceSpec,
    PinnedIndex,
    PinnedObject,
    SourceSpec,
)
from corpus_assets.core.ingest.remote_http import DownloadError, RemoteVersion, head
from corpus_assets.core.ingest.sources import (
    ListedObject,
    SourceError,
    list_objects,
    list_source,
    relist_local,
    url_object,
    version_of,
)
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.config import ChangelogSource, ObjectsSource
from corpus_assets.core.runtime.workspace import Workspace, cached_then_pooled
from corpus_assets.core.storage import failpoints
from corpus_assets.core.storage.artifacts import NDJSON, put_bytes
from corpus_assets.core.storage.digests import json_digest
from corpus_assets.core.storage.tasks import ChunkTask, Done, preload, run_chunk

# pin tasks: this module's import closure, hashed at import (ingest only, so a fix to a record
# stage re-pins nothing)
CODE = stage_code("raw_snapshot.pin.v1", __name__)
CDC_LSN_FIELD = "__cdc_lsn"
PARQUET_MAGIC = b"PAR1"
COPY_RETRIES = 3
# download failures the pin reports at once: a task retry would fetch the same bytes again (an
# over-budget one would re-spend the whole transfer budget on a server that ignores Range)
FINAL = (ResumeRefused, InvalidObject, OverBudget)


class ObjectChanged(RuntimeError):
    """The object changed between listing and copying; it must be listed again."""


class ObjectVanished(RuntimeError):
    """A listed object is gone before it could be pinned: it belongs to the next snapshot."""


class PinError(RuntimeError):
    """Some objects could not be pinned; the freeze is not written (rerun resumes the rest)."""


@dataclass(frozen=True)
class PinnedSource:
    spec: SourceSpec
    incomplete: list[str]


def resume_only() -> bool:
    return os.environ.get("CORPUS_RESUME_ONLY", "") not in ("", "0")


def pin_source(ws: Workspace, source: ObjectsSource | ChangelogSource) -> PinnedSource:
    if isinstance(source, ChangelogSource):
        return _freeze_changelog(ws, source)
    return _pin_objects(ws, source)


def _freeze_changelog(ws: Workspace, source: ChangelogSource) -> PinnedSource:
    """Fold the change log up to its current head; the folded table is the pinned object."""
    segments = list_segments(ws.loaded.resolve(source.path), source.include, ws.loaded.data_home())
    result = fold(
        segments,
        key_field=source.key_field,
        start_lsn=source.start_lsn,
        what=f"source {source.id!r}",
    )
    # each state line carries the lsn that last wrote it, so a record's lineage names it
    state = b"".join(
        json.dumps(
            {**row, CDC_LSN_FIELD: str(lsn)},
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()
        + b"\n"
        for row, lsn in zip(result.rows, result.row_lsns, strict=True)
    )
    ref = put_bytes(ws.cas, state, NDJSON)
    watermark = result.watermark
    spec = ChangelogSourceSpec(
        id=source.id,
        kind="changelog",
        watermark=watermark,
        start_lsn=source.start_lsn,
        events=result.events,
        events_digest=result.events_digest,
        after_watermark=result.after_watermark,
        gaps=result.gaps,
        segments=[FrozenSegment(**segment) for segment in result.segments],
        objects=[
            PinnedObject(
                name=f"state@lsn:{watermark}",
                sha256=ref["digest"],
                size=ref["size"],
                format="jsonl",
                rows=len(result.rows),
            )
        ],
    )
    incomplete = [
        f"source {source.id!r}: CDC offsets missing lsn {lo}-{hi} (watermark {watermark})"
        for lo, hi in result.gaps
    ]
    return PinnedSource(spec=spec, incomplete=incomplete)


def _pin_objects(ws: Workspace, source: ObjectsSource) -> PinnedSource:
    done = preload(ws.catalog, "raw_snapshot", CODE)
    listing = list_source(ws.loaded, source)  # the index (if any) is read here, once
    before = listing.objects
    failpoints.hit(f"pin/{source.id}/listed")
    pinned: list[tuple[PinnedObject, str]] = []  # each with the version it was listed at
    deferred: list[DeferredChange] = []
    failures: list[str] = []
    vanished: list[str] = []
    for listed, result in zip(before, _pin_all(ws, source, before, done), strict=True):
        if result is None:
            vanished.append(listed.name)
        elif isinstance(result, str):
            failures.append(result)
        else:
            pinned.append(result)
    if failures:
        raise PinError(
            f"source {source.id!r}: {len(failures)} object(s) could not be pinned "
            f"(the others are pinned; a rerun resumes): " + "; ".join(failures[:5])
        )
    if vanished:  # its records would silently be missing from a snapshot that validates
        raise PinError(
            f"source {source.id!r}: {len(vanished)} listed object(s) deleted before they could "
            f"be copied: {', '.join(vanished[:5])}{' ...' if len(vanished) > 5 else ''}; "
            "nothing was frozen: rerun the build to freeze the source as it is now"
        )
    after = {o.name: o for o in list_objects(ws.loaded, source, missing_ok=True)}
    names = {o.name for o in before}
    deferred += [
        DeferredChange(name=n, change="added", pinned=False) for n in sorted(set(after) - names)
    ]
    for entry, listed_version in pinned:
        now = after.get(entry.name)
        if now is None:
            deferred.append(DeferredChange(name=entry.name, change="removed", pinned=True))
        elif now.version != listed_version or now.size != entry.size:
            deferred.append(DeferredChange(name=entry.name, change="changed", pinned=True))
    index = None
    if listing.index is not None:  # the bytes the objects were listed from, not a later read
        stored = put_bytes(ws.cas, listing.index.data, "text/plain")
        index = PinnedIndex(location=listing.index.location, **stored)
    spec = ObjectsSourceSpec(
        id=source.id,
        kind="objects",
        objects=[entry for entry, _ in pinned],
        deferred=sorted(deferred, key=lambda d: (d.name, d.change)),
        index=index,
    )
    return PinnedSource(spec=spec, incomplete=[])


# one object's pin: its entry and the version it was listed at; an error; None if it vanished
PinResult = tuple[PinnedObject, str] | str | None


def _pin_all(
    ws: Workspace, source: ObjectsSource, listed: list[ListedObject], done: Done
) -> list[PinResult]:
    """Every listed object pinned, in listing order. Copies run on the task runner when it pays:
    on Ray always (workers download straight into the shared CAS), locally in the pool when two
    or more objects are remote (downloads overlap); local files are hashed here otherwise, since
    a spawn pool's imports cost more than hashing them. Pinned bytes never depend on where."""
    remote = sum(1 for obj in listed if obj.remote)
    pooled = ws.config.execution.engine == "ray" or remote > 1
    return cached_then_pooled(
        ws, listed, source.id, _first_task, _pin_one, done, workers=None if pooled else 1
    )


def _first_task(listed: ListedObject, source_id: str) -> ChunkTask:
    """The pin task of ``listed`` as listed (a relisted object gets a new one)."""
    version = {"location": listed.location, "size": str(listed.size), "version": listed.version}
    return ChunkTask("raw_snapshot", f"{source_id}/{listed.name}", json_digest(version), CODE)


def _pin_one(ws: Workspace, listed: ListedObject, source_id: str, done: Done | None) -> PinResult:
    """``_pin`` as a runner job: a vanished object and a failed copy are results, not raises."""
    source = next(s for s in ws.config.sources if s.id == source_id)
    assert isinstance(source, ObjectsSource)
    try:
        return _pin(ws, source, listed, done)
    except (FileNotFoundError, ObjectVanished):
        return None
    except PinError as error:
        return str(error)


def _pin(
    ws: Workspace, source: ObjectsSource, listed: ListedObject, done: Done | None
) -> tuple[PinnedObject, str]:
    """Pin one object (relisting it if it changed under us): its entry and its listed version."""
    for _ in range(COPY_RETRIES):
        task = _first_task(listed, source.id)
        try:
            outcome = run_chunk(
                ws.catalog,
                ws.cas,
                task,
                lambda obj=listed: _copy(ws, obj),
                done=done,
                passthrough=(
                    ObjectChanged,
                    ObjectVanished,
                    FileNotFoundError,
                    *FINAL,
                ),
            )
        except FINAL as error:  # retrying the same bytes cannot help
            raise PinError(f"{listed.name}: {error}") from None
        except ObjectChanged:
            listed = _relist(ws, source, listed)
            continue
        if outcome.output_digest is None:
            raise PinError(f"{listed.name}: {outcome.error}")
        return _entry(ws, source, listed, outcome.output_digest), listed.version
    raise PinError(f"{listed.name}: kept changing while being copied ({COPY_RETRIES} tries)")


def _relist(ws: Workspace, source: ObjectsSource, listed: ListedObject) -> ListedObject:
    if listed.remote or listed.name.startswith("file://"):
        return url_object(listed.name)
    try:  # by the folder rule again: a link swapped in after the listing is refused too
        return relist_local(ws.loaded, source, listed.name)
    except SourceError as error:
        raise PinError(str(error)) from None


def _copy(ws: Workspace, listed: ListedObject) -> str:
    if listed.remote:
        etag = listed.version[5:] if listed.version.startswith("etag:") else None
        modified = (
            listed.version[len("last-modified:") :]
            if listed.version.startswith("last-modified:")
            else None
        )
        expected = RemoteVersion(listed.location, listed.size, etag, modified)
        bounds = ws.config.limits  # the records layer's, so the pin accepts what it will
        try:
            fetched = fetch_to_cas(
                listed.location,
                ws.cas,
                ws.home / "downloads",
                expected=expected,
                resume_only=resume_only(),
                validate=DecompressionLimits(
                    max_output_bytes=bounds.max_output_bytes, max_ratio=bounds.max_ratio
                ),
            )
        except FINAL:
            raise
        except DownloadError as error:
            try:
                now = head(listed.location)
            except (DownloadError, OSError):
                raise ObjectVanished(f"{listed.name} is gone: {error}") from None
            if version_of(now.etag, now.last_modified) != listed.version:
                raise ObjectChanged(f"{listed.name} changed while it was fetched") from None
            raise
        return fetched.digest
    path = Path(listed.location)
    if os.path.realpath(path) != listed.location:  # a link put on its way since the listing
        raise ObjectChanged(f"{listed.name} now resolves elsewhere than where it was listed")
    stat = path.stat()
    if f"mtime_ns:{stat.st_mtime_ns}" != listed.version or stat.st_size != listed.size:
        raise ObjectChanged(f"{listed.name} changed after it was listed")
    digest, size = ws.cas.put_file(path)
    after = path.stat()
    if (after.st_size, after.st_mtime_ns) != (
        stat.st_size,
        stat.st_mtime_ns,
    ) or size != stat.st_size:
        raise ObjectChanged(f"{listed.name} changed while it was copied")
    return digest


def _entry(ws: Workspace, source: ObjectsSource, listed: ListedObject, digest: str) -> PinnedObject:
    validators: dict[str, str] = {}
    if listed.remote and listed.version:
        kind, _, value = listed.version.partition(":")
        validators["etag" if kind == "etag" else "last_modified"] = value
    return PinnedObject(
        name=listed.name,
        sha256=digest,
        size=ws.cas.size(digest),
        format=_format(ws, source, listed.name, digest),
        **validators,
    )


def _format(
    ws: Workspace, source: ObjectsSource, name: str, digest: str
) -> Literal["jsonl", "parquet"]:
    if source.format != "auto":
        return source.format
    if name.endswith(".parquet"):
        return "parquet"
    with open(ws.cas.path(digest), "rb") as handle:
        return "parquet" if handle.read(4) == PARQUET_MAGIC else "jsonl"


def late_changes(ws: Workspace) -> Callable[[FreezeSpec], list[str]]:
    """A checker for a freeze spec: findings for CDC events at or below a frozen watermark that
    arrived (or changed) after the freeze. Such a snapshot must become INCOMPLETE."""
    configured = {s.id: s for s in ws.config.sources if isinstance(s, ChangelogSource)}

    def check(spec: FreezeSpec) -> list[str]:
        findings = []
        for frozen in spec.sources:
            source = configured.get(frozen.id)
            if not isinstance(frozen, ChangelogSourceSpec) or source is None:
                continue
            segments = list_segments(
                ws.loaded.resolve(source.path), source.include, ws.loaded.data_home()
            )
            findings += late_events(
                segments,
                watermark=frozen.watermark,
                events_digest=frozen.events_digest,
                key_field=source.key_field,
                start_lsn=source.start_lsn,
                what=f"source {source.id!r}",
                gaps=frozen.gaps,
                segments_at_freeze=[segment.model_dump() for segment in frozen.segments],
            )
        return findings

    return check
