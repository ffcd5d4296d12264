"""The dedup and leakage invariants a snapshot must hold, checked on its published tables.

Kept apart from ``gates`` so the gate reads as one function per rule; this is the one rule
that needs the leakage graph (``training_view.leakage_graph``), recomputed here from the dedup
layer's clusters and edges, not taken from the splits layer's word.
"""

from collections.abc import Collection

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.training_view.leakage_graph import (
    components,
    dropped_with_copies,
    straddling,
)


def dedup_invariants(
    clusters: pa.Table,
    edges: pa.Table,
    threshold: float,
    members: pa.Table,
    quarantined: Collection[str] = (),
) -> tuple[list[str], int]:
    """Algorithm 18.1's invariant and the leakage promise, checked on the published tables.

    Every removed record stands behind a member (or a ``quarantined`` record); a near
    duplicate's direct match is a member at or above the threshold; on the leakage graph
    without the quarantined records and the duplicates behind them, no component holds members
    of two splits. Returns the findings and how many of them are split leaks.
    """
    split_of = dict(
        zip(
            members.column("record_id").to_pylist(),
            members.column("split").to_pylist(),
            strict=True,
        )
    )
    findings = _removed_without_member(
        clusters, split_of | dict.fromkeys(quarantined, ""), threshold
    )
    leaks = _leaked_components(clusters, edges, members, quarantined)
    return findings + leaks, len(leaks)


def _removed_without_member(
    clusters: pa.Table, split_of: dict[str, str], threshold: float
) -> list[str]:
    """Removed records whose representative, or direct near match, is not a member."""
    findings = []
    removed = pc.is_in(clusters.column("verdict"), pa.array(["exact_duplicate", "near_duplicate"]))
    for row in clusters.filter(removed).to_pylist():
        rid, rep = row["record_id"], row["representative_id"]
        if rep not in split_of:
            findings.append(f"removed record {rid!r} stands behind {rep!r}, which is no member")
        if row["verdict"] == "near_duplicate" and (
            row["match_id"] not in split_of or row["match_jaccard"] < threshold
        ):
            findings.append(
                f"near duplicate {rid!r}: direct match {row['match_id']!r} at Jaccard "
                f"{row['match_jaccard']} is not a member at or above {threshold}"
            )
    return findings


def _leaked_components(
    clusters: pa.Table, edges: pa.Table, members: pa.Table, quarantined: Collection[str]
) -> list[str]:
    """Components of the leakage graph whose members sit in more than one split."""
    component_of = components(clusters, edges, dropped_with_copies(clusters, quarantined))
    wide = straddling(component_of, members.select(["record_id", "split"]))
    named = component_of.join(clusters.select(["record_id", "leakage_id"]), "record_id")
    findings = []
    for component in pc.unique(wide["component"]).to_pylist():
        rows = wide.filter(pc.equal(wide["component"], component))
        ids = named.filter(pc.equal(named["component"], component))["leakage_id"]
        spread = ", ".join(
            f"{s} ({n})"
            for s, n in zip(rows["split"].to_pylist(), rows["members"].to_pylist(), strict=True)
        )
        findings.append(f"leakage group {pc.min(ids).as_py()!r} spans splits {spread}")
    return findings
