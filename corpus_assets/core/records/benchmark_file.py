"""A benchmark file as registry items: one JSON object per line, each text put in the CAS.

Shared by ``corpus-assets benchmark add`` and the ``benchmark_add`` job the UI launches, so a
file is read, checked and refused the same way whoever asks. A bad line is one
:class:`BenchmarkFileError` naming the file and line; nothing is registered from such a file.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from corpus_assets.core.governance.audit_fields import AuditFieldError, audit_field
from corpus_assets.core.governance.benchmarks import BenchmarkItem
from corpus_assets.core.ingest.codecs import CodecError, iter_lines
from corpus_assets.core.records.normalize import dedup_key, is_blank
from corpus_assets.core.storage.cas import ContentStore


class BenchmarkFileError(ValueError):
    """A benchmark file that cannot be read or has a bad line (the message names where)."""


MAX_ITEM_LINE = 64 << 20  # one benchmark item's JSON line
PUT_THREADS, PUT_WINDOW = 16, 1024


def read_items(cas: ContentStore, name: str, path: Path, text_field: str) -> list[BenchmarkItem]:
    """The file's items, each text put in the CAS; a bad line is one error naming it.

    Each put fsyncs a file and its folder, so thousands of items were bound by the disk's sync
    latency: ``PUT_THREADS`` puts run at once, a window of ``PUT_WINDOW`` texts at a time."""
    items: list[BenchmarkItem] = []
    window: list[tuple[str, str, bytes, str]] = []
    try:
        with path.open("rb") as handle, ThreadPoolExecutor(PUT_THREADS) as pool:
            for number, line in iter_lines(handle, str(path), max_line_bytes=MAX_ITEM_LINE):
                if line.strip():
                    window.append(_parse(name, f"{path} line {number}", number, line, text_field))
                if len(window) >= PUT_WINDOW:
                    items += _put(pool, cas, window)
            items += _put(pool, cas, window)
    except OSError as error:
        raise BenchmarkFileError(f"{path}: {error.strerror or error}") from None
    except CodecError as error:
        raise BenchmarkFileError(str(error)) from None
    return items


def _put(
    pool: ThreadPoolExecutor, cas: ContentStore, window: list[tuple[str, str, bytes, str]]
) -> list[BenchmarkItem]:
    """Put the window's texts in the CAS (concurrently) and empty it."""
    digests = list(pool.map(cas.put_bytes, [data for _, _, data, _ in window]))
    items = [
        BenchmarkItem(item_id, digest, key, where)
        for (item_id, where, _, key), digest in zip(window, digests, strict=True)
    ]
    window.clear()
    return items


def _parse(
    name: str, where: str, number: int, line: bytes, text_field: str
) -> tuple[str, str, bytes, str]:
    """(item id, where, text as UTF-8, dedup key) of one line, or the error naming it."""
    try:
        row = json.loads(line)
    except ValueError as error:
        raise BenchmarkFileError(f"{where}: not JSON ({error})") from None
    if not isinstance(row, dict):
        raise BenchmarkFileError(
            f"{where}: a JSON object per line is expected, not {type(row).__name__}"
        )
    text, local = row.get(text_field), row.get("id", number)
    if not isinstance(text, str) or is_blank(text):
        shown = "missing" if text is None else f"{type(text).__name__}, not a non-empty string"
        raise BenchmarkFileError(f"{where}: field {text_field!r} is {shown}")
    if isinstance(local, bool) or not isinstance(local, str | int) or local == "":
        raise BenchmarkFileError(f"{where}: 'id' must be a non-empty string or an integer")
    try:
        audit_field("id", str(local))  # item ids are recorded in the registry's audit rows
    except AuditFieldError as error:
        raise BenchmarkFileError(f"{where}: {error}") from None
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise BenchmarkFileError(
            f"{where}: the text has a lone surrogate at {error.start}"
        ) from None
    return f"{name}/{local}", where, data, dedup_key(text)
