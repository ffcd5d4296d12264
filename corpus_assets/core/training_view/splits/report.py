"""What the splits layer reports: per split its records, groups, components, source shares and
deviation from the target percent; the headline counts the manifest and the gate read."""

from typing import Any

import duckdb

from corpus_assets.core.runtime.config import SplitPolicy
from corpus_assets.core.training_view.splits.assign import Assignment
from corpus_assets.core.training_view.splits.schema import SPLITS

# split_rows carries each member's group, component and source, and its object and line: one
# join with the token counts (it was two more joins with the clusters table, a third of the
# report's time), grouped by split as it streams (no table of every member's join made first)
_PER_SPLIT = """
    SELECT s.split, count(*), COALESCE(sum(r.tokens), 0)
    FROM split_rows s JOIN row_tokens r ON {on} GROUP BY s.split
"""
# Each distinct count in a query of its own: two in one grouped query cost DuckDB twice their
# sum (0.24 CPU-s against 0.13 at 470k members). Over split_rows, not its join with the token
# counts: the same rows, as every member has exactly one (the check below; a token row's key is
# unique)
_DISTINCT = "SELECT split, count(DISTINCT {column}) FROM split_rows GROUP BY split"
_BY_KEYS = "s.record_id = r.record_id AND s.object = r.object AND s.line = r.line"
# the same rows when both are keyed by the clusters-table position (``load_position_tokens``)
_BY_POSITION = "s.pos = r.pos"


def split_report(
    con: duckdb.DuckDBPyConnection, clusters: str, policy: SplitPolicy, by_position: bool = False
) -> list[dict[str, Any]]:
    """One row per split (a metadata table): records, tokens (the configured tokenizer's),
    groups, components, each source's share of the split's records in basis points and the
    deviation from the target. ``con`` holds ``split_rows`` (record_id, group_id, leakage_id,
    split, source_id, object and line of every member) and ``row_tokens`` (record_id, object,
    line, tokens of every canonical row), or with ``by_position`` both keyed by ``pos`` (the
    clusters-table position) instead; ``clusters`` is the dedup table (its sources)."""
    on = _BY_POSITION if by_position else _BY_KEYS
    per_split = {row[0]: row[1:] for row in con.execute(_PER_SPLIT.format(on=on)).fetchall()}
    distinct = [
        dict(con.execute(_DISTINCT.format(column=column)).fetchall())
        for column in ("group_id", "leakage_id")
    ]
    con.execute("DROP TABLE row_tokens")
    total = con.execute("SELECT count(*) FROM split_rows").fetchone()[0]
    placed = sum(row[0] for row in per_split.values())
    if placed != total:  # every member has one kept row and its tokens
        raise ValueError(f"{total} split members but {placed} with tokens")
    names = [r[0] for r in con.execute(f"SELECT DISTINCT source_id FROM {clusters}").fetchall()]
    names = sorted(n for n in names if n is not None)
    per_source: dict[tuple[str, str], int] = {  # every member is placed: split_rows' counts
        (split, source): n
        for split, source, n in con.execute(
            "SELECT split, source_id, count(*) FROM split_rows GROUP BY split, source_id"
        ).fetchall()
    }
    rows = []
    for name in SPLITS:
        n, tokens = per_split.get(name, (0, 0))
        groups, components = (counts.get(name, 0) if n else 0 for counts in distinct)
        target = getattr(policy, f"{name}_percent")
        row: dict[str, Any] = {
            "split": name,
            "records": n,
            "tokens": int(tokens),
            "groups": groups,
            "components": components,
            "target_percent": target,
            "deviation_bp": (n * 10000 // total if total else 0) - target * 100,
        }
        row.update(
            {f"share_bp.{s}": per_source.get((name, s), 0) * 10000 // n if n else 0 for s in names}
        )
        rows.append(row)
    return rows


def split_counts(report: list[dict[str, Any]], result: Assignment) -> dict[str, int]:
    """Records and components per split, deviations in basis points, moves (to a split),
    exclusions (quarantined or in the time gap), conflicts and the evaluation version."""
    counts: dict[str, int] = {}
    for row in report:
        name = row["split"]
        counts[name] = row["records"]
        counts[f"{name}_tokens"] = row["tokens"]
        counts[f"{name}_components"] = row["components"]
        counts[f"{name}_deviation_bp"] = row["deviation_bp"]
    counts["records"] = sum(row["records"] for row in report)
    excluded, unlinked = len(result.excluded), len(result.unlinked)
    counts["moves"] = result.moves.num_rows - excluded - unlinked
    counts["excluded"] = excluded
    counts["unlinked"] = unlinked
    counts["conflicts"] = len(result.conflicts)
    counts["eval_version"] = result.eval_version
    return counts
