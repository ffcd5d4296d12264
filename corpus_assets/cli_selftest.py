"""``corpus-assets selftest --faults``: the seeds' faults injected through this installation."""

import argparse
import re
import sys
import tempfile
from pathlib import Path
from typing import Any


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
    p.set_defaults(run=cmd_selftest)


def cmd_selftest(args: argparse.Namespace) -> int:
    from corpus_assets.selftest.cases import selected
    from corpus_assets.selftest.lab import Lab
    from corpus_assets.selftest.report import run_cases, table

    pattern = re.compile(args.only) if args.only else None
    cases = selected(full=args.full, pattern=pattern)
    if args.list:
        for case in cases:
            print(f"{case.name:<32} seed {case.seed}  {case.fault}")
        return 0
    if not cases:
        print(f"corpus-assets: error: no fault case matches {args.only!r}", file=sys.stderr)
        return 2
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="corpus-selftest-"))
    root.mkdir(parents=True, exist_ok=True)
    lab = Lab(root, args.catalog, full=args.full)
    try:
        results = run_cases(lab, cases)
    finally:
        lab.close(keep=bool(args.keep))
    print(table(results))
    failed = [r.case.name for r in results if not r.outcome.ok]
    print(f"{len(results) - len(failed)} of {len(results)} fault cases as the seeds expect")
    if failed:
        print(f"corpus-assets: error: mismatched: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
