"""``corpus-assets gc``: remove the CAS objects no retained snapshot, permit, quarantine record or
open build references (``core.release.gc`` says what is live and why the lock is enough)."""

import argparse
import json

from corpus_assets.cli_common import CliError, note
from corpus_assets.core.release.gc import GcError, collect, expire, plan
from corpus_assets.core.runtime.workspace import open_workspace


def cmd_gc(args: argparse.Namespace) -> int:
    ws = open_workspace()
    config = ws.config
    with ws.cas_lock(exclusive=True, on_wait=note):
        try:
            planned = plan(ws.cas, ws.catalog, config.alias, config.retention.keep_generations)
            if not args.dry_run:
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
