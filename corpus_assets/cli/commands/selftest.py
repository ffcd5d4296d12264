"""``corpus-assets selftest --faults``: the seeds' faults injected through this installation.

The fault cases (``corpus_assets.selftest``) are a source checkout's, not the wheel's: the wheel
leaves the package out, and the command says so in one line."""

import argparse
import importlib.util
import re
import sys
import tempfile
from pathlib import Path

from corpus_assets.cli.common import CliError

NEEDS_CHECKOUT = (
    "selftest needs a source checkout of corpus-assets: the corpus_assets.selftest package "
    "is not installed with the wheel"
)


def cmd_selftest(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("corpus_assets.selftest") is None:
        raise CliError(NEEDS_CHECKOUT)
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
