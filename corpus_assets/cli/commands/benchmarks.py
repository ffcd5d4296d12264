"""``corpus-assets benchmark add|list|remove`` (the benchmark registry) and ``excluded`` (why a
snapshot's canonical layer left rows out), as ``corpus_assets.cli`` dispatches them.

``corpus-assets benchmark NAME FILE``, the form before ``list`` and ``remove`` existed, still
means ``benchmark add NAME FILE`` (``cli.parser.with_add``); a benchmark named ``add``, ``list`` or
``remove`` is registered with the explicit ``add``.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from corpus_assets.cli.common import CliError, cli_actor, opened, print_json
from corpus_assets.core.governance import benchmarks
from corpus_assets.core.publication.verify import load_manifest, resolve
from corpus_assets.core.records.benchmark_file import BenchmarkFileError, read_items
from corpus_assets.core.records.index import CanonicalIndex


def cmd_benchmark_add(args: argparse.Namespace) -> int:
    """The item texts are put in the CAS before the registry names them: under the CAS lock."""
    with opened(writing=True) as home:
        try:
            items = read_items(home.cas, args.name, Path(args.file), args.text_field)
            change = benchmarks.register(home.catalog, args.name, items, actor=cli_actor())
        except (BenchmarkFileError, benchmarks.RegistryError) as error:
            raise CliError(str(error)) from None
    kept = f" ({change.unchanged} already registered)" if change.unchanged else ""
    print(f"benchmark {args.name}: {change.written} items{kept}; benchmark fence now {change.seq}")
    return 0


def cmd_benchmark_list(_args: argparse.Namespace) -> int:
    with opened() as home:
        return print_json({"benchmarks": benchmarks.summary(home.catalog)})


def cmd_benchmark_remove(args: argparse.Namespace) -> int:
    prefix = f"{args.name}/"
    ids = None
    if args.item:
        ids = [i if i.startswith(prefix) else prefix + i for i in args.item]
    with opened() as home:
        try:
            change = benchmarks.remove(home.catalog, args.name, ids, actor=cli_actor())
        except benchmarks.RegistryError as error:
            raise CliError(str(error)) from None
    print(
        f"benchmark {args.name}: {change.written} items removed; every alias is fenced at "
        f"benchmark fence {change.seq}"
    )
    return 0


def cmd_excluded(args: argparse.Namespace) -> int:
    write = sys.stdout.write
    with opened() as home:
        manifest = load_manifest(home.cas, resolve(home.catalog, args.digest))
        index = CanonicalIndex.load(home.cas, manifest.layers["canonical_records"])
        for row in index.excluded_rows(args.source):
            if args.reason is None or row["reason"] == args.reason or _under(row, args.reason):
                write(json.dumps(row, sort_keys=True) + "\n")
    return 0


def _under(row: dict[str, Any], prefix: str) -> bool:
    return bool(row["reason"].startswith(prefix.rstrip(".") + "."))
