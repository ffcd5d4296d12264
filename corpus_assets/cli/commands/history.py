"""``corpus-assets history ALIAS``: the alias's gate and state audit trail as a table (or JSON).

Each row is one move of one of the alias's snapshots (``core.governance.history``): when, which
snapshot, from and to which state, who (approver, activating run, rollback user), the alias
generation once it committed, the fences the snapshot was built behind, and why.
"""

import argparse
import json
import time

from corpus_assets.cli.common import opened
from corpus_assets.core.governance.audit_fields import shown
from corpus_assets.core.governance.history import Move, alias_moves

COLUMNS = ("when (UTC)", "snapshot", "move", "actor", "gen", "tomb", "bench", "detail")


def cmd_history(args: argparse.Namespace) -> int:
    with opened() as home:
        moves = alias_moves(home.cas, home.catalog, args.alias)
    if args.json:
        print(json.dumps({"alias": args.alias, "moves": [m.as_json() for m in moves]}, indent=2))
        return 0
    if not moves:
        print(f"alias {args.alias}: no snapshot has been registered on it yet; nothing to show")
        return 0
    rows = [_cells(m) for m in moves]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS[:-1])]
    for row in [list(COLUMNS), *rows]:
        padded = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*padded, row[-1]]))
    return 0


def _cells(move: Move) -> list[str]:
    def fence(value: int | None) -> str:
        return "?" if value is None else str(value)

    cells = [
        time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(move.at)),
        move.snapshot_id,
        f"{move.from_state or '-'} -> {move.to_state}",
        move.actor,
        str(move.generation),
        fence(move.tombstone_watermark),
        fence(move.benchmark_fence),
        move.detail,
    ]
    return [shown(cell) for cell in cells]  # a row written unchecked stays one line
