"""``corpus-assets benchmark add|list|remove`` (the benchmark registry) and ``excluded`` (why a
snapshot's canonical layer left rows out), as ``corpus_assets.cli`` dispatches them.

``corpus-assets benchmark NAME FILE``, the form before ``list`` and ``remove`` existed, still
means ``benchmark add NAME FILE`` (``cli_parser.with_add``); a benchmark named ``add``, ``list`` or
``remove`` is registered with the explicit ``add``.
"""

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from corpus_assets.cli_common import (
    CliError,
    cli_actor,
    print_json,
    storage,
    writing_storage,
)
from corpus_assets.core.governance import benchmarks
from corpus_assets.core.governance.audit_fields import AuditFieldError, audit_field
from corpus_assets.core.ingest.codecs import CodecError, iter_lines
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.records.normalize import dedup_key, is_blank
from corpus_assets.core.release.verify import load_manifest, resolve
from corpus_assets.core.storage.cas import ContentStore

MAX_ITEM_LINE = 64 << 20  # one benchmark item's JSON line
PUT_THREADS, PUT_WINDOW = 16, 1024


def read_items(
    cas: ContentStore, name: str, path: Path, text_field: str
) -> list[benchmarks.BenchmarkItem]:
    """The file's items, each text put in the CAS; a bad line is one error naming it.

    Each put fsyncs a file and its folder, so thousands of items were bound by the disk's sync
    latency: ``PUT_THREADS`` puts run at once, a window of ``PUT_WINDOW`` texts at a time."""
    items: list[benchmarks.BenchmarkItem] = []
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
        raise CliError(f"{path}: {error.strerror or error}") from None
    except CodecError as error:
        raise CliError(str(error)) from None
    return items


def _put(
    pool: ThreadPoolExecutor, cas: ContentStore, window: list[tuple[str, str, bytes, str]]
) -> list[benchmarks.BenchmarkItem]:
    """Put the window's texts in the CAS (concurrently) and empty it."""
    digests = list(pool.map(cas.put_bytes, [data for _, _, data, _ in window]))
    items = [
        benchmarks.BenchmarkItem(item_id, digest, key, where)
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
        raise CliError(f"{where}: not JSON ({error})") from None
    if not isinstance(row, dict):
        raise CliError(f"{where}: a JSON object per line is expected, not {type(row).__name__}")
    text, local = row.get(text_field), row.get("id", number)
    if not isinstance(text, str) or is_blank(text):
        shown = "missing" if text is None else f"{type(text).__name__}, not a non-empty string"
        raise CliError(f"{where}: field {text_field!r} is {shown}")
    if isinstance(local, bool) or not isinstance(local, str | int) or local == "":
        raise CliError(f"{where}: 'id' must be a non-empty string or an integer")
    try:
        audit_field("id", str(local))  # item ids are recorded in the registry's audit rows
    except AuditFieldError as error:
        raise CliError(f"{where}: {error}") from None
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise CliError(f"{where}: the text has a lone surrogate at {error.start}") from None
    return f"{name}/{local}", where, data, dedup_key(text)


def cmd_benchmark_add(args: argparse.Namespace) -> int:
    """The item texts are put in the CAS before the registry names them: under the CAS lock."""
    with writing_storage() as (_home, cas, catalog):
        items = read_items(cas, args.name, Path(args.file), args.text_field)
        try:
            change = benchmarks.register(catalog, args.name, items, actor=cli_actor())
        except benchmarks.RegistryError as error:
            raise CliError(str(error)) from None
    kept = f" ({change.unchanged} already registered)" if change.unchanged else ""
    print(f"benchmark {args.name}: {change.written} items{kept}; benchmark fence now {change.seq}")
    return 0


def cmd_benchmark_list(_args: argparse.Namespace) -> int:
    _home, _cas, catalog = storage()
    return print_json({"benchmarks": benchmarks.summary(catalog)})


def cmd_benchmark_remove(args: argparse.Namespace) -> int:
    _home, _cas, catalog = storage()
    prefix = f"{args.name}/"
    ids = None
    if args.item:
        ids = [i if i.startswith(prefix) else prefix + i for i in args.item]
    try:
        change = benchmarks.remove(catalog, args.name, ids, actor=cli_actor())
    except benchmarks.RegistryError as error:
        raise CliError(str(error)) from None
    print(
        f"benchmark {args.name}: {change.written} items removed; every alias is fenced at "
        f"benchmark fence {change.seq}"
    )
    return 0


def cmd_excluded(args: argparse.Namespace) -> int:
    _home, cas, catalog = storage()
    manifest = load_manifest(cas, resolve(catalog, args.digest))
    write = sys.stdout.write
    index = CanonicalIndex.load(cas, manifest["layers"]["canonical_records"])
    for row in index.excluded_rows(args.source):
        if args.reason is None or row["reason"] == args.reason or _under(row, args.reason):
            write(json.dumps(row, sort_keys=True) + "\n")
    return 0


def _under(row: dict[str, Any], prefix: str) -> bool:
    return bool(row["reason"].startswith(prefix.rstrip(".") + "."))
