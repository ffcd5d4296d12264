"""What the splits layer reports: per split its records, groups, components, source shares and
deviation from the target percent; the headline counts the manifest and the gate read."""

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.runtime.config import SplitPolicy
from corpus_assets.core.training_view.split_assign import Assignment
from corpus_assets.core.training_view.splits_schema import SPLITS


def split_report(
    table: pa.Table, clusters: pa.Table, policy: SplitPolicy, tokens: pa.Table
) -> list[dict[str, Any]]:
    """One row per split (a metadata table): records, tokens (the configured tokenizer's),
    groups, components, each source's share of the split's records in basis points and the
    deviation from the target. ``tokens`` has record_id and tokens of each member."""
    kept = clusters.filter(clusters["is_representative"]).select(["record_id", "source_id"])
    placed = table.join(kept, "record_id", join_type="inner")
    placed = placed.join(tokens.select(["record_id", "tokens"]), "record_id", join_type="inner")
    if placed.num_rows != table.num_rows:  # every member has one kept row and its tokens
        raise ValueError(f"{table.num_rows} split members but {placed.num_rows} with tokens")
    total = table.num_rows
    names = sorted(pc.unique(clusters["source_id"]).to_pylist())
    rows = []
    for name in SPLITS:
        own = placed.filter(pc.equal(placed["split"], name))
        n = own.num_rows
        row: dict[str, Any] = {
            "split": name,
            "records": n,
            "tokens": pc.sum(own["tokens"]).as_py() or 0,
            "groups": pc.count_distinct(own["group_id"]).as_py(),
            "components": pc.count_distinct(own["leakage_id"]).as_py(),
            "target_percent": getattr(policy, f"{name}_percent"),
            "deviation_bp": (n * 10000 // total if total else 0)
            - getattr(policy, f"{name}_percent") * 100,
        }
        per_source = own.group_by("source_id").aggregate([("record_id", "count")])
        counts = dict(
            zip(
                per_source["source_id"].to_pylist(),
                per_source["record_id_count"].to_pylist(),
                strict=True,
            )
        )
        row.update({f"share_bp.{s}": counts.get(s, 0) * 10000 // n if n else 0 for s in names})
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
