"""Rewrite a huge text a newline-cut chunk at a time, holding only the input and the output.

A record can be 16M characters (4 bytes each as a str when one is astral). A whole-text
``re.sub``, ``str.join`` of slices or ``unicodedata.normalize`` holds several full-size copies
at once; cutting just after a ``\\n`` keeps every intermediate chunk-sized for the stages whose
rules never cross a line (``pii`` after PEM, NFC: LF is a starter that never composes).

The output grows by ``+=`` on a local with one reference, which CPython (3.11+, when no tracer
such as coverage is active) extends in place instead of copying; a chunk of a wider string
kind than the output so far makes one copy of the prefix.
"""

from collections.abc import Callable, Iterator, Sequence


def line_cuts(text: str, size: int, spans: Sequence[tuple[int, int, str]] = ()) -> Iterator[int]:
    """Chunk ends ascending, the last ``len(text)``: each just after a ``\\n`` about ``size``
    characters on (later when a line is longer), never inside one of the sorted ``spans``."""
    n, start, i = len(text), 0, 0
    while start < n:
        cut = n if start + size >= n else text.rfind("\n", start, start + size) + 1
        if cut <= start:
            cut = text.find("\n", start + size) + 1 or n
        while cut < n:
            while i < len(spans) and spans[i][1] <= cut - 1:
                i += 1
            if i == len(spans) or spans[i][0] > cut - 1:
                break
            cut = text.find("\n", spans[i][1]) + 1 or n
        yield cut
        start = cut


def rewrite_chunks(
    text: str,
    size: int,
    rewrite: Callable[[str], str | None],
    spans: Sequence[tuple[int, int, str]] = (),
) -> str:
    """``text`` with the sorted (start, end, replacement) ``spans`` replaced, then each chunk
    of :func:`line_cuts` replaced by ``rewrite(chunk)`` (``None``: unchanged). After the
    first, the chunk starts with the ``\\n`` before it as look-behind context, which the result
    keeps. Unchanged: ``text`` itself."""
    out: str | None = None
    start = 0
    for cut in line_cuts(text, size, spans):
        lo = start - 1 if start else 0
        chunk = text[lo:cut]
        inside = [(s - lo, e - lo, new) for s, e, new in spans if start <= s < cut]
        if inside:
            chunk = splice(chunk, inside)
        new = rewrite(chunk)
        if new is not None or inside:
            out = text[:start] if out is None else out
            out += (chunk if new is None else new)[start - lo :]
        elif out is not None:
            out += text[start:cut]
        start = cut
    return text if out is None else out


def splice(text: str, spans: Sequence[tuple[int, int, str]]) -> str:
    """``text`` with each sorted (start, end, replacement) span replaced."""
    parts, last = [], 0
    for start, end, new in spans:
        parts += (text[last:start], new)
        last = end
    parts.append(text[last:])
    return "".join(parts)


_ENCODE_WINDOW = 1 << 18


def utf8(text: str) -> bytes:
    """``text.encode()`` a window at a time when long: CPython sizes a UTF-8 encoding for the
    widest case (4 bytes per char), so a long text stored at 4 B/char would transiently cost
    four times its final UTF-8 once more."""
    if len(text) <= _ENCODE_WINDOW or text.isascii():
        return text.encode()
    return b"".join(
        [text[i : i + _ENCODE_WINDOW].encode() for i in range(0, len(text), _ENCODE_WINDOW)]
    )
