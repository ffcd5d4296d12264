"""CDC changelog fold: Debezium-style events folded to the table state at a watermark.

A source without a consistent snapshot is rebuilt from a controlled log up to a stated
offset, and the offsets must be shown to be continuous. So the fold orders events by ``lsn`` (never
by segment name), reports every missing range instead of guessing, refuses anything it cannot
interpret (CDC state must never be silently wrong), and hashes the canonical events it folded so a
later re-fold can prove that nothing at or below the watermark changed after the freeze.
"""

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corpus_assets.core.ingest.changelog.events import ChangelogError, Event, as_offset
from corpus_assets.core.ingest.changelog.merge import OutOfOrder, merged_events
from corpus_assets.core.ingest.changelog.segments import Segment, whole_lines
from corpus_assets.core.storage.digests import hasher_digest

_INT_KEY = re.compile(r"-?(?:0|[1-9][0-9]*)")


@dataclass(frozen=True)
class FoldResult:
    """The table state at ``watermark`` plus what a freeze must record to re-check it later."""

    watermark: int
    first_lsn: int | None
    events: int
    gaps: list[tuple[int, int]]
    duplicates: list[int]
    rows: list[dict[str, Any]]
    events_digest: str
    segments: list[dict[str, Any]]
    after_watermark: int
    row_lsns: list[int] = field(default_factory=list)  # the lsn that last wrote each row

    @property
    def complete(self) -> bool:
        return not self.gaps

    def freeze_record(self) -> dict[str, Any]:
        """JSON-safe summary for a freeze spec: offsets as decimal strings (they can pass 2**53)."""
        return {
            "watermark": str(self.watermark),
            "firstLsn": None if self.first_lsn is None else str(self.first_lsn),
            "events": self.events,
            "gaps": [[str(lo), str(hi)] for lo, hi in self.gaps],
            "duplicates": [str(lsn) for lsn in self.duplicates],
            "eventsDigest": self.events_digest,
            "segments": self.segments,
            "afterWatermark": self.after_watermark,
        }


def fold(
    segments: Sequence[Segment],
    *,
    key_field: str,
    start_lsn: int = 1,
    watermark: int | str | None = None,
    what: str,
) -> FoldResult:
    """Fold events in lsn order up to ``watermark`` (None: the max lsn present, i.e. freeze now)."""
    return _fold(segments, key_field, start_lsn, watermark, what, conflicts=None)


def late_events(
    segments: Sequence[Segment],
    *,
    watermark: int | str,
    events_digest: str,
    key_field: str,
    start_lsn: int = 1,
    what: str,
    gaps: Sequence[Sequence[int | str]] | None = None,
    segments_at_freeze: Sequence[Mapping[str, Any]] | None = None,
) -> list[str]:
    """Findings if the events at or below a frozen watermark are no longer the frozen ones.

    The events digest proves *that* something changed. To say *what*, pass the freeze's records:
    ``gaps`` (with ``start_lsn`` and the watermark they say which lsns the freeze saw, so a late
    arrival is named by lsn) and ``segments_at_freeze`` (name, sha256, size: a segment rewritten
    in place or removed is named). A rewritten lsn still present twice is always named.
    """
    mark = as_offset(watermark, what, "watermark")
    conflicts: list[str] = []
    now = _fold(segments, key_field, start_lsn, mark, what, conflicts=conflicts)
    label = f"{what}: late CDC events at or below watermark {mark}"
    findings = [f"{label}: {conflict}" for conflict in conflicts]
    if now.events_digest == events_digest and not findings:
        return []
    changed = f"{what}: CDC events at or below watermark {mark} changed after the freeze"
    if gaps is not None:
        frozen = _merge(
            [(as_offset(lo, what, "gap"), as_offset(hi, what, "gap")) for lo, hi in gaps]
        )
        arrived = _subtract(frozen, now.gaps)
        vanished = _subtract(now.gaps, frozen)
        if arrived:
            findings.append(f"{label}: lsn {_ranges(arrived)} arrived after the freeze")
        if vanished:
            findings.append(
                f"{changed}: lsn {_ranges(vanished)} present at the freeze are missing now"
            )
    if segments_at_freeze is not None and now.events_digest != events_digest:
        findings += [
            f"{changed}: {problem}" for problem in _segment_changes(segments, segments_at_freeze)
        ]
    if now.events_digest != events_digest:
        findings.append(
            f"{changed}: events digest {now.events_digest} differs from the frozen {events_digest}"
        )
    return findings


def _segment_changes(
    segments: Sequence[Segment], at_freeze: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Frozen segments that are gone, shorter, or whose frozen prefix no longer hashes the same."""
    current = {segment.name: segment for segment in segments}
    problems = []
    for frozen in sorted(at_freeze, key=lambda f: f["name"]):
        name, size = frozen["name"], int(frozen["size"])
        segment = current.get(name)
        if segment is None:
            problems.append(f"segment {name} read at the freeze is gone")
        elif segment.size < size:
            problems.append(f"segment {name} shrank from {size} to {segment.size} bytes")
        elif _prefix_digest(segment.path, size) != frozen["sha256"]:
            problems.append(f"segment {name} was rewritten: its first {size} bytes changed")
    return problems


def _prefix_digest(path: Path, size: int) -> str | None:
    hasher = hashlib.sha256()
    left = size
    with open(path, "rb") as handle:
        while left > 0:
            block = handle.read(min(left, 1 << 20))
            if not block:
                return None
            hasher.update(block)
            left -= len(block)
    return hasher_digest(hasher)


def _fold(
    segments: Sequence[Segment],
    key_field: str,
    start_lsn: int,
    watermark: int | str | None,
    what: str,
    conflicts: list[str] | None,
) -> FoldResult:
    if isinstance(start_lsn, bool) or not isinstance(start_lsn, int) or start_lsn < 0:
        raise ChangelogError(f"{what}: start_lsn {start_lsn!r} is not a non-negative integer")
    mark = None if watermark is None else as_offset(watermark, what, "watermark")
    if mark is not None and mark < start_lsn - 1:
        raise ChangelogError(f"{what}: watermark {mark} is below start_lsn {start_lsn}")
    # a plain segment's unterminated last line is still being written: not part of this fold
    ordered = sorted((whole_lines(s, what) for s in segments), key=lambda s: s.name)
    buffered: set[str] = set()
    while True:
        pinned: dict[str, dict[str, Any]] = {}
        try:
            merged = merged_events(ordered, key_field, what, buffered, pinned)
            folded = _apply(merged, start_lsn, mark, what, conflicts)
        except OutOfOrder as unsorted:
            buffered.add(unsorted.name)  # rare: re-read with that segment sorted in memory
            continue
        return _result(folded, mark, what, ordered, pinned)


@dataclass
class _Folded:
    """What folding the merged stream accumulated, before the segments are checked."""

    last: int  # the last folded lsn (start_lsn - 1 before any)
    state: dict[str, dict[str, Any]] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)  # key -> lsn that last wrote it
    hasher: Any = field(default_factory=hashlib.sha256)
    gaps: list[tuple[int, int]] = field(default_factory=list)
    duplicates: list[int] = field(default_factory=list)
    events: int = 0
    after: int = 0
    first: int | None = None


def _apply(
    merged: Iterator[Event],
    start_lsn: int,
    mark: int | None,
    what: str,
    conflicts: list[str] | None,
) -> _Folded:
    """Fold the lsn-ordered stream: repeats are checked, events past ``mark`` only counted."""
    folded = _Folded(last=start_lsn - 1)
    previous: Event | None = None
    try:
        for event in merged:
            if event.lsn < start_lsn:
                raise ChangelogError(
                    f"{what}: {event.where}: lsn {event.lsn} is below start_lsn {start_lsn}"
                )
            if previous is not None and event.lsn == previous.lsn:
                _repeat(event, previous, mark, what, conflicts, folded.duplicates)
                continue
            previous = event
            if mark is not None and event.lsn > mark:
                folded.after += 1
                continue
            _fold_in(folded, event)
    finally:
        merged.close()  # type: ignore[attr-defined]
    return folded


def _repeat(
    event: Event,
    previous: Event,
    mark: int | None,
    what: str,
    conflicts: list[str] | None,
    duplicates: list[int],
) -> None:
    """A second event at ``previous``'s lsn: a harmless duplicate, or a rewrite of history."""
    below = mark is None or event.lsn <= mark
    if event.canon != previous.canon:
        problem = f"lsn {event.lsn} was rewritten: {event.where} differs from {previous.where}"
        if conflicts is None:
            raise ChangelogError(f"{what}: {problem}")
        if below:
            conflicts.append(problem)
    elif below and (not duplicates or duplicates[-1] != event.lsn):
        duplicates.append(event.lsn)


def _fold_in(folded: _Folded, event: Event) -> None:
    """Apply one event at or below the watermark, noting the gap before it and hashing it."""
    if event.lsn > folded.last + 1:
        folded.gaps.append((folded.last + 1, event.lsn - 1))
    _upsert(folded.state, event)
    folded.written[event.key] = event.lsn
    folded.hasher.update(event.canon + b"\n")
    folded.events += 1
    folded.first = event.lsn if folded.first is None else folded.first
    folded.last = event.lsn


def _result(
    folded: _Folded,
    mark: int | None,
    what: str,
    ordered: list[Segment],
    pinned: dict[str, dict[str, Any]],
) -> FoldResult:
    """The fold's result once every segment was read to its end; a trailing gap up to ``mark``."""
    final = folded.last if mark is None else mark
    gaps = list(folded.gaps)
    if final > folded.last:
        gaps.append((folded.last + 1, final))
    missing = [s.name for s in ordered if s.name not in pinned]
    if missing:  # every stream runs to its end, so this means a bug, not bad data
        raise ChangelogError(f"{what}: segments {missing} were not read to their end")
    keys = sorted(folded.state, key=_key_order)
    return FoldResult(
        watermark=final,
        first_lsn=folded.first,
        events=folded.events,
        gaps=gaps,
        duplicates=folded.duplicates,
        rows=[folded.state[key] for key in keys],
        events_digest=hasher_digest(folded.hasher),
        segments=[pinned[s.name] for s in ordered],
        after_watermark=folded.after,
        row_lsns=[folded.written[key] for key in keys],
    )


def _upsert(state: dict[str, dict[str, Any]], event: Event) -> None:
    if event.op == "d":
        state.pop(event.key, None)  # deleting an absent key leaves the state as it should be
        return
    if event.old_key is not None and event.old_key != event.key:
        state.pop(event.old_key, None)
    assert event.after is not None
    state[event.key] = event.after


def _key_order(key: str) -> tuple[int, int, str]:
    """Stated total order: integer-looking keys numerically, then other keys by code point."""
    if _INT_KEY.fullmatch(key) and key != "-0":
        return (0, int(key), "")
    return (1, 0, key)


def _merge(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def _subtract(ranges: list[tuple[int, int]], minus: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Inclusive ranges in ``ranges`` not covered by ``minus`` (both merged and sorted)."""
    out: list[tuple[int, int]] = []
    for lo, hi in ranges:
        cursor = lo
        for mlo, mhi in minus:
            if mhi < cursor or mlo > hi:
                continue
            if mlo > cursor:
                out.append((cursor, mlo - 1))
            cursor = max(cursor, mhi + 1)
            if cursor > hi:
                break
        if cursor <= hi:
            out.append((cursor, hi))
    return out


def _ranges(ranges: list[tuple[int, int]]) -> str:
    return ", ".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in ranges)
