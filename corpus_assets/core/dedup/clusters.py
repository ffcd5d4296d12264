"""One verdict per canonical record: exact dedup, then near-dedup, then leakage groups.

Verdicts: ``excluded`` (revoked by a tombstone, or a record id already used earlier in the
total order), ``exact_duplicate`` (its dedup key equals an earlier record's), ``near_duplicate``
(algorithm 18.1: it directly reaches the threshold with a *kept* record; ``match_id`` /
``match_jaccard`` are that evidence) or ``keep``. ``representative_id`` is the kept record that
stands for a removed one; ``leakage_id`` names the component over group ids, exact clusters and
verified near edges (its smallest group id). Everything per record is an Arrow or numpy vector;
Python loops run only over duplicates and edges.
"""

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.dedup.near_dedup import UnionFind
from corpus_assets.core.dedup.near_stage import NearStage
from corpus_assets.core.dedup.order import codes, first_in_order, total_order
from corpus_assets.core.dedup.report import NearReport

KEEP, EXACT, NEAR, EXCLUDED = "keep", "exact_duplicate", "near_duplicate", "excluded"
CLUSTER_COLUMNS = pa.schema(
    [
        ("record_id", pa.string()),
        ("source_id", pa.string()),
        ("object", pa.string()),
        ("line", pa.int64()),
        ("group_id", pa.string()),
        ("dedup_key", pa.string()),
        ("verdict", pa.string()),
        ("representative_id", pa.string()),
        ("is_representative", pa.bool_()),
        ("match_id", pa.string()),
        ("match_jaccard", pa.float64()),
        ("leakage_id", pa.string()),
        ("excluded", pa.string()),
    ]
)
EDGE_COLUMNS = pa.schema(
    [
        ("record_a", pa.string()),  # the later record in the total order
        ("record_b", pa.string()),
        ("kind", pa.string()),  # "exact" (same dedup key) or "near" (verified Jaccard)
        ("jaccard", pa.float64()),
    ]
)
# The columns of a canonical record that the dedup table carries over unchanged.
CARRIED = ["record_id", "source_id", "object", "line", "group_id", "dedup_key"]
_VERDICTS = pa.array([KEEP, EXACT, NEAR, EXCLUDED], pa.string())
_KEEP, _EXACT, _NEAR, _EXCLUDED = range(4)


@dataclass
class _Verdicts:
    """Per row: verdict code, direct match row (-1: none) and its Jaccard."""

    n: int
    verdict: np.ndarray = field(init=False)
    match: np.ndarray = field(init=False)
    jaccard: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.verdict = np.full(self.n, _KEEP, dtype=np.int8)
        self.match = np.full(self.n, -1, dtype=np.int64)
        self.jaccard = np.full(self.n, np.nan, dtype=np.float64)

    def representatives(self) -> np.ndarray:
        """The kept row each row stands behind (-1 for excluded); chains end at a keep."""
        final = np.where(self.verdict == _KEEP, np.arange(self.n), self.match)
        exact = np.flatnonzero(self.verdict == _EXACT)
        rep = self.match[exact]
        final[exact] = np.where(self.verdict[rep] == _NEAR, self.match[rep], rep)
        final[self.verdict == _EXCLUDED] = -1
        return final


class Clustered(NamedTuple):
    table: pa.Table  # one row per record, sorted by record_id, object, line
    report: NearReport | None
    edges: pa.Table  # every exact and verified near edge (EDGE_COLUMNS), sorted


def cluster(
    records: pa.Table,
    source_order: dict[str, int],
    revoked: dict[int, str] | None = None,
    near: NearStage | None = None,
) -> Clustered:
    """The dedup table, the near-dedup report and the edges that justify the leakage groups.

    ``records`` needs record_id, source_id, object, line, group_id, kind, dedup_key and length
    (or text) columns, in the row order the signatures of ``near`` were computed in.
    """
    order = total_order(records, source_order)
    state = _Verdicts(records.num_rows)
    excluded = _exclude_repeated_ids(records, order, dict(revoked or {}))
    if excluded:
        state.verdict[np.fromiter(excluded, dtype=np.int64, count=len(excluded))] = _EXCLUDED
    representatives, copies = _exact(records, order[state.verdict[order] == _KEEP], state)
    edges = list(zip(copies.tolist(), state.match[copies].tolist(), strict=True))
    near_edges: list[tuple[int, int, float]] = []
    report = None
    if near is not None:
        report = near.run(records, representatives)
        near_edges = near.edges
        edges += [(x, y) for x, y, _ in near_edges]
        for x, (y, j) in near.matches.items():
            state.verdict[x], state.match[x], state.jaccard[x] = _NEAR, y, j
    table = _table(records, state, _leakage_ids(records, edges), excluded)
    return Clustered(table, report, _edge_table(records, copies, state.match, near_edges))


def _edge_table(
    records: pa.Table, copies: np.ndarray, match: np.ndarray, near: list[tuple[int, int, float]]
) -> pa.Table:
    """Exact (copy -> its key's representative) and verified near edges, by record id."""
    near_rows = np.array([(x, y) for x, y, _ in near], dtype=np.int64).reshape(-1, 2)
    a = np.concatenate([copies, near_rows[:, 0]])
    b = np.concatenate([match[copies], near_rows[:, 1]])
    ids = records.column("record_id")
    table = pa.table(
        {
            "record_a": ids.take(pa.array(a)),
            "record_b": ids.take(pa.array(b)),
            "kind": pa.array(np.repeat(["exact", "near"], [len(copies), len(near)]), pa.string()),
            "jaccard": np.concatenate([np.ones(len(copies)), [j for _, _, j in near]]),
        }
    )
    keys = [("record_a", "ascending"), ("record_b", "ascending"), ("kind", "ascending")]
    return table.take(pc.sort_indices(table, sort_keys=keys)).cast(EDGE_COLUMNS).combine_chunks()


def _exclude_repeated_ids(
    records: pa.Table, order: np.ndarray, excluded: dict[int, str]
) -> dict[int, str]:
    """Add every row whose record id already appeared earlier in the order (ids are unique)."""
    id_codes, _ = codes(records.column("record_id"))
    first = first_in_order(id_codes[order])
    first_row_of = np.empty(int(id_codes.max(initial=-1)) + 1, dtype=np.int64)
    first_row_of[id_codes[order[first]]] = order[first]
    objects, lines = records.column("object"), records.column("line")
    for row in order[~first].tolist():
        at = int(first_row_of[id_codes[row]])
        excluded.setdefault(
            row, f"duplicate record_id (first at {objects[at].as_py()} line {lines[at].as_py()})"
        )
    return excluded


def _exact(
    records: pa.Table, eligible: np.ndarray, state: _Verdicts
) -> tuple[np.ndarray, np.ndarray]:
    """Mark later copies of a dedup key as exact duplicates; return the representatives (the
    only records near-dedup looks at) and the copies, both in total order."""
    key_codes, _ = codes(records.column("dedup_key"))
    first = first_in_order(key_codes[eligible])
    rep_of = np.empty(int(key_codes.max(initial=-1)) + 1, dtype=np.int64)
    rep_of[key_codes[eligible[first]]] = eligible[first]
    copies = eligible[~first]
    state.verdict[copies], state.match[copies] = _EXACT, rep_of[key_codes[copies]]
    state.jaccard[copies] = 1.0
    return eligible[first], copies


def _leakage_ids(records: pa.Table, edges: list[tuple[int, int]]) -> pa.Array:
    """Per row, the smallest group id of its component over groups and dedup edges."""
    group_codes, groups = codes(records.column("group_id"), ordered=True)
    leakage = UnionFind(len(groups))  # over group codes ordered by group id
    for x, y in edges:
        leakage.union(int(group_codes[x]), int(group_codes[y]))
    return groups.take(pa.array(leakage.roots()[group_codes]))


def _ids_at(ids: pa.ChunkedArray, rows: np.ndarray) -> pa.Array:
    """Record ids at ``rows``, "" where the row is -1."""
    taken = ids.take(pa.array(np.where(rows < 0, 0, rows), mask=rows < 0))
    return pc.fill_null(taken, "")


def _table(
    records: pa.Table, state: _Verdicts, leakage_ids: pa.Array, excluded: dict[int, str]
) -> pa.Table:
    reasons = [""] * records.num_rows
    for row, reason in excluded.items():
        reasons[row] = reason
    ids = records.column("record_id")
    table = pa.table(
        {
            **{c: records.column(c) for c in CARRIED},
            "verdict": _VERDICTS.take(pa.array(state.verdict)),
            "representative_id": _ids_at(ids, state.representatives()),
            "is_representative": pa.array(state.verdict == _KEEP),
            "match_id": _ids_at(ids, state.match),
            "match_jaccard": pa.array(state.jaccard, mask=state.match < 0),
            "leakage_id": leakage_ids,
            "excluded": pa.array(reasons, pa.string()),
        }
    )
    rows = pc.sort_indices(
        table,
        sort_keys=[("record_id", "ascending"), ("object", "ascending"), ("line", "ascending")],
    )
    return table.take(rows).cast(CLUSTER_COLUMNS).combine_chunks()
