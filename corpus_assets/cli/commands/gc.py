"""``corpus-assets gc`` and ``scrub``, the store's upkeep: gc removes the CAS objects no retained
snapshot, permit, quarantine record or open build references (``core.publication.gc`` says what is
live and why the lock is enough); scrub re-hashes everything the aliases can serve."""

import argparse
import json
from dataclasses import asdict

from corpus_assets.cli.common import CliError, opened
from corpus_assets.cli.observe import observed
from corpus_assets.core.publication.gc import GcError, collect, expire, plan
from corpus_assets.core.publication.scrub import scrub


def cmd_gc(args: argparse.Namespace) -> int:
    with opened(exclusive=True, config=True) as ws:
        config = ws.config
        try:
            planned = plan(ws.cas, ws.catalog, config.alias, config.retention.keep_generations)
            if not args.dry_run:
                with observed(ws, config.alias):  # expired: shown in the UI
                    expire(ws.catalog, planned)
        except GcError as error:
            raise CliError(str(error)) from None
        if not args.dry_run:
            collect(ws.cas, planned)
    report = planned.as_json() | {"dry_run": args.dry_run}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for digest, size in planned.garbage:
        print(f"{verb} {digest} {size}")
    for key, size in planned.foreign:
        print(f"left alone {key} {size} (not a CAS object)")
    if planned.foreign_count > len(planned.foreign):
        print(f"left alone {planned.foreign_count - len(planned.foreign)} more non-CAS entries")
    print(
        f"gc: {verb} {len(planned.garbage)} objects ({report['bytes']} bytes); kept "
        f"{planned.live} live objects of {len(planned.retained)} retained snapshots; "
        f"{'would expire' if args.dry_run else 'expired'} snapshots: "
        f"{', '.join(planned.dropped) or 'none'}"
    )
    return 0


def cmd_scrub(args: argparse.Namespace) -> int:
    """Exit 1 naming every damaged snapshot and object; 0 when all that can be served is whole."""
    with opened(writing=True, config=True) as ws:  # gc must not remove what is being read
        report = scrub(ws.cas, ws.catalog, args.alias)
    if args.json:
        print(json.dumps({"ok": report.ok, "snapshots": [asdict(s) for s in report.snapshots]}))
    else:
        for s in report.snapshots:
            verdict = "ok" if not s.findings else f"{len(s.findings)} problem(s)"
            print(f"{s.snapshot_id} {s.alias} {s.state}: {s.objects} objects, {verdict}")
            for finding in s.findings:
                print(f"  FAIL {finding}")
        print(f"scrub: {len(report.snapshots)} snapshots, {report.bytes_hashed} bytes re-hashed")
    damaged = [f"{s.snapshot_id}: {f}" for s in report.snapshots for f in s.findings]
    if damaged:
        raise CliError(f"{len(damaged)} problem(s) in served snapshots; first: {damaged[0]}")
    return 0
