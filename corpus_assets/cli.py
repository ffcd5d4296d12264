"""``corpus-assets``: build, verify, approve, activate and inspect snapshots without the UI.

Builds and activations run the same Dagster jobs the UI and sensors run, on the instance in
``DAGSTER_HOME`` (default ``./.dagster``), so every CLI run shows up in ``dagster dev`` afterwards.
"""

import argparse
import os
import sys
import warnings
from pathlib import Path
from typing import Any, TypeAlias

from sqlalchemy.exc import OperationalError

from corpus_assets import cli_interrupt
from corpus_assets.cli_benchmarks import add_commands, with_add
from corpus_assets.cli_catalog import (
    CliError,
    audited,
    cli_actor,
    cmd_dedup,
    cmd_diff,
    cmd_export,
    cmd_prov,
    cmd_read,
    cmd_show,
    cmd_tokenizer_train,
    cmd_tombstone_add,
    cmd_tombstone_hits,
    storage,
)
from corpus_assets.cli_gc import add_gc_command
from corpus_assets.cli_history import add_history_command
from corpus_assets.cli_lineage import add_lineage_command
from corpus_assets.cli_partitions import cmd_partition_delete, cmd_partition_list
from corpus_assets.cli_runs import activate_via_job, build, dagster_instance
from corpus_assets.cli_selftest import add_selftest_command
from corpus_assets.cli_status import cmd_status
from corpus_assets.cli_trust import add_trust_command
from corpus_assets.core.governance import gate, states
from corpus_assets.core.governance.audit_fields import AuditFieldError
from corpus_assets.core.ingest.pinning import PinError
from corpus_assets.core.ingest.sources import SourceError
from corpus_assets.core.release.export_run import FORMATS, ExportError
from corpus_assets.core.release.manifest import BuildConflict
from corpus_assets.core.release.publish import PublishError, approve, rollback
from corpus_assets.core.release.signing import SignatureError
from corpus_assets.core.release.training import TrainingError
from corpus_assets.core.release.trust_root import TrustRootError
from corpus_assets.core.release.validation import verify_snapshot
from corpus_assets.core.runtime.config import ConfigError, config_path, default_home
from corpus_assets.core.runtime.keys import (
    PartitionKeyError,
)
from corpus_assets.core.runtime.workspace import open_home, open_workspace
from corpus_assets.core.storage.cas import CasError
from corpus_assets.core.storage.catalog import LayerConflict
from corpus_assets.core.storage.url_secrets import masked
from corpus_assets.core.tokens.spec import TokenizerError
from corpus_assets.demo import write_demo

EXPECTED_ERRORS = (
    TrainingError,
    CliError,
    ConfigError,
    CasError,
    states.StateError,
    gate.GateError,
    PublishError,
    PartitionKeyError,
    SourceError,
    LayerConflict,
    BuildConflict,
    PinError,
    SignatureError,
    TrustRootError,
    TokenizerError,
    ExportError,
    AuditFieldError,
)
EXIT_USAGE = 2  # argparse's code for a command line that cannot run


def main(argv: list[str] | None = None) -> int:
    """Run one command; expected errors become one ``corpus-assets: error:`` line and exit 1
    (a command line naming a missing ``--config`` exits 2, as argparse's usage errors do).
    Every line is masked (``url_secrets``): no password in a URL reaches the terminal."""
    # Dagster's own beta/preview notices are for framework users, not for this command's users.
    warnings.filterwarnings("ignore", module="dagster")
    args = _parser().parse_args(with_add(sys.argv[1:] if argv is None else argv))
    if args.config:
        config = Path(args.config).resolve()
        if not config.is_file():
            what = "is not a file" if config.exists() else "not found"
            return _error(f"--config {config}: {what}", EXIT_USAGE)
        os.environ["CORPUS_CONFIG"] = str(config)
    try:
        return args.run(args)
    except EXPECTED_ERRORS as error:
        return _error(str(error))
    except OperationalError as error:  # the catalog database: unreachable, refusing, read-only
        reason = str(error.orig).strip().splitlines()[0] if error.orig else type(error).__name__
        return _error(f"catalog database: {reason}")


def _error(text: str, code: int = 1) -> int:
    print(f"corpus-assets: error: {masked(text)}", file=sys.stderr)
    return code


def _parser() -> argparse.ArgumentParser:
    """The command line, one group of subcommands per concern, in the order ``--help`` lists."""
    parser = argparse.ArgumentParser(prog="corpus-assets", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        help="corpus.yaml (default: $CORPUS_CONFIG or "
        "$CORPUS_HOME/corpus.yaml; CORPUS_HOME defaults to ./.corpus)",
    )
    sub = parser.add_subparsers(required=True, metavar="COMMAND")
    _build_commands(sub)
    _publication_commands(sub)
    _inspection_commands(sub)
    _governance_commands(sub)
    add_gc_command(sub)
    add_trust_command(sub)
    _tokenizer_commands(sub)
    run_fields = {"run_id": "--run-id", "purpose": "--purpose"}
    p = _command(
        sub,
        "read",
        audited(cmd_read, **run_fields),
        "training entry: take a permit for a digest and read it, verified",
    )
    p.add_argument("digest", help="a snapshotId (an alias is never accepted)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--purpose", required=True)
    p = _command(
        sub,
        "export",
        audited(cmd_export, **run_fields),
        "training read into Megatron .bin/.idx, MDS files or Croissant metadata, verified",
    )
    p.add_argument("format", choices=FORMATS)
    p.add_argument("digest", help="a snapshotId (an alias is never accepted)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--purpose", required=True)
    p.add_argument("--out", required=True, help="directory to write the files into")
    return parser


Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _command(sub: Subcommands, name: str, run: Any, help_text: str) -> argparse.ArgumentParser:
    """A subcommand whose help and description are the same line, dispatching to ``run``."""
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.set_defaults(run=run)
    return p


def _build_commands(sub: Subcommands) -> None:
    _command(
        sub,
        "demo",
        cmd_demo,
        "write the demo sources + corpus.yaml, build, validate, approve, "
        "activate, and print the snapshotId and alias generation",
    )
    p = _command(sub, "build", cmd_build, "freeze a partition and materialize all seven layers")
    p.add_argument("--partition", help="partition key to (re)build; default: a new key")
    p.add_argument(
        "--resume-only",
        action="store_true",
        help="only resume interrupted downloads; refuse to start any from scratch",
    )
    p = _command(sub, "verify", cmd_verify, "recompute and check every digest of a snapshot")
    p.add_argument("digest")
    p = sub.add_parser("partition", help="list the snapshot partitions, or delete one")
    actions = p.add_subparsers(required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="Dagster's partitions with their catalog state")
    listing.set_defaults(run=cmd_partition_list, instance=dagster_instance)
    delete = actions.add_parser("delete", help="delete one from the Dagster instance (not data)")
    delete.add_argument("key", help="the partition key, exactly as listed (quote it)")
    delete.add_argument("--force", action="store_true", help="even if the catalog froze it")
    delete.set_defaults(run=cmd_partition_delete, instance=dagster_instance)


def _publication_commands(sub: Subcommands) -> None:
    approve_cmd = audited(cmd_approve, by="--by")
    p = _command(sub, "approve", approve_cmd, "approve a VALIDATED snapshot (bound to its digest)")
    p.add_argument("digest")
    p.add_argument("--by", required=True, help="who approves")
    p = _command(sub, "activate", cmd_activate, "activate an APPROVED snapshot on its alias now")
    p.add_argument("digest")


def _inspection_commands(sub: Subcommands) -> None:
    p = _command(sub, "status", cmd_status, "snapshots, states, aliases and generations")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = _command(sub, "show", cmd_show, "print a snapshot's manifest JSON")
    p.add_argument("digest")
    p = _command(sub, "diff", cmd_diff, "shadow diff of a snapshot against its alias's active one")
    p.add_argument("digest")
    p = _command(sub, "prov", cmd_prov, "W3C PROV-JSON of how a snapshot was produced")
    p.add_argument("digest")
    add_lineage_command(sub)  # the graph, --record, --shard/--block
    p = _command(
        sub,
        "dedup",
        cmd_dedup,
        "why a record was kept or removed: verdict, direct match and Jaccard, its cluster, "
        "and its leakage group with splits",
    )
    p.add_argument("digest", help="snapshotId")
    p.add_argument("record_id")


def _governance_commands(sub: Subcommands) -> None:
    p = _command(
        sub, "rollback", cmd_rollback, "point the alias back at an earlier active snapshot"
    )
    p.add_argument("digest")
    add_history_command(sub)
    p = _command(
        sub, "tombstone", cmd_tombstone_hits, "revoke data, or show where a tombstone hits"
    )
    tomb = p.add_subparsers(required=True, metavar="ACTION")
    add = tomb.add_parser("add", help="revoke a record, source object or group; fences all aliases")
    target = add.add_mutually_exclusive_group(required=True)
    target.add_argument("--record", help="record id, e.g. essays/e0001")
    target.add_argument("--object", help="raw object digest sha256:...")
    target.add_argument("--group", help="group id")
    add.add_argument("--reason", required=True)
    tomb_fields = {"record": "--record", "object": "--object", "group": "--group"}
    add.set_defaults(run=audited(cmd_tombstone_add, reason="--reason", **tomb_fields))
    show_hits = tomb.add_parser("hits", help="deletion lineage: snapshots, members, spans, runs")
    show_hits.add_argument("seq", type=int)
    add_commands(sub)  # benchmark add|list|remove, excluded
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
    train.set_defaults(run=cmd_tokenizer_train)


# commands --------------------------------------------------------------------------------------
def _print_build(built: dict[str, Any]) -> None:
    print(f"partition {built['partition']}: 7 layers materialized in {built['seconds']} s")
    for layer, digest in built["layers"].items():
        print(f"  {layer:<18} {digest}")
    dedup = built["dedup"]
    print(
        f"dedup: {dedup['exact_duplicates']} exact and {dedup['near_duplicates']} near "
        f"duplicates removed from {dedup['records']} records "
        "(`corpus-assets dedup SNAPSHOT RECORD_ID` explains one)"
    )
    conflicts, repeats = dedup.get("id_conflicts", 0), dedup.get("duplicate_ids", 0)
    if conflicts or repeats:
        print(
            f"record ids: {conflicts} record{'s' * (conflicts != 1)} quarantined as id.conflict "
            f"(an earlier row has the id and another text), {repeats} exact repeat"
            f"{'s' * (repeats != 1)} of an earlier row excluded"
        )
    _print_contamination(built["contamination"])
    print(
        f"CAS objects in this snapshot: {built['casObjects']}, "
        f"already present before this build (reused): {built['casReused']}"
    )
    print(f"snapshotId {built['snapshotId']} state {built['state']}")


def _print_contamination(report: dict[str, Any]) -> None:
    """One line per registered benchmark: what was checked, how, and what it excluded."""
    flagged: dict[str, int] = {}
    for row in report["flagged"]:
        flagged[row["benchmark"]] = flagged.get(row["benchmark"], 0) + row["records"]
    for b in report["benchmarks"]:
        print(
            f"contamination ({report['policy']}) {b['benchmark']}: {b['items']} items, "
            f"{b['short_items']} shorter than the n-gram ({b['checked_whole']} checked whole, "
            f"{b['unchecked']} unchecked); {flagged.get(b['benchmark'], 0)} records excluded"
        )


def cmd_build(args: argparse.Namespace) -> int:
    if args.resume_only:
        os.environ["CORPUS_RESUME_ONLY"] = "1"
    built = build(args.partition)
    _print_build(built)
    return 0


def cmd_demo(_args: argparse.Namespace) -> int:
    """The whole path once: build, validate, approve and activate, as a user would."""
    home = default_home()
    config = write_demo(home)
    os.environ.setdefault("CORPUS_CONFIG", str(config))
    print(f"demo sources and config under {home}")
    built = build(None)
    _print_build(built)
    if built["state"] != states.VALIDATED:
        raise CliError(f"snapshot {built['snapshotId']} did not validate")
    with open_workspace() as ws:
        approve(ws, built["snapshotId"], by="demo")
    row = activate_via_job(built["snapshotId"])
    print(f"approved by demo; alias {row.alias} -> {row.active_snapshot}")
    print(f"snapshotId {built['snapshotId']}")
    print(f"alias {row.alias} generation {row.generation}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Every digest and the freeze's boundary rules (a late CDC event re-reads the change log,
    so it needs the config; without one verify says it could not look)."""
    if config_path().is_file():
        with open_workspace() as ws:
            report = verify_snapshot(ws.cas, ws.catalog, args.digest, ws)
    else:
        _home, cas, catalog = open_home()
        report = verify_snapshot(cas, catalog, args.digest, None)
    for finding in report.findings:
        print(f"FAIL {finding}", file=sys.stderr)
    if not report.ok:
        print(
            f"corpus-assets: error: verify failed for {report.snapshot_id}: "
            f"{len(report.findings)} problem(s)",
            file=sys.stderr,
        )
        return 1
    print(
        f"OK {report.snapshot_id}: {report.objects_checked} objects, "
        f"{report.bytes_checked} bytes re-hashed"
    )
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    """Every validity rule needs the config (the canary re-parses its sources), not just a home."""
    with open_workspace() as ws:
        snapshot = approve(ws, args.digest, args.by)
    print(f"{snapshot.snapshot_id} APPROVED by {snapshot.approved_by}")
    return 0


def cmd_activate(args: argparse.Namespace) -> int:
    row = activate_via_job(args.digest)
    print(f"alias {row.alias} -> {row.active_snapshot} generation {row.generation}")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    _home, cas, catalog = storage()
    row = rollback(cas, catalog, args.digest, actor=cli_actor())
    print(f"alias {row.alias} -> {row.active_snapshot} generation {row.generation} (rollback)")
    return 0


def run() -> None:
    """The console script: ``main``, then exit without interpreter finalisation.

    With pyarrow and DuckDB loaded, tearing down their C++ thread pools at interpreter exit
    sometimes aborts the finished process ("terminate called without an active exception",
    exit -6; apache/arrow#34314), after its output was written. Every store and catalog write is
    committed by then, so the process flushes its streams and leaves with its own exit code.
    """
    cli_interrupt.install()
    sys.excepthook = _masked_traceback
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _masked_traceback(kind: type[BaseException], error: BaseException, tb: Any) -> None:
    """An unexpected error still shows its traceback (it is a bug to report), masked."""
    import traceback

    sys.stderr.write(masked("".join(traceback.format_exception(kind, error, tb))))


if __name__ == "__main__":
    run()
