"""``corpus-assets lineage``: the snapshot's lineage graph, one record's lineage (``--record``),
or the records in a packed shard, block or token range (``--shard`` / ``--block``)."""

import argparse
from typing import Any

from corpus_assets.cli.commands.catalog import cmd_lineage
from corpus_assets.cli.common import CliError, opened, print_json
from corpus_assets.core.audit.record_lineage import RecordNotFound, record_lineage
from corpus_assets.core.audit.record_lineage_render import (
    record_sections,
    record_title,
    span_sections,
    span_title,
    text,
)
from corpus_assets.core.audit.record_origin import OriginError
from corpus_assets.core.audit.span_records import SpanQuery, SpanQueryError, span_records
from corpus_assets.core.publication.verify import resolve
from corpus_assets.core.runtime.workspace import Workspace

QUERY_FORMATS = ("text", "json")


def cmd_lineage_query(args: argparse.Namespace) -> int:
    spans = any(getattr(args, k) is not None for k in ("shard", "block", "start", "end"))
    if args.record is None and not spans:
        return int(cmd_lineage(args))
    if args.record is not None and spans:
        raise CliError("give --record, or --shard/--block, not both")
    if args.format not in QUERY_FORMATS:
        raise CliError(
            f"--format {args.format} draws the graph; a record or span query is text|json"
        )
    # the CAS lock, shared: a lookup may write the snapshot's deletion index (``publication.gc``)
    with opened(writing=True) as home:
        # with a config the record's raw line is replayed
        config = home.config if isinstance(home, Workspace) else None
        return _answer(args, home.cas, home.catalog, config)


def _answer(args: argparse.Namespace, cas: Any, catalog: Any, config: Any) -> int:
    snapshot = resolve(catalog, args.digest)
    try:
        if args.record is not None:
            answer = record_lineage(cas, catalog, snapshot, args.record, config)
            title, sections = record_title(answer), record_sections(answer)
        else:
            query = SpanQuery(args.shard, args.block, args.start, args.end)
            answer = span_records(cas, catalog, snapshot, query)
            title, sections = span_title(answer), span_sections(answer)
    except (RecordNotFound, SpanQueryError, OriginError) as error:
        raise CliError(str(error.args[0] if error.args else error)) from None
    if args.format == "json":
        return print_json(answer)
    print(text(title, sections), end="")
    return 0
