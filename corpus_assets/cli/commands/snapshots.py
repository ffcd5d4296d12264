"""The commands on one snapshot's life: build (and the demo's whole path), verify, approve,
activate and rollback. ``corpus_assets.cli.parser`` names them; each is imported when it runs."""

import argparse
import os
import sys
from typing import Any

from corpus_assets.cli.common import CliError, cli_actor, opened
from corpus_assets.cli.observe import observed
from corpus_assets.cli.runs import activate_via_job, build
from corpus_assets.core.governance import states
from corpus_assets.core.publication.publish import approve, rollback
from corpus_assets.core.publication.validation import verify_snapshot
from corpus_assets.core.publication.verify import resolve
from corpus_assets.core.runtime.config import default_home
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.demo import write_demo


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
        f"also named by its parent snapshot (reused): {built['casReused']}"
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
    with opened(config=True) as ws, observed(ws, ws.config.alias):
        approve(ws, built["snapshotId"], by="demo")
    row = activate_via_job(built["snapshotId"])
    print(f"approved by demo; alias {row.alias} -> {row.active_snapshot}")
    print(f"snapshotId {built['snapshotId']}")
    print(f"alias {row.alias} generation {row.generation}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Every digest and the freeze's boundary rules (a late CDC event re-reads the change log,
    so it needs the config; without one verify says it could not look)."""
    with opened() as home:
        ws = home if isinstance(home, Workspace) else None
        report = verify_snapshot(home.cas, home.catalog, args.digest, ws)
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
    with (
        opened(config=True) as ws,
        observed(ws, resolve(ws.catalog, args.digest).alias),
    ):
        snapshot = approve(ws, args.digest, args.by)
    print(f"{snapshot.snapshot_id} APPROVED by {snapshot.approved_by}")
    return 0


def cmd_activate(args: argparse.Namespace) -> int:
    row = activate_via_job(args.digest)
    print(f"alias {row.alias} -> {row.active_snapshot} generation {row.generation}")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    actor = cli_actor()  # a refused login name is the first error, before any lookup
    with (
        opened() as home,
        observed(home, resolve(home.catalog, args.digest).alias),
    ):
        row = rollback(home.cas, home.catalog, args.digest, actor=actor)
    print(f"alias {row.alias} -> {row.active_snapshot} generation {row.generation} (rollback)")
    return 0
