"""Decoding/normalisation stage: terminal artefacts out, one newline convention, NFC.

Runs on every text string of every record, so a clean string costs a byte-level control scan
and an NFC quick check and comes back as the same object. Each fix that fired is named in
``Normalized.changes`` so the chunk account can count them; a string that is binary rather than
text is a ``ParseReject`` with a ``parse.*`` reason (quarantined, not "bad quality").

Rules, in order (``kind="code"`` skips the two marked *prose*; any other kind is prose):

1. ``parse.nul_bytes``: more than 1% NUL characters rejects; fewer are stripped (``nul``).
2. *prose* ANSI escape sequences (CSI, OSC/DCS/APC strings, two-byte escapes) are removed
   (``ansi``), including a CSI cut short by the next ESC, as a terminal would drop it.
3. CRLF and lone CR become LF (``crlf``).
4. *prose* backspace overstrike is resolved per line like a printer would (``overstrike``):
   ``_\\bx`` and ``x\\b_`` are underlined ``x``, ``x\\bx`` is bold ``x``, an accent struck over a
   letter (``'\\be``, ``^\\bo``, ``"\\bu``, ``,\\bc``) is that letter with the combining accent
   (NFC then composes ``é``), otherwise the later character wins; a ``\\b`` with nothing to its
   left on the line is dropped.
5. ``parse.control_chars``: more than 1% (and at least 4) of the characters are C0 controls that
   no text format uses (not BEL/BS/TAB/LF/VT/FF/CR/ESC) - binary decoded as text. Otherwise
   every remaining C0/C1 control except LF and TAB is removed (``control``); code also keeps FF,
   which Python and C grammars treat as whitespace.
6. Unicode NFC (``nfc``).

``dedup_normalize`` is a separate, lossy view used only for the dedup key.
"""

import hashlib
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass

from corpus_assets.core.records.text_chunks import line_cuts, rewrite_chunks
from corpus_assets.core.storage.digests import hasher_digest, sha256_digest

CODE_KIND = "code"
# A longer text is checked and NFC-normalised a chunk (cut after a newline) at a time, so no
# whole-text encoding or NFC buffer is held.
_CHUNK_CHARS = 1 << 16

# Any of these means the slow path; everything else is clean except for NFC. C0 and DEL are
# found in the UTF-8 bytes (bytes.translate runs at memory speed, a regex scan at ~0.2 GB/s),
# C1 (UTF-8 C2 80..C2 9F) by regex only when a C2 byte is there at all.
_NEEDS_WORK_PROSE = bytes([*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F])
_NEEDS_WORK_CODE = bytes([*range(0x00, 0x09), 0x0B, *range(0x0D, 0x20), 0x7F])
_C1 = re.compile(r"[\x80-\x9f]")
_CONTROL_PROSE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]+")
_CONTROL_CODE = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]+")
# C0 controls that no text format uses: their density tells binary from text with a stray BEL.
_BINARY_CONTROL = re.compile(r"[\x01-\x06\x0e-\x1a\x1c-\x1f]")
_ANSI = re.compile(
    r"\x1b(?:"
    r"\[[0-?]*[ -/]*(?:[@-~]|(?=\x1b)|\Z)"  # CSI, also one aborted by the next ESC or the end
    r"|[\]PX^_][^\x07\x1b]{0,4096}(?:\x07|\x1b\\)"  # OSC/DCS/SOS/PM/APC string, terminated
    r"|[ -/]+[0-~]"  # nF escape (charset selection)
    r"|[0-~]"  # any other two-byte escape, including an unterminated string's opener
    r")"
)
_CR = re.compile(r"\r\n?")

NUL_REJECT_PPM = 10_000
CONTROL_REJECT_PPM = 10_000
CONTROL_REJECT_MIN = 4

# Overstruck accent -> combining mark (NFC composes it with the letter).
_ACCENTS = {
    "'": "\u0301",
    "`": "\u0300",
    "^": "\u0302",
    '"': "\u0308",
    "~": "\u0303",
    ",": "\u0327",
}


@dataclass(frozen=True)
class Normalized:
    """The normalised text and which fixes fired (stage order, each at most once)."""

    text: str
    changes: tuple[str, ...]


class ParseReject(ValueError):
    """The string is not usable text; ``detail`` holds counts only, never the text."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _strike(old: str, new: str) -> str:
    """What a printer leaves when ``new`` is struck over ``old``."""
    if old == "_" or old == new:
        return new
    if new == "_":
        return old
    if old in _ACCENTS and new.isalpha():
        return new + _ACCENTS[old]
    if new in _ACCENTS and old.isalpha():
        return old + _ACCENTS[new]
    return new


def _overstrike_line(line: str) -> str:
    """One line as a terminal would show it: a backspace moves back, the next char overstrikes."""
    cells: list[str] = []
    pos = 0
    for char in line:
        if char == "\b":
            if pos:
                pos -= 1
        elif pos < len(cells):
            cells[pos] = _strike(cells[pos], char)
            pos += 1
        else:
            cells.append(char)
            pos += 1
    return "".join(cells)


def _overstrike(text: str) -> str:
    """Resolve backspaces line by line (a backspace never crosses a newline)."""
    return "\n".join(_overstrike_line(line) if "\b" in line else line for line in text.split("\n"))


def _exceeds(count: int, total: int, ppm: int) -> bool:
    """``count / total > ppm / 1e6`` in integers (policies carry no floats)."""
    return count * 1_000_000 > ppm * total


def normalize_text(text: str, *, kind: str = "prose") -> Normalized:
    """``text`` after the stage rules in the module docstring, or ``ParseReject``."""
    return Normalized(*normalize_parts(text, kind == CODE_KIND))


def normalize_parts(text: str, code: bool) -> tuple[str, tuple[str, ...]]:
    """``normalize_text`` as ``(text, changes)``: the per-record path builds no object."""
    if len(text) > _CHUNK_CHARS:
        return _normalize_long(text, code)
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw.translate(None, _NEEDS_WORK_CODE if code else _NEEDS_WORK_PROSE)) == len(raw) and (
        b"\xc2" not in raw or _C1.search(text) is None
    ):
        if text.isascii() or unicodedata.is_normalized("NFC", text):
            return text, ()
        return unicodedata.normalize("NFC", text), ("nfc",)
    return _repair(text, code)


def _normalize_long(text: str, code: bool) -> tuple[str, tuple[str, ...]]:
    """``normalize_parts`` of a long text, a slice at a time: no whole-text encoding."""
    n = _CHUNK_CHARS
    if all(_clean(text[a : a + n], code) for a in range(0, len(text), n)):
        new = _nfc(text)
        return new, () if new is text else ("nfc",)
    if code or "\x1b" not in text:  # ANSI strings may cross lines: those take the whole text
        return _repair_lines(text, code)
    return _repair(text, code)


def _repair_lines(text: str, code: bool) -> tuple[str, tuple[str, ...]]:
    """``_repair`` of a long text with no ANSI work, a chunk at a time (every other rule stays
    within a line): a first pass counts the binary controls, since that reject needs the
    whole text's count, and a second builds the text."""
    nul = text.count("\x00")
    if _exceeds(nul, len(text), NUL_REJECT_PPM):
        raise ParseReject("parse.nul_bytes", f"{nul} NUL in {len(text)} characters")
    fired: set[str] = set()
    binary = size = start = 0
    for cut in line_cuts(text, _CHUNK_CHARS):
        chunk = _terminal(text[start:cut], code, fired)
        binary += len(_BINARY_CONTROL.findall(chunk))
        size, start = size + len(chunk), cut
    if binary >= CONTROL_REJECT_MIN and _exceeds(binary, size, CONTROL_REJECT_PPM):
        raise ParseReject("parse.control_chars", f"{binary} binary control characters in {size}")

    def rewrite(chunk: str) -> str:
        chunk, n = (_CONTROL_CODE if code else _CONTROL_PROSE).subn(
            "", _terminal(chunk, code, fired)
        )
        fired.update(("control",) if n else ())
        new = _nfc_or_none(chunk)
        fired.update(("nfc",) if new is not None else ())
        return chunk if new is None else new

    text = rewrite_chunks(text, _CHUNK_CHARS, rewrite)
    return text, tuple(c for c in ("nul", "crlf", "overstrike", "control", "nfc") if c in fired)


def _terminal(text: str, code: bool, fired: set[str]) -> str:
    """NUL, CR and (prose) overstrike rules of ``_repair`` on a chunk, noting which fired."""
    if "\x00" in text:
        text = text.replace("\x00", "")
        fired.add("nul")
    if "\r" in text:
        text = _CR.sub("\n", text)
        fired.add("crlf")
    if not code and "\b" in text:
        text = _overstrike(text)
        fired.add("overstrike")
    return text


def _clean(text: str, code: bool) -> bool:
    """Whether ``text`` has no control character to remove (NFC may still be needed): the
    check at the top of ``normalize_parts``, kept inline there for short texts' speed."""
    raw = text.encode("utf-8", "surrogatepass")
    return len(raw.translate(None, _NEEDS_WORK_CODE if code else _NEEDS_WORK_PROSE)) == len(
        raw
    ) and (b"\xc2" not in raw or _C1.search(text) is None)


def _nfc(text: str) -> str:
    """NFC of ``text`` (``text`` itself when it already is); a long text a chunk at a time."""
    if len(text) > _CHUNK_CHARS:
        return rewrite_chunks(text, _CHUNK_CHARS, _nfc_or_none)
    return _nfc_or_none(text) or text


def _nfc_or_none(text: str) -> str | None:
    """NFC of ``text``, or ``None`` when it already is (a chunk of a long text)."""
    if text.isascii() or unicodedata.is_normalized("NFC", text):
        return None
    return unicodedata.normalize("NFC", text)


def _repair(text: str, code: bool) -> tuple[str, tuple[str, ...]]:
    """The slow path of ``normalize_parts``: some rule besides NFC has work to do."""
    changes: list[str] = []
    if "\x00" in text:
        nul = text.count("\x00")
        if _exceeds(nul, len(text), NUL_REJECT_PPM):
            raise ParseReject("parse.nul_bytes", f"{nul} NUL in {len(text)} characters")
        text = text.replace("\x00", "")
        changes.append("nul")
    if not code and "\x1b" in text:
        text, n = _ANSI.subn("", text)
        if n:
            changes.append("ansi")
    if "\r" in text:
        text = _CR.sub("\n", text)
        changes.append("crlf")
    if not code and "\b" in text:
        text = _overstrike(text)
        changes.append("overstrike")
    binary = len(_BINARY_CONTROL.findall(text))
    if binary >= CONTROL_REJECT_MIN and _exceeds(binary, len(text), CONTROL_REJECT_PPM):
        raise ParseReject(
            "parse.control_chars", f"{binary} binary control characters in {len(text)}"
        )
    text, n = (_CONTROL_CODE if code else _CONTROL_PROSE).subn("", text)
    if n:
        changes.append("control")
    new = _nfc(text)
    if new is not text:
        changes.append("nfc")
    return new, tuple(changes)


# What shows nothing: Unicode whitespace (``\s`` is ``str.isspace``: NBSP, U+2000..U+200A, U+3000
# ...) and the invisible format characters (soft hyphen, CGJ, Hangul fillers, Mongolian vowel
# separator, zero-width space/joiners and direction marks, bidi controls, word joiner and
# invisible operators, BOM / zero-width no-break space).
_BLANK = re.compile(
    r"[\s\u00ad\u034f\u115f\u1160\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069"
    r"\u3164\ufeff\uffa0]*"
)


def is_blank(text: str) -> bool:
    """Whether ``text`` is made only of characters that show nothing (``_BLANK``): such a
    record is empty (``parse.empty_text``). Stops at the first visible character."""
    return _BLANK.fullmatch(text) is not None


def dedup_key(text: str, kind: str = "prose") -> str:
    """sha256 of the dedup-normalised text: what exact dedup and benchmark matching compare.

    Hashed a window at a time, so a text at ``max_chars`` never has its normalised copy (or
    its word list) in memory whole; a text of one window (most) skips the window machinery."""
    if len(text) <= DEDUP_WINDOW:  # what ``_dedup_pieces`` yields for it: one window, whole
        return sha256_digest(_dedup_window(text, kind == CODE_KIND).encode("utf-8"))
    hasher = hashlib.sha256()
    for piece in _dedup_pieces(text, kind):
        hasher.update(piece.encode("utf-8"))
    return hasher_digest(hasher)


def dedup_normalize(text: str, kind: str = "prose") -> str:
    """The lossy text whose hash is the dedup key (expects ``normalize_text`` output).

    Prose: whitespace runs become one space, ends trimmed, casefolded (then NFC again, since
    casefolding can decompose). Code: indentation is meaning, so only trailing whitespace per
    line and blank lines go (every blank line, so files differing only in spacing match).
    """
    return "".join(_dedup_pieces(text, kind))


def _dedup_pieces(text: str, kind: str) -> Iterator[str]:
    """``dedup_normalize(text)`` as consecutive pieces, one window of about ``DEDUP_WINDOW``
    chars at a time (see ``_windows`` for where they are cut). The rules only join words or
    lines, casefolding maps each code point alone and NFC never composes across a cut, so
    each window is normalised alone and the pieces join with the separator the whole-text
    rule puts there: none inside a word or line cut in two."""
    code = kind == CODE_KIND
    separator = "\n" if code else " "
    first = True
    for window, inside in _windows(text, code):
        if code and inside:  # the rest of a line whose start is already out
            head, newline, window = window.partition("\n")
            yield head.rstrip()
            if not newline:
                continue
        elif inside:
            yield _dedup_window(window, code)
            continue
        piece = _dedup_window(window, code)
        if piece:
            yield piece if first else separator + piece
            first = False


def _dedup_window(window: str, code: bool) -> str:
    """The whole-text rule on one window."""
    if code:
        return "\n".join(filter(None, map(str.rstrip, window.split("\n"))))
    piece = " ".join(window.split()).casefold()
    if piece.isascii() or unicodedata.is_normalized("NFC", piece):
        return piece
    return unicodedata.normalize("NFC", piece)


DEDUP_WINDOW = 1 << 18  # casefold allocates 3 chars per char: ~12 MB at 4 B/char
_SPACE = re.compile(r"\s")
# A cut inside a word or line: after a non-whitespace char and before a printable ASCII one,
# which never composes with what precedes it (NFC) and leaves both halves non-blank there.
_MID_WORD = re.compile(r"(?<=\S)[!-~]")


def _windows(text: str, code: bool) -> Iterator[tuple[str, bool]]:
    """``(window, inside)`` pairs covering ``text``: each cut at the first separator (LF for
    code, any whitespace for prose; dropped) in the ``DEDUP_WINDOW`` chars after the first
    ``DEDUP_WINDOW``, else inside a word or line (``_MID_WORD``; ``inside`` marks the window
    that continues it), else at the next separator however far."""
    start, size, inside = 0, len(text), False
    while start < size:
        cut = start + DEDUP_WINDOW
        if cut >= size:
            yield (text[start:] if start else text), inside
            return
        end, skip = _separator(text, code, cut, cut + DEDUP_WINDOW), 1
        if end < 0:
            found = _MID_WORD.search(text, cut, cut + DEDUP_WINDOW)
            end, skip = (found.start(), 0) if found else (_separator(text, code, cut, size), 1)
        if end < 0:
            yield text[start:], inside
            return
        yield text[start:end], inside
        start, inside = end + skip, not skip


def _separator(text: str, code: bool, start: int, end: int) -> int:
    """Index of the first separator in ``text[start:end]``, or -1."""
    if code:
        return text.find("\n", start, end)
    found = _SPACE.search(text, start, end)
    return found.start() if found else -1
