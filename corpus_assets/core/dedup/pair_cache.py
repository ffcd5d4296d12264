"""Verified pairs: the exact Jaccards one dedup run computed, reused by its child snapshot.

Verification is near-dedup's costly step (each candidate's text read and shingled, then an
exact Jaccard). A pair's Jaccard is a function of its two texts and the signature spec only, so
the layer stores every pair its scan verified as the ``pairs`` table (text digests ``a < b``,
``jaccard``, sorted). A child build whose parent snapshot ran the same dedup code and policy
looks its candidate pairs up in the parent's table first, and fingerprints and verifies only
the pairs not found there: pairs that involve a new or changed text, and the rare old pairs the
parent skipped or never had as candidates (a bucket head displaced by a removal).

Everything else is the full build's: banding over every record, the scan in total order and its
skips, so verdicts, clusters (a removed record leaves its cluster and the scan elects the next
representative), edges, report and ``pairs`` are byte-identical to a from-scratch build's.
"""

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from corpus_assets.core.dedup.order import sorted_hits
from corpus_assets.core.dedup.partition_db import SORT_LIMIT, PartitionDb
from corpus_assets.core.governance import states
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.snapshot_manifest import read_manifest
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import Ref
from corpus_assets.core.storage.cas_queries import cas_parquet, put_query

PAIR_COLUMNS = pa.schema([("a", pa.string()), ("b", pa.string()), ("jaccard", pa.float64())])
FULL, INCREMENTAL = "full", "incremental"


@dataclass(frozen=True)
class Mode:
    """Whether near-dedup reuses a parent's verified pairs, and why (or why not)."""

    mode: str
    reason: str
    pairs_sql: str | None = None  # the parent's pairs table, when incremental
    lengths: dict[str, str] = field(default_factory=dict)  # records digest -> its text lengths
    # the parent's chunks in row order (records digest, rows) and its clusters and decisions
    chunks: tuple[tuple[str, int], ...] = ()
    clusters: Ref | None = None
    decisions: Ref | None = None
    pairs: Ref | None = None  # the parent's pairs table (what ``pairs_sql`` reads)
    bands: dict[str, Ref] = field(default_factory=dict)  # class -> the parent's band index


def parent_mode(ws: Workspace, parents: list[str], code: str, policy: str | None) -> Mode:
    """Incremental when the parent snapshot's dedup ran this code and policy and stored its
    verified pairs; else full, saying why."""
    if not ws.config.policies.dedup.near.enabled:
        return Mode(FULL, "near-dedup is off")
    if not parents:
        return Mode(FULL, "no parent snapshot")
    parent = parents[0]
    manifest = read_manifest(
        ws.cas, states.get(ws.catalog, parent).manifest_digest, "parent manifest"
    )
    index = load_index(ws.cas, manifest.layers["dedup_clusters"], "dedup_clusters")
    if index.code != code:
        return Mode(FULL, f"parent {parent} ran other dedup code")
    if index.policy != policy:
        return Mode(FULL, f"parent {parent} ran another dedup policy")
    if "pairs" not in index.outputs:
        return Mode(FULL, f"parent {parent} stored no verified pairs")
    if not ws.cas.contains(index.output("pairs")["digest"]):  # collected: verified again
        return Mode(FULL, f"parent {parent}'s verified pairs are gone from the store")
    sql = cas_parquet(ws.cas, index.output("pairs"), "parent dedup pairs")
    listed = index.outputs.get("lengths", [])
    lengths = {c["records"]: c["lengths"]["digest"] for c in listed}
    chunks = tuple((c["records"], int(c["lengths"]["size"]) // 8) for c in listed)
    return Mode(
        INCREMENTAL,
        f"parent {parent}",
        sql,
        lengths,
        chunks,
        index.output("clusters"),
        index.outputs.get("decisions"),
        index.output("pairs"),
        {entry["class"]: entry["index"] for entry in index.outputs.get("bands", [])},
    )


FETCHED = "fetched_texts"  # (row, text_digest) of every row a lookup named, over the classes


class PairLookup:
    """The parent's verified pairs, looked up by the rank pairs of one class run. The text
    digests each lookup reads are kept in DuckDB (``FETCHED``): the rows a run verifies are
    among those its lookups named, so :func:`store_pairs` reads them from there instead of
    scanning every chunk file's digests again."""

    def __init__(self, db: PartitionDb, pairs_sql: str) -> None:
        self.db, self.pairs_sql = db, pairs_sql
        self.found = 0  # candidate pairs found in the parent's table, over every class
        db.con.execute(f"CREATE OR REPLACE TEMP TABLE {FETCHED} (row BIGINT, text_digest VARCHAR)")

    def known(self, order: np.ndarray, packed: np.ndarray) -> np.ndarray:
        """Jaccard per packed candidate pair ``x * n + y`` of the ranks of ``order`` (nan when
        the parent did not verify the pair). Only the ranks the pairs name are joined: a
        class's candidates name a fraction of its records, and a pair found needs both."""
        n = len(order)
        named = np.unique(np.concatenate(np.divmod(packed, n))) if n else packed
        rows = order[named].astype(np.int64)
        self.db.register("class_rows", pa.table({"rank": named.astype(np.int64), "row": rows}))
        try:
            self.db.con.execute(
                "CREATE OR REPLACE TEMP TABLE class_texts AS SELECT c.rank, c.row, "
                f"t.text_digest AS td FROM class_rows c JOIN {self.db.texts_of(rows)} t "
                f"ON t.row = c.row; INSERT INTO {FETCHED} SELECT row, td FROM class_texts"
            )
            table = self.db.con.sql(
                f"SELECT a.rank AS ra, b.rank AS rb, q.jaccard FROM {self.pairs_sql} q "
                "JOIN class_texts a ON q.a = a.td JOIN class_texts b ON q.b = b.td"
            ).to_arrow_table()
        finally:
            self.db.unregister("class_rows")
            self.db.con.execute("DROP TABLE IF EXISTS class_texts")
        ra, rb = table["ra"].to_numpy(), table["rb"].to_numpy()
        keys = np.maximum(ra, rb) * n + np.minimum(ra, rb)
        by_key = np.argsort(keys, kind="stable")
        keys, jaccards = keys[by_key], table["jaccard"].to_numpy()[by_key]
        out = np.full(len(packed), np.nan, dtype=np.float64)
        at, hit = sorted_hits(keys, packed)
        out[hit] = jaccards[at[hit]]
        self.found += int(hit.sum())
        return out


# The text digests of the rows the pairs name, gathered in one scan of the records (joining
# ``texts`` twice scanned every chunk file twice), or of the lookups' digests (``FETCHED``).
_PAIRS_SQL = """
WITH named AS MATERIALIZED (
  SELECT DISTINCT row, text_digest FROM {texts}
  WHERE row IN (SELECT x FROM verified UNION SELECT y FROM verified)
)
SELECT least(ta.text_digest, tb.text_digest) AS a,
  greatest(ta.text_digest, tb.text_digest) AS b, min(v.jaccard) AS jaccard
FROM verified v JOIN named ta ON ta.row = v.x JOIN named tb ON tb.row = v.y
GROUP BY ALL ORDER BY a, b
"""


def store_pairs(
    ws: Workspace, db: PartitionDb, x: np.ndarray, y: np.ndarray, jaccard: np.ndarray
) -> Ref:
    """The verified pairs (rows and Jaccards) as the ``pairs`` table: text digests, sorted;
    read from the lookups' digests when they hold every row the pairs name."""
    db.register("verified", pa.table({"x": x, "y": y, "jaccard": jaccard}))
    try:
        texts = FETCHED if _fetched_all(db) else "texts"
        sql = _PAIRS_SQL.replace("{texts}", texts)
        ref, _ = put_query(ws.cas, db.con, sql, PAIR_COLUMNS, SORT_LIMIT)
    finally:
        db.unregister("verified")
        db.con.execute(f"DROP TABLE IF EXISTS {FETCHED}")
    return ref


def _fetched_all(db: PartitionDb) -> bool:
    """Whether ``FETCHED`` exists and holds every row of ``verified``."""
    held = db.con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND temporary", [FETCHED]
    ).fetchall()[0][0]
    if not held:
        return False
    missing = db.con.execute(
        "SELECT count(*) FROM (SELECT x AS row FROM verified UNION SELECT y FROM verified) v "
        f"ANTI JOIN {FETCHED} f ON f.row = v.row"
    ).fetchall()[0][0]
    return not missing
