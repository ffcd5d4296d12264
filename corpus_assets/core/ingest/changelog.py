"""CDC changelog sources: append-only segments of Debezium-style events folded to a table state.

Seed 001: a source without a consistent snapshot is rebuilt from a controlled log up to a stated
offset, and the offsets must be shown to be continuous. So the fold orders events by ``lsn`` (never
by segment name), reports every missing range instead of guessing, refuses anything it cannot
interpret (CDC state must never be silently wrong), and hashes the canonical events it folded so a
later re-fold can prove that nothing at or below the watermark changed after the freeze.

Each segment is read only up to the size its listing saw: a live writer appending meanwhile cannot
move the boundary, and the recorded sha256 is of exactly the bytes folded.
"""

import hashlib
import heapq
import io
import itertools
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import rfc8785

from corpus_assets.core.ingest.codecs import CodecError, iter_lines, sniff_codec

DEFAULT_INCLUDE = ("*.jsonl", "*.jsonl.zst", "*.jsonl.gz")
OPS = frozenset({"c", "u", "d", "r"})
_DECIMAL = re.compile(r"[0-9]+")
_INT_KEY = re.compile(r"-?(?:0|[1-9][0-9]*)")
_TAIL_BLOCK = 64 << 10


class ChangelogError(RuntimeError):
    """The changelog cannot be folded faithfully; the message names source, segment and line."""


@dataclass(frozen=True)
class Segment:
    """One segment file as a listing saw it; ``size`` bounds every later read of it."""

    name: str
    path: Path
    size: int
    mtime_ns: int


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


@dataclass(frozen=True)
class _Event:
    lsn: int
    canon: bytes
    op: str
    key: str  # the key written (c/r/u) or deleted (d)
    old_key: str | None  # u whose before names another key: that key is deleted
    after: dict[str, Any] | None
    where: str


class _OutOfOrder(Exception):
    """A segment's lsns go backwards, so it cannot be merged as a sorted stream."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def list_segments(root: Path, include: Sequence[str] = DEFAULT_INCLUDE) -> list[Segment]:
    """Segment files under ``root`` matching ``include``, sorted by relative POSIX name."""
    root = Path(root)
    if not root.is_dir():
        raise ChangelogError(f"changelog folder {root} does not exist")
    seen: dict[str, Segment] = {}
    for pattern in include:
        for path in root.rglob(pattern):
            if path.name.startswith(".") or not path.is_file():
                continue
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue  # removed while listing (retention): not part of this listing
            name = path.relative_to(root).as_posix()
            seen[name] = Segment(name, path, stat.st_size, stat.st_mtime_ns)
    return [seen[name] for name in sorted(seen)]


def head_offset(segments: Sequence[Segment], *, what: str = "changelog") -> int | None:
    """Max lsn present, from the last event of each segment (append order holds inside a file).

    Plain segments are read backwards from their listed size; compressed ones cannot seek, so they
    are streamed to their last line. Names are not trusted to be in log order: every segment counts.
    An unterminated last line that does not parse is a write in progress and is skipped; a fold of
    the same listing refuses it instead, because a freeze must not guess.
    """
    head: int | None = None
    for segment in segments:
        with closing(_tail_lines(segment, what)) as lines:
            for where, raw, terminated in lines:
                try:
                    lsn = _lsn_of(_load(raw, what, where)[0], what, where)
                except ChangelogError:
                    if terminated:
                        raise
                    continue  # a writer is mid-line: that event is not present yet
                head = lsn if head is None else max(head, lsn)
                break
    return head


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
    mark = _as_offset(watermark, what, "watermark")
    conflicts: list[str] = []
    now = _fold(segments, key_field, start_lsn, mark, what, conflicts=conflicts)
    label = f"{what}: late CDC events at or below watermark {mark}"
    findings = [f"{label}: {conflict}" for conflict in conflicts]
    if now.events_digest == events_digest and not findings:
        return []
    changed = f"{what}: CDC events at or below watermark {mark} changed after the freeze"
    if gaps is not None:
        frozen = _merge(
            [(_as_offset(lo, what, "gap"), _as_offset(hi, what, "gap")) for lo, hi in gaps]
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
    return "sha256:" + hasher.hexdigest()


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
    mark = None if watermark is None else _as_offset(watermark, what, "watermark")
    if mark is not None and mark < start_lsn - 1:
        raise ChangelogError(f"{what}: watermark {mark} is below start_lsn {start_lsn}")
    ordered = sorted(segments, key=lambda s: s.name)
    buffered: set[str] = set()
    while True:
        pinned: dict[str, dict[str, Any]] = {}
        try:
            merged = _merged(ordered, key_field, what, buffered, pinned)
            return _apply(merged, start_lsn, mark, what, conflicts, ordered, pinned)
        except _OutOfOrder as unsorted:
            buffered.add(unsorted.name)  # rare: re-read with that segment sorted in memory


def _apply(
    merged: Iterator[_Event],
    start_lsn: int,
    mark: int | None,
    what: str,
    conflicts: list[str] | None,
    ordered: list[Segment],
    pinned: dict[str, dict[str, Any]],
) -> FoldResult:
    state: dict[str, dict[str, Any]] = {}
    written: dict[str, int] = {}
    hasher = hashlib.sha256()
    gaps: list[tuple[int, int]] = []
    duplicates: list[int] = []
    folded = after = 0
    first: int | None = None
    last_folded = start_lsn - 1
    previous: _Event | None = None
    try:
        for event in merged:
            if event.lsn < start_lsn:
                raise ChangelogError(
                    f"{what}: {event.where}: lsn {event.lsn} is below start_lsn {start_lsn}"
                )
            if previous is not None and event.lsn == previous.lsn:
                below = mark is None or event.lsn <= mark
                if event.canon != previous.canon:
                    problem = (
                        f"lsn {event.lsn} was rewritten: {event.where} differs from "
                        f"{previous.where}"
                    )
                    if conflicts is None:
                        raise ChangelogError(f"{what}: {problem}")
                    if below:
                        conflicts.append(problem)
                elif below and (not duplicates or duplicates[-1] != event.lsn):
                    duplicates.append(event.lsn)
                continue
            previous = event
            if mark is not None and event.lsn > mark:
                after += 1
                continue
            if event.lsn > last_folded + 1:
                gaps.append((last_folded + 1, event.lsn - 1))
            _upsert(state, event)
            written[event.key] = event.lsn
            hasher.update(event.canon + b"\n")
            folded += 1
            first = event.lsn if first is None else first
            last_folded = event.lsn
    finally:
        merged.close()  # type: ignore[attr-defined]
    final = last_folded if mark is None else mark
    if final > last_folded:
        gaps.append((last_folded + 1, final))
    missing = [s.name for s in ordered if s.name not in pinned]
    if missing:  # every stream runs to its end, so this means a bug, not bad data
        raise ChangelogError(f"{what}: segments {missing} were not read to their end")
    return FoldResult(
        watermark=final,
        first_lsn=first,
        events=folded,
        gaps=gaps,
        duplicates=duplicates,
        rows=[state[key] for key in sorted(state, key=_key_order)],
        events_digest="sha256:" + hasher.hexdigest(),
        segments=[pinned[s.name] for s in ordered],
        after_watermark=after,
        row_lsns=[written[key] for key in sorted(state, key=_key_order)],
    )


def _upsert(state: dict[str, dict[str, Any]], event: _Event) -> None:
    if event.op == "d":
        state.pop(event.key, None)  # deleting an absent key leaves the state as it should be
        return
    if event.old_key is not None and event.old_key != event.key:
        state.pop(event.old_key, None)
    assert event.after is not None
    state[event.key] = event.after


def _merged(
    ordered: list[Segment],
    key_field: str,
    what: str,
    buffered: set[str],
    pinned: dict[str, dict[str, Any]],
) -> Iterator[_Event]:
    """All events of all segments in lsn order, opening a segment only when the merge reaches it.

    A segment's first lsn is peeked up front, so normally one file is open at a time however many
    segments there are; equal lsns come out adjacent, which is how duplicates are found.
    """
    counter = itertools.count()
    heap: list[tuple[int, int, _Event | None, Any]] = []
    streams: list[Iterator[_Event]] = []
    try:
        for segment in ordered:
            if segment.name in buffered:
                events = sorted(
                    _read(segment, key_field, what, pinned, check_order=False),
                    key=lambda e: e.lsn,
                )
                if events:
                    stream: Iterator[_Event] = iter(events)
                    heap.append((events[0].lsn, next(counter), next(stream), stream))
                continue
            start = _first_lsn(segment, what)
            if start is None:
                for event in _read(segment, key_field, what, pinned, check_order=True):
                    raise ChangelogError(f"{what}: {event.where}: segment changed while read")
            else:
                heap.append((start, next(counter), None, segment))
        heapq.heapify(heap)
        emitted: int | None = None
        while heap:
            _lsn, _, event, source = heapq.heappop(heap)
            if event is None:
                stream = _read(source, key_field, what, pinned, check_order=True)
                streams.append(stream)
            else:
                if emitted is not None and event.lsn < emitted:
                    raise ChangelogError(f"{what}: {event.where}: segment changed while read")
                emitted = event.lsn
                yield event
                stream = source
            upcoming = next(stream, None)
            if upcoming is not None:
                heapq.heappush(heap, (upcoming.lsn, next(counter), upcoming, stream))
    finally:
        for stream in streams:
            stream.close()  # type: ignore[attr-defined]


def _read(
    segment: Segment,
    key_field: str,
    what: str,
    pinned: dict[str, dict[str, Any]],
    *,
    check_order: bool,
) -> Iterator[_Event]:
    """Stream one segment's events, hashing exactly its listed bytes into ``pinned`` at the end."""
    label = f"{what}: segment {segment.name}"
    previous = -1
    with open(segment.path, "rb") as handle:
        reader = _PinnedReader(handle, segment, what)
        try:
            for line_no, raw in iter_lines(reader, label):  # type: ignore[arg-type]
                if not raw.strip():
                    continue
                event = _parse(raw, key_field, what, f"segment {segment.name} line {line_no}")
                if check_order and event.lsn < previous:
                    raise _OutOfOrder(segment.name)
                previous = event.lsn
                yield event
        except CodecError as error:
            raise ChangelogError(str(error)) from error
        reader.drain()
    pinned[segment.name] = {"name": segment.name, "sha256": reader.digest(), "size": segment.size}


def _first_lsn(segment: Segment, what: str) -> int | None:
    label = f"{what}: segment {segment.name}"
    with open(segment.path, "rb") as handle:
        try:
            for line_no, raw in iter_lines(_PinnedReader(handle, segment, what), label):  # type: ignore[arg-type]
                if raw.strip():
                    where = f"segment {segment.name} line {line_no}"
                    return _lsn_of(_load(raw, what, where)[0], what, where)
        except CodecError as error:
            raise ChangelogError(str(error)) from error
    return None


def _tail_lines(segment: Segment, what: str) -> Iterator[tuple[str, bytes, bool]]:
    """Non-blank lines from the end: (where, line, terminated by a newline)."""
    label = f"{what}: segment {segment.name}"
    with open(segment.path, "rb") as handle:
        if sniff_codec(handle.read(4)) != "plain":
            handle.seek(0)
            found: tuple[str, bytes, bool] | None = None
            try:
                for line_no, raw in iter_lines(_PinnedReader(handle, segment, what), label):  # type: ignore[arg-type]
                    if raw.strip():
                        found = (f"segment {segment.name} line {line_no}", raw, True)
            except CodecError as error:
                raise ChangelogError(str(error)) from error
            if found is not None:
                yield found
            return
        tail = b""
        position = segment.size
        while position > 0:
            step = min(_TAIL_BLOCK, position)
            position -= step
            handle.seek(position)
            block = handle.read(step)
            if len(block) != step:
                raise ChangelogError(f"{label} is shorter than the {segment.size} bytes listed")
            lines = (block + tail).split(b"\n")
            end = position + len(block) + len(tail)
            # lines[0] may be cut by the block start; the others are whole lines.
            for index in range(len(lines) - 1, 0 if position > 0 else -1, -1):
                raw = lines[index]
                start = end - len(raw)
                end = start - 1
                if raw.strip():
                    terminated = start + len(raw) < segment.size
                    yield (
                        f"segment {segment.name} line at byte {start}",
                        raw.rstrip(b"\r"),
                        terminated,
                    )
            tail = lines[0]


def _load(raw: bytes, what: str, where: str) -> tuple[dict[str, Any], bool]:
    """Parse one event; also say whether it is *simple* (no floats, ASCII member names).

    A simple event's RFC 8785 form is what the C JSON encoder writes with sorted keys, which is
    many times faster than the pure-Python canonicalizer every other event goes through.
    """
    simple = True

    def members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal simple
        result = dict(pairs)
        if len(result) != len(pairs):
            names = [name for name, _ in pairs]
            twice = sorted({name for name in names if names.count(name) > 1})
            raise ValueError(f"duplicate member names {twice}")
        simple = simple and "".join(result).isascii()
        return result

    def number(text: str) -> float:
        nonlocal simple
        simple = False
        return float(text)

    try:
        body = json.loads(
            raw.decode("utf-8"),
            object_pairs_hook=members,
            parse_float=number,
            parse_constant=_no_constant,
        )
    except (UnicodeDecodeError, ValueError) as error:
        raise ChangelogError(f"{what}: {where}: not a JSON event: {error}") from None
    if not isinstance(body, dict):
        raise ChangelogError(f"{what}: {where}: event is {type(body).__name__}, not an object")
    return body, simple


def _lsn_of(body: dict[str, Any], what: str, where: str) -> int:
    source = body.get("source")
    if not isinstance(source, dict) or "lsn" not in source:
        raise ChangelogError(f"{what}: {where}: no source.lsn")
    return _as_offset(source["lsn"], what, f"{where}: source.lsn")


def _parse(raw: bytes, key_field: str, what: str, where: str) -> _Event:
    body, simple = _load(raw, what, where)
    lsn = _lsn_of(body, what, where)
    op = body.get("op")
    if op not in OPS:
        raise ChangelogError(f"{what}: {where}: unknown op {op!r} (expected c, u, d or r)")
    before, after = body.get("before"), body.get("after")
    old_key: str | None = None
    if op == "d":
        key = _key(before, "before", key_field, what, where)
        after = None
    else:
        key = _key(after, "after", key_field, what, where)
        if op == "u" and before is not None:
            old_key = _key(before, "before", key_field, what, where)
    canonical = dict(body)
    canonical["source"] = {**body["source"], "lsn": str(lsn)}  # 57 and "57" are one event
    return _Event(lsn, _canonical(canonical, simple, what, where), op, key, old_key, after, where)


def _key(image: Any, side: str, key_field: str, what: str, where: str) -> str:
    if not isinstance(image, dict):
        raise ChangelogError(f"{what}: {where}: {side} is {type(image).__name__}, not a row")
    if key_field not in image:
        raise ChangelogError(f"{what}: {where}: {side} has no key field {key_field!r}")
    value = image[key_field]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ChangelogError(
            f"{what}: {where}: {side}.{key_field} is {type(value).__name__}, not a string or int"
        )
    return str(value)


def _key_order(key: str) -> tuple[int, int, str]:
    """Stated total order: integer-looking keys numerically, then other keys by code point."""
    if _INT_KEY.fullmatch(key) and key != "-0":
        return (0, int(key), "")
    return (1, 0, key)


def _as_offset(value: Any, what: str, label: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and _DECIMAL.fullmatch(value):
        return int(value)
    raise ChangelogError(f"{what}: {label} {value!r} is not a non-negative integer")


def _canonical(value: Any, simple: bool, what: str, where: str) -> bytes:
    """RFC 8785 bytes; integers beyond 2**53 (bigint keys) are written exactly, not refused."""
    try:
        if simple:
            # Strings escape as in RFC 8785 and ASCII names sort the same by code point as by
            # UTF-16 unit; with no floats nothing else differs (ints print exactly either way).
            text = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
            return text.encode("utf-8")
        try:
            return rfc8785.dumps(value)
        except rfc8785.IntegerDomainError:
            return _jcs(value)
    except (rfc8785.CanonicalizationError, UnicodeEncodeError) as error:
        raise ChangelogError(f"{what}: {where}: cannot canonicalize event: {error}") from None


def _jcs(value: Any) -> bytes:
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0].encode("utf-16-be", "surrogatepass"))
        return b"{" + b",".join(rfc8785.dumps(k) + b":" + _jcs(v) for k, v in items) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(_jcs(item) for item in value) + b"]"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode("ascii")
    return rfc8785.dumps(value)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


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


class _PinnedReader(io.RawIOBase):
    """Reads exactly the listed size of a segment and hashes it; a shrunk segment is an error."""

    def __init__(self, handle: BinaryIO, segment: Segment, what: str) -> None:
        self._handle = handle
        self._segment = segment
        self._what = what
        self._left = segment.size
        self._hasher = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        return self._pull(memoryview(buffer))

    def drain(self) -> None:
        """Hash whatever a decompressor left unread; works after the line reader closed us."""
        scratch = memoryview(bytearray(1 << 20))
        while self._pull(scratch):
            pass

    def _pull(self, buffer: memoryview) -> int:
        if self._left <= 0:
            return 0
        view = buffer[: self._left]
        count = self._handle.readinto(view) or 0  # type: ignore[attr-defined]
        if count == 0:
            raise ChangelogError(
                f"{self._what}: segment {self._segment.name} is shorter than the "
                f"{self._segment.size} bytes listed; append-only segments must not shrink"
            )
        self._hasher.update(view[:count])
        self._left -= count
        return count

    def digest(self) -> str:
        return "sha256:" + self._hasher.hexdigest()
