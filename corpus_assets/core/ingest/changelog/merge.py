"""Every segment's events as one stream in lsn order, never in segment-name order.

Segment names are not trusted to be in log order, so the fold needs a k-way merge. It opens a
segment only when the merge reaches it, and records the sha256 of exactly the bytes each segment
contributed, which is what a freeze pins and a later re-fold compares.
"""

import heapq
import itertools
from collections.abc import Iterator
from typing import Any

from corpus_assets.core.ingest.changelog.events import (
    ChangelogError,
    Event,
    load_event,
    lsn_of,
    parse_event,
)
from corpus_assets.core.ingest.changelog.segments import PinnedReader, Segment
from corpus_assets.core.ingest.codecs import CodecError, iter_lines


class OutOfOrder(Exception):
    """A segment's lsns go backwards, so it cannot be merged as a sorted stream."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def merged_events(
    ordered: list[Segment],
    key_field: str,
    what: str,
    buffered: set[str],
    pinned: dict[str, dict[str, Any]],
) -> Iterator[Event]:
    """All events of all segments in lsn order, opening a segment only when the merge reaches it.

    A segment's first lsn is peeked up front, so normally one file is open at a time however many
    segments there are; equal lsns come out adjacent, which is how duplicates are found. Segments
    named in ``buffered`` are sorted in memory; any other whose lsns go backwards raises
    ``OutOfOrder``. Each segment read to its end gets its ``{name, sha256, size}`` in ``pinned``
    (and ``pendingBytes``, the unterminated last line it stopped before, when there is one).
    """
    counter = itertools.count()
    heap: list[tuple[int, int, Event | None, Any]] = []
    streams: list[Iterator[Event]] = []
    try:
        for segment in ordered:
            if segment.name in buffered:
                events = sorted(
                    _read(segment, key_field, what, pinned, check_order=False),
                    key=lambda e: e.lsn,
                )
                if events:
                    stream: Iterator[Event] = iter(events)
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
) -> Iterator[Event]:
    """Stream one segment's events, hashing exactly its listed bytes into ``pinned`` at the end."""
    label = f"{what}: segment {segment.name}"
    previous = -1
    with open(segment.path, "rb") as handle:
        reader = PinnedReader(handle, segment, what)
        try:
            for line_no, raw in iter_lines(reader, label):  # type: ignore[arg-type]
                if not raw.strip():
                    continue
                event = parse_event(raw, key_field, what, f"segment {segment.name} line {line_no}")
                if check_order and event.lsn < previous:
                    raise OutOfOrder(segment.name)
                previous = event.lsn
                yield event
        except CodecError as error:
            raise ChangelogError(str(error)) from error
        reader.drain()
    read = {"name": segment.name, "sha256": reader.digest(), "size": segment.size}
    if segment.pending:  # an unterminated last line, left for the next fold
        read["pendingBytes"] = segment.pending
    pinned[segment.name] = read


def _first_lsn(segment: Segment, what: str) -> int | None:
    label = f"{what}: segment {segment.name}"
    with open(segment.path, "rb") as handle:
        try:
            for line_no, raw in iter_lines(PinnedReader(handle, segment, what), label):  # type: ignore[arg-type]
                if raw.strip():
                    where = f"segment {segment.name} line {line_no}"
                    return lsn_of(load_event(raw, what, where)[0], what, where)
        except CodecError as error:
            raise ChangelogError(str(error)) from error
    return None
