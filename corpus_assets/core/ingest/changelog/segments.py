"""Changelog segment files as a listing saw them, and reads bounded by that listing.

The source side of a changelog: listing and the cheap head offset feed the discovery fingerprint
without folding anything. Each segment is read only up to the size its listing saw: a live writer
appending meanwhile cannot move the boundary, and the recorded sha256 is of exactly the bytes read.
A plain segment is read like a log reader reads it: a last line without its newline is a write in
progress, so the read stops before it (``whole_lines``) and those bytes belong to the next read. A
compressed segment is written whole: its last line counts as it is, and a frame cut short is a
corruption error (a truncated stream cannot tell a writer mid-frame from a damaged file).
"""

import hashlib
import io
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

from corpus_assets.core.ingest.changelog.events import ChangelogError, load_event, lsn_of
from corpus_assets.core.ingest.codecs import CodecError, iter_lines, sniff_codec
from corpus_assets.core.ingest.folder_listing import OutsideFolder, list_folder
from corpus_assets.core.storage.digests import hasher_digest

DEFAULT_INCLUDE = ("*.jsonl", "*.jsonl.zst", "*.jsonl.gz")
_TAIL_BLOCK = 64 << 10


@dataclass(frozen=True)
class Segment:
    """One segment file as a listing saw it; ``size`` bounds every later read of it."""

    name: str
    path: Path
    size: int
    mtime_ns: int
    pending: int = 0  # bytes after ``size`` the listing saw: an unterminated last line


def whole_lines(segment: Segment, what: str = "changelog") -> Segment:
    """``segment`` cut after its last newline if it is plain: a line without one is still being
    written, so its bytes are left (``pending``) for the next listing. Compressed: unchanged."""
    with open(segment.path, "rb") as handle:
        if segment.size == 0 or sniff_codec(handle.read(4)) != "plain":
            return segment
        end = segment.size
        while end > 0:
            step = min(_TAIL_BLOCK, end)
            handle.seek(end - step)
            block = handle.read(step)
            if len(block) != step:
                raise ChangelogError(
                    f"{what}: segment {segment.name} is shorter than the {segment.size} bytes "
                    "listed; append-only segments must not shrink"
                )
            newline = block.rfind(b"\n")
            if newline >= 0:
                end -= step - newline - 1
                break
            end -= step
    return replace(segment, size=end, pending=segment.size - end)


def list_segments(
    root: Path, include: Sequence[str] = DEFAULT_INCLUDE, home: Path | None = None
) -> list[Segment]:
    """Segment files under ``root`` matching ``include``, sorted by relative POSIX name, by the
    folder rule of every source (``folder_listing``: never out of ``root``, never in ``home``)."""
    root = Path(root)
    if not root.is_dir():
        raise ChangelogError(f"changelog folder {root} does not exist")
    try:
        entries = list_folder(root, include, home)
    except OutsideFolder as error:
        raise ChangelogError(f"changelog folder {root}: {error}") from None
    return [Segment(e.name, e.path, e.size, e.mtime_ns) for e in entries]


def head_offset(segments: Sequence[Segment], *, what: str = "changelog") -> int | None:
    """Max lsn present, from the last event of each segment (append order holds inside a file).

    Plain segments are read backwards from their last newline within the listed size (an
    unterminated last line is a write in progress, not present yet, as for the fold); compressed
    ones cannot seek, so they are streamed to their last line. Names are not trusted to be in log
    order: every segment counts.
    """
    head: int | None = None
    for segment in segments:
        with closing(_tail_lines(whole_lines(segment, what), what)) as lines:
            for where, raw in lines:
                lsn = lsn_of(load_event(raw, what, where)[0], what, where)
                head = lsn if head is None else max(head, lsn)
                break
    return head


class PinnedReader(io.RawIOBase):
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
        return hasher_digest(self._hasher)


def _tail_lines(segment: Segment, what: str) -> Iterator[tuple[str, bytes]]:
    """Non-blank lines from the end: (where, line)."""
    label = f"{what}: segment {segment.name}"
    with open(segment.path, "rb") as handle:
        if sniff_codec(handle.read(4)) != "plain":
            handle.seek(0)
            found: tuple[str, bytes] | None = None
            try:
                for line_no, raw in iter_lines(PinnedReader(handle, segment, what), label):  # type: ignore[arg-type]
                    if raw.strip():
                        found = (f"segment {segment.name} line {line_no}", raw)
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
                    yield (f"segment {segment.name} line at byte {start}", raw.rstrip(b"\r"))
            tail = lines[0]
