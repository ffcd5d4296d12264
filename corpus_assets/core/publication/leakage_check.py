"""The dedup and leakage invariants a snapshot must hold, checked on its published tables.

Kept apart from ``rules`` so that module reads as one function per rule; this is the one rule
that needs the leakage graph (the graph of ``training_view.leakage_graph``: records joined by a
shared group id, an exact or a verified near edge), recomputed here from the dedup layer's
clusters and edges, not taken from the splits layer's word. The joins run in DuckDB over four
relations - ``dd_clusters`` (with ``ord``, the row's place), ``dd_edges``, ``members`` and
``dd_dropped`` - and the components in numpy over integer vertex numbers (``min_labels``: no
scipy, whose ~0.2 CPU-s of imports the check would pay for a graph numpy labels in ~0.05), so
no record id is held in Python. ``dedup_invariants`` runs it on Arrow tables, the gate on the
Parquet files.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

# ``ok`` only answers IN: kept with its repeats (no distinct over every member id) and once
REMOVED = """
WITH ok AS MATERIALIZED (SELECT record_id FROM members UNION ALL SELECT record_id FROM dd_dropped),
checked AS (
    SELECT ord, record_id, representative_id, verdict, match_id, match_jaccard,
           NOT coalesce(representative_id IN (SELECT record_id FROM ok), false) AS rep_bad,
           verdict = 'near_duplicate' AND (
               NOT coalesce(match_id IN (SELECT record_id FROM ok), false)
               OR coalesce(match_jaccard < ?, true)) AS near_bad
    FROM dd_clusters WHERE verdict IN ('exact_duplicate', 'near_duplicate'))
SELECT record_id, representative_id, match_id, match_jaccard, rep_bad, near_bad,
       sum(rep_bad::INTEGER + near_bad::INTEGER) OVER () AS total
FROM checked WHERE rep_bad OR near_bad ORDER BY ord LIMIT ?
"""
LIVE = """
CREATE OR REPLACE TEMP TABLE dd_live AS
WITH dropped AS (
    SELECT record_id FROM dd_dropped
    UNION SELECT record_id FROM dd_clusters
    WHERE NOT is_representative AND representative_id IN (SELECT record_id FROM dd_dropped))
SELECT record_id, group_id, ord AS v
FROM dd_clusters
WHERE verdict <> 'excluded' AND record_id NOT IN (SELECT record_id FROM dropped)
"""
# each group of two records or more a number (any: a component's label is set by its lowest
# record vertex), no sort; a null group id is one group, as in a GROUP BY. A group of one record
# joins nothing: it is no vertex (at 1.1 GB of raw text every group was one record). The ids are
# grouped first by their 64-bit hashes (an integer aggregate): a group of two has a repeated
# hash, so only the ids behind repeated hashes are grouped by the id itself
GROUPS = """
WITH hashes AS (SELECT hash(group_id) AS h FROM dd_live GROUP BY h HAVING count(*) > 1),
numbered AS (SELECT group_id, row_number() OVER () - 1 AS g FROM
             (SELECT group_id FROM dd_live WHERE hash(group_id) IN (SELECT h FROM hashes)
              GROUP BY group_id HAVING count(*) > 1))
SELECT l.v, n.g FROM dd_live l JOIN numbered n ON l.group_id IS NOT DISTINCT FROM n.group_id
"""
# an edge joins the first live row of each of its record ids: the minimum taken per edge end
# (grouped on the edge's number) rather than per record id over every live row
EDGES = """
WITH e AS (SELECT row_number() OVER () AS i, record_a, record_b FROM dd_edges),
a AS (SELECT e.i, min(l.v) AS v FROM e JOIN dd_live l ON l.record_id = e.record_a GROUP BY e.i),
b AS (SELECT e.i, min(l.v) AS v FROM e JOIN dd_live l ON l.record_id = e.record_b GROUP BY e.i)
SELECT a.v AS a, b.v AS b FROM a JOIN b USING (i)
"""
# the components of members in more than one split, with their spread; only those are named
# (their smallest leakage id, read at their rows: no leakage id is carried for every live row).
# A vertex's record id is read at its clusters row (``ord``), the live row it numbers: joined
# with the clusters view, not with ``dd_live``, the query cost ~0.035 CPU-s less at 1.1 GB
SPREAD = """
WITH cm AS (SELECT k.record_id, c.component FROM dd_comp c JOIN dd_clusters k ON k.ord = c.v),
per AS (SELECT cm.component, m.split, count(*) AS n
        FROM cm JOIN members m USING (record_id) GROUP BY cm.component, m.split)
SELECT component, string_agg(split || ' (' || n || ')', ', ' ORDER BY split)
FROM per GROUP BY component HAVING count(*) > 1 ORDER BY component
"""
NAMES = """
SELECT c.component, min(k.leakage_id) FROM dd_comp c JOIN dd_clusters k ON k.ord = c.v
WHERE c.component IN (SELECT component FROM dd_wide) GROUP BY c.component
"""


def dedup_invariants(
    clusters: pa.Table,
    edges: pa.Table,
    threshold: float,
    members: pa.Table,
    quarantined: Collection[str] = (),
) -> tuple[list[str], int]:
    """The deletion scan's invariant and the leakage promise, checked on the published tables.

    Every removed record stands behind a member (or a ``quarantined`` record); a near
    duplicate's direct match is a member at or above the threshold; on the leakage graph
    without the quarantined records and the duplicates behind them, no component holds members
    of two splits. Returns the findings and how many of them are split leaks.
    """
    import duckdb

    with duckdb.connect() as con:
        rows = pa.array(np.arange(clusters.num_rows, dtype=np.int64))
        con.register("dd_clusters", clusters.append_column("ord", rows))
        con.register("dd_edges", edges)
        con.register("members", members.select(["record_id", "split"]))
        register_dropped(con, quarantined)
        removed, _count = removed_without_member(con, threshold, None)
        leaks = leaked_components(con)
    return removed + leaks, len(leaks)


def register_dropped(con: DuckDBPyConnection, dropped: Collection[str]) -> None:
    """The records a split conflict took out (quarantined or unlinked), as ``dd_dropped``."""
    con.register("dd_dropped", pa.table({"record_id": pa.array(list(dropped), pa.string())}))


def removed_without_member(
    con: DuckDBPyConnection, threshold: float, shown: int | None
) -> tuple[list[str], int]:
    """Removed records whose representative, or direct near match, is not a member: the first
    ``shown`` findings (all when None) in clusters order, and how many there are."""
    limit = shown if shown is not None else np.iinfo(np.int64).max
    found = con.execute(REMOVED, [threshold, limit]).fetchall()
    findings: list[str] = []
    for rid, rep, match, jaccard, rep_bad, near_bad, _total in found:
        if rep_bad:
            findings.append(f"removed record {rid!r} stands behind {rep!r}, which is no member")
        if near_bad:
            findings.append(
                f"near duplicate {rid!r}: direct match {match!r} at Jaccard "
                f"{jaccard} is not a member at or above {threshold}"
            )
    total = int(found[0][-1]) if found else 0
    return (findings if shown is None else findings[:shown]), total


def leaked_components(con: DuckDBPyConnection) -> list[str]:
    """Components of the leakage graph whose members sit in more than one split. A vertex is a
    live clusters row numbered by its place (``ord``), a component is labelled by its lowest
    vertex: the components come out in the order of their first row with no sort of the rows.
    Only rows joined to another (a shared group, an edge) are vertices, and only their
    components of two records or more are joined with the members: a row joined to none is a
    component of one record, which cannot leak. The live rows' table is dropped after: the
    gate's next eviction would write it to the spill directory (~0.07 CPU-s at 1.1 GB)."""
    try:
        return _leaked(con)
    finally:
        con.execute("DROP TABLE IF EXISTS dd_live")


def _leaked(con: DuckDBPyConnection) -> list[str]:
    """``leaked_components`` over ``dd_live``, made here."""
    con.execute(LIVE)
    found = con.execute(GROUPS).fetchnumpy()
    grouped, groups = (np.asarray(found[k], dtype=np.int64) for k in ("v", "g"))
    pairs = con.execute(EDGES).fetchnumpy()
    a, b = (np.asarray(pairs[k], dtype=np.int64) for k in ("a", "b"))
    ends = np.concatenate([grouped, a, b])
    n = int(ends.max()) + 1 if len(ends) else 0
    seen = np.zeros(n, dtype=bool)
    seen[ends] = True
    v = np.flatnonzero(seen)  # ascending, the first row's order: a mask, not np.unique's sort
    size = n + (int(groups.max()) + 1 if len(groups) else 0)
    labels = min_labels(size, np.concatenate([grouped, a]), np.concatenate([n + groups, b]))
    component = labels[v]
    shared = np.bincount(component)[component] > 1  # a lone record's component cannot leak
    con.register("dd_comp", pa.table({"v": v[shared], "component": component[shared]}))
    spread = con.execute(SPREAD).fetchall()
    if not spread:
        return []
    con.register("dd_wide", pa.table({"component": [c for c, _ in spread]}))
    names = dict(con.execute(NAMES).fetchall())
    return [f"leakage group {names[c]!r} spans splits {wide}" for c, wide in spread]


def min_labels(size: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per vertex 0..size-1 the lowest vertex of its component over the undirected edges (a, b).
    Hook and compress, all vectors: every root takes the lowest root across its edges, then
    each vertex jumps to its label's label until none moves; done when every edge's two ends
    share a label. A label never rises and stays in its vertex's component, so the one label
    left per component is its lowest vertex. The rounds are at most the graph's diameter and
    few on dedup graphs (a chain hooks in one round, its jumps collapse it in log steps)."""
    label = np.arange(size, dtype=np.int64)
    while True:
        la, lb = label[a], label[b]
        if np.array_equal(la, lb):
            return label
        low = np.minimum(la, lb)
        np.minimum.at(label, np.concatenate([la, lb]), np.concatenate([low, low]))
        while not np.array_equal(jumped := label[label], label):
            label = jumped
