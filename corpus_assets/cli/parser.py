"""The ``corpus-assets`` command line: every subcommand, its arguments and its help, and nothing
else. Each command is named by module (``cli.common.lazy``) and imported only when it runs, so
parsing any command line - and ``--help`` - imports argparse and this module only."""

import argparse
from typing import Any, TypeAlias

from corpus_assets.cli.common import audited, lazy

DESCRIPTION = (
    "``corpus-assets``: build, verify, approve, activate and inspect snapshots without the UI."
)
EXPORT_FORMATS = ("megatron", "mds", "croissant")  # core.consumption.export_run.FORMATS (a test)
GRAPH_FORMATS = ("text", "mermaid", "json", "prov")  # commands.lineage draws these
ACTIONS = ("add", "list", "remove")  # of ``benchmark``
# What a command's process never imports (core.runtime.absent_imports): pyarrow would import
# pandas at its first array or Parquet read, ~0.25 CPU-s (a sixth of ``card``); no command takes
# or returns a pandas object (the ``hf`` extra's loader is a Python API, never a command's).
NO_PANDAS = ("pandas",)
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _instance() -> Any:
    """The Dagster instance, for ``partition`` (dagster is imported only then)."""
    from corpus_assets.cli.instance import dagster_instance

    return dagster_instance()


def parser() -> argparse.ArgumentParser:
    """The command line, one group of subcommands per concern, in the order ``--help`` lists."""
    parser = argparse.ArgumentParser(prog="corpus-assets", description=DESCRIPTION)
    parser.add_argument(
        "--config",
        help="corpus.yaml (default: $CORPUS_CONFIG or "
        "$CORPUS_HOME/corpus.yaml; CORPUS_HOME defaults to ./.corpus)",
    )
    parser.set_defaults(goes_without=NO_PANDAS)  # every command
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    _build_commands(sub)
    _publication_commands(sub)
    _inspection_commands(sub)
    _governance_commands(sub)
    add_gc_command(sub)
    add_scrub_command(sub)
    add_trust_command(sub)
    _tokenizer_commands(sub)
    run_fields = {"run_id": "--run-id", "purpose": "--purpose"}
    p = _command(
        sub,
        "read",
        audited(lazy("catalog", "cmd_read"), **run_fields),
        "training entry: take a permit for a digest and read it, verified",
    )
    p.add_argument("digest", help="a snapshotId (an alias is never accepted)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--purpose", required=True)
    p = _command(
        sub,
        "export",
        audited(lazy("catalog", "cmd_export"), **run_fields),
        "training read into Megatron .bin/.idx, MDS files or Croissant metadata, verified",
    )
    p.add_argument("format", choices=EXPORT_FORMATS)
    p.add_argument("digest", help="a snapshotId (an alias is never accepted)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--purpose", required=True)
    p.add_argument("--out", required=True, help="directory to write the files into")
    return parser


def _command(sub: Subcommands, name: str, run: Any, help_text: str) -> argparse.ArgumentParser:
    """A subcommand whose help and description are the same line, dispatching to ``run``."""
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.set_defaults(run=run)
    return p


def _build_commands(sub: Subcommands) -> None:
    p = _command(
        sub,
        "demo",
        lazy("snapshots", "cmd_demo"),
        "write the demo sources + corpus.yaml, build, validate, approve, "
        "activate, and print the snapshotId and alias generation",
    )
    p = _command(
        sub,
        "build",
        lazy("snapshots", "cmd_build"),
        "freeze a partition and materialize all seven layers",
    )
    p.set_defaults(defers_collections=True)
    p.add_argument("--partition", help="partition key to (re)build; default: a new key")
    p.add_argument(
        "--resume-only",
        action="store_true",
        help="only resume interrupted downloads; refuse to start any from scratch",
    )
    p = _command(
        sub,
        "verify",
        lazy("snapshots", "cmd_verify"),
        "recompute and check every digest of a snapshot",
    )
    p.add_argument("digest")
    p = sub.add_parser("partition", help="list the snapshot partitions, or delete one")
    actions = p.add_subparsers(required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="Dagster's partitions with their catalog state")
    listing.set_defaults(run=lazy("partitions", "cmd_partition_list"), instance=_instance)
    delete = actions.add_parser("delete", help="delete one from the Dagster instance (not data)")
    delete.add_argument("key", help="the partition key, exactly as listed (quote it)")
    delete.add_argument("--force", action="store_true", help="even if the catalog froze it")
    delete.set_defaults(run=lazy("partitions", "cmd_partition_delete"), instance=_instance)


def _publication_commands(sub: Subcommands) -> None:
    approve_cmd = audited(lazy("snapshots", "cmd_approve"), by="--by")
    p = _command(sub, "approve", approve_cmd, "approve a VALIDATED snapshot (bound to its digest)")
    p.add_argument("digest")
    p.add_argument("--by", required=True, help="who approves")
    p = _command(
        sub,
        "activate",
        lazy("snapshots", "cmd_activate"),
        "activate an APPROVED snapshot on its alias now",
    )
    p.add_argument("digest")


def _inspection_commands(sub: Subcommands) -> None:
    p = _command(
        sub,
        "status",
        lazy("status", "cmd_status"),
        "snapshots, states, aliases and generations",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--all", action="store_true", help="every ended snapshot too, not only the newest ten"
    )
    p = _command(sub, "show", lazy("catalog", "cmd_show"), "print a snapshot's manifest JSON")
    p.add_argument("digest")
    p = _command(
        sub,
        "card",
        lazy("card", "cmd_card"),
        "the dataset card: a static HTML page with plots of sources, shares, dedup, splits, "
        "lengths, contamination, lineage, signature and fences",
    )
    p.add_argument("digest", help="snapshotId or manifest digest")
    p.add_argument("--out", required=True, help="directory to write index.html and its plots into")
    p = _command(
        sub,
        "diff",
        lazy("catalog", "cmd_diff"),
        "shadow diff of a snapshot against its alias's active one",
    )
    p.add_argument("digest")
    p = _command(
        sub, "prov", lazy("catalog", "cmd_prov"), "W3C PROV-JSON of how a snapshot was produced"
    )
    p.add_argument("digest")
    add_lineage_command(sub)  # the graph, --record, --shard/--block
    p = _command(
        sub,
        "dedup",
        lazy("catalog", "cmd_dedup"),
        "why a record was kept or removed: verdict, direct match and Jaccard, its cluster, "
        "and its leakage group with splits",
    )
    p.add_argument("digest", help="snapshotId")
    p.add_argument("record_id")


def _governance_commands(sub: Subcommands) -> None:
    p = _command(
        sub,
        "rollback",
        lazy("snapshots", "cmd_rollback"),
        "point the alias back at an earlier active snapshot",
    )
    p.add_argument("digest")
    add_history_command(sub)
    p = _command(
        sub,
        "tombstone",
        lazy("catalog", "cmd_tombstone_hits"),
        "revoke data, or show where a tombstone hits",
    )
    tomb = p.add_subparsers(required=True, metavar="ACTION")
    add = tomb.add_parser("add", help="revoke a record, source object or group; fences all aliases")
    target = add.add_mutually_exclusive_group(required=True)
    target.add_argument("--record", help="record id, e.g. essays/e0001")
    target.add_argument("--object", help="raw object digest sha256:...")
    target.add_argument("--group", help="group id")
    add.add_argument("--reason", required=True)
    tomb_fields = {"record": "--record", "object": "--object", "group": "--group"}
    add.set_defaults(
        run=audited(lazy("catalog", "cmd_tombstone_add"), reason="--reason", **tomb_fields)
    )
    lift = tomb.add_parser(
        "lift",
        help="withdraw a tombstone; fences all aliases, later builds may hold its target again",
    )
    lift.add_argument("seq", type=int, help="the tombstone to lift (its `tombstone add` number)")
    lift.add_argument("--reason", required=True)
    lift.set_defaults(run=audited(lazy("catalog", "cmd_tombstone_lift"), reason="--reason"))
    show_hits = tomb.add_parser("hits", help="deletion lineage: snapshots, members, spans, runs")
    show_hits.add_argument("seq", type=int)
    add_benchmark_commands(sub)  # benchmark add|list|remove, excluded
    add_selftest_command(sub)


def _tokenizer_commands(sub: Subcommands) -> None:
    p = sub.add_parser("tokenizer", help="train a tokenizer on a partition's train split")
    actions = p.add_subparsers(required=True, metavar="ACTION")
    train = actions.add_parser(
        "train",
        help="byte-level BPE on the train split only; pins its tokenizer.json in the CAS",
        description="Train a byte-level BPE (Hugging Face tokenizers) on the train split of a "
        "built partition, pin its tokenizer.json in the CAS and print its digest and the "
        "corpus.yaml lines that use it. Special tokens default to policies.tokenizer's when it "
        "is a huggingface tokenizer, else <|endoftext|> and <|pad|>.",
    )
    train.add_argument("--partition", required=True, help="a built partition (its splits exist)")
    train.add_argument("--vocab-size", type=int, default=4096, help="at most this many ids")
    train.add_argument("--out", help="also write the tokenizer.json here")
    train.add_argument("--eos", help="end-of-sequence token (default <|endoftext|>)")
    train.add_argument("--pad", help="padding token (default <|pad|>)")
    train.add_argument("--bos", help="beginning-of-sequence token (default: none)")
    train.set_defaults(run=lazy("catalog", "cmd_tokenizer_train"))


def add_gc_command(sub: Any) -> None:
    """Register ``gc`` on the top-level subcommands."""
    text = "remove CAS objects nothing retained references (retention: corpus.yaml)"
    p = sub.add_parser("gc", help=text, description=text)
    p.add_argument("--dry-run", action="store_true", help="list what would go; delete nothing")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=lazy("gc", "cmd_gc"))


def add_scrub_command(sub: Any) -> None:
    """Register ``scrub`` on the top-level subcommands."""
    text = "re-hash every byte of every ACTIVE and APPROVED snapshot, trusting no stat"
    p = sub.add_parser("scrub", help=text, description=text)
    p.add_argument("--alias", help="only this alias's snapshots (default: every alias)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=lazy("gc", "cmd_scrub"))


def add_history_command(sub: Any) -> None:
    """Register ``history`` on the CLI's subcommands."""
    help_text = "an alias's audit trail: every state move, approver, generation and fence"
    p = sub.add_parser("history", help=help_text, description=help_text)
    p.add_argument("alias")
    p.add_argument("--json", action="store_true", help="one JSON object per move, in a list")
    p.set_defaults(run=lazy("history", "cmd_history"))


def add_trust_command(sub: Any) -> None:
    """Register ``trust`` and its actions on the top-level subcommands."""
    text = "the signing keys readers accept (a file outside the data home): list, add, rotate"
    p = sub.add_parser("trust", help=text, description=text)
    actions = p.add_subparsers(required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the trust file, its keys and this home's key")
    listing.add_argument("--json", action="store_true", help="print it as JSON")
    listing.set_defaults(run=lazy("trust", "cmd_trust_list"))
    add = actions.add_parser("add", help="accept a public key (PEM), e.g. another builder's")
    add.add_argument("public_key", help="a PEM public key file")
    add.set_defaults(run=lazy("trust", "cmd_trust_add"))
    rotate = actions.add_parser(
        "rotate", help="retire this home's signing key for a new one; old snapshots still verify"
    )
    rotate.set_defaults(run=lazy("trust", "cmd_trust_rotate"))


def add_lineage_command(sub: Any) -> None:
    """``lineage DIGEST [--record ID | --shard S --block N --start T --end T] [--format F]``."""
    about = "sources -> layers -> manifest -> aliases -> runs; or one record's lineage; or spans"
    p = sub.add_parser("lineage", help=about, description=about)
    p.add_argument("digest", help="snapshotId or manifest digest")
    p.add_argument("--format", choices=GRAPH_FORMATS, default="text")
    one = p.add_argument_group("one record (text or json)")
    one.add_argument(
        "--record",
        metavar="RECORD_ID",
        help="origin, canonical stages, dedup verdict, split, samples, packed spans and runs "
        "of this record; an excluded row may also be named SOURCE/OBJECT_NAME#L<line>",
    )
    spans = p.add_argument_group("the reverse: packed spans -> records (text or json)")
    spans.add_argument("--shard", help="a shard by CAS digest or by position (0, 1, ...)")
    spans.add_argument("--block", type=int, help="a block number (numbered across the pack)")
    spans.add_argument("--start", type=int, help="first token of the range in the block")
    spans.add_argument("--end", type=int, help="token after the range in the block")
    p.set_defaults(run=lazy("lineage", "cmd_lineage_query"))


def with_add(argv: list[str]) -> list[str]:
    """``benchmark NAME FILE`` -> ``benchmark add NAME FILE``; every other command line as is.
    Only ``--config VALUE`` / ``--config=VALUE`` may come before the command."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 1 if "=" in argv[i] or argv[i] in ("-h", "--help") else 2
    after = argv[i + 1] if argv[i : i + 1] == ["benchmark"] and i + 1 < len(argv) else None
    if after is not None and after not in (*ACTIONS, "-h", "--help"):
        return [*argv[: i + 1], "add", *argv[i + 1 :]]
    return argv


def add_benchmark_commands(sub: Any) -> None:
    """The ``benchmark`` and ``excluded`` subcommands on ``corpus_assets.cli``'s parser."""
    about = "the benchmark registry: add, list or remove items; every change advances the fence"
    p = sub.add_parser("benchmark", help=about, description=about)
    actions = p.add_subparsers(required=True, metavar="ACTION")
    add = actions.add_parser(
        "add",
        help="register a JSONL (.jsonl, .jsonl.gz, .jsonl.zst) file's items; idempotent",
        description="Register each line's text as item NAME/<id> (the row's id, else its line "
        "number). An item already registered with the same text is kept as it is; the same "
        "id with another text is refused. `benchmark NAME FILE` is the same command.",
    )
    add.add_argument("name", help="benchmark name")
    add.add_argument("file", help="JSONL file of benchmark items, plain, gzip or zstd")
    add.add_argument("--text-field", default="text")
    add.set_defaults(run=audited(lazy("benchmarks", "cmd_benchmark_add"), name="benchmark name"))
    listing = actions.add_parser("list", help="per benchmark: active items, seqs, times (JSON)")
    listing.set_defaults(run=lazy("benchmarks", "cmd_benchmark_list"))
    remove = actions.add_parser("remove", help="withdraw a benchmark or some of its items")
    remove.add_argument("name", help="benchmark name")
    remove.add_argument(
        "--item", action="append", help="item id (NAME/ID or ID), repeatable; default: all"
    )
    remove.set_defaults(
        run=audited(
            lazy("benchmarks", "cmd_benchmark_remove"), name="benchmark name", item="--item"
        )
    )
    about = "a snapshot's excluded rows: source, object, line, reason (never their text), JSONL"
    p = sub.add_parser("excluded", help=about, description=about)
    p.add_argument("digest", help="snapshotId")
    p.add_argument("--source", help="only this source id")
    p.add_argument("--reason", help="only this reason code, or its prefix (e.g. quality)")
    p.set_defaults(run=lazy("benchmarks", "cmd_excluded"))


def add_selftest_command(sub: Any) -> None:
    about = "inject the seeds' faults end to end through the build job; print what happened"
    p = sub.add_parser("selftest", help=about, description=about)
    p.add_argument("--faults", action="store_true", required=True, help="run the fault cases")
    p.add_argument(
        "--catalog",
        help="a PostgreSQL server URL (postgresql+psycopg2://user@host:port/db): each case gets "
        "its own database there (the role needs CREATEDB); default: SQLite in each case's home",
    )
    p.add_argument("--only", help="run the cases whose name matches this regular expression")
    p.add_argument("--full", action="store_true", help="also the slow cases and full sweeps")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--keep", help="keep the case homes under this folder (default: removed)")
    p.set_defaults(run=lazy("selftest", "cmd_selftest"))
