"""Where the held-out search's members are: their global canonical rows, ids and splits.

The search works on global rows (``HeldoutScan``); the members' record ids and splits stay in
DuckDB (``ho_members``) and are looked up only for the rows a pair names. The rows come from
the dedup layer's decisions table (per global row, its clusters-table position: an integer
join; the record ids are joined by that position only for the rows looked up) or, without one,
from a join on (record id, object, line) against every records table.
"""

from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.dedup.dedup_clusters import CODE as DEDUP_CODE
from corpus_assets.core.dedup.heldout_search import HeldoutPairs
from corpus_assets.core.runtime.layer_index import LayerIndex
from corpus_assets.core.storage.cas import CasError
from corpus_assets.core.storage.cas_queries import VerifiedFiles, registered, tightened
from corpus_assets.core.training_view.splits.heldout_known import distinct_rows
from corpus_assets.core.training_view.splits.heldout_tasks import RowDigests
from corpus_assets.core.training_view.view_queries import SORT_LIMIT

PAIR_COLUMNS = pa.schema(
    [
        ("record_a", pa.string()),
        ("split_a", pa.string()),
        ("record_b", pa.string()),
        ("split_b", pa.string()),
        ("jaccard", pa.float64()),
    ]
)
POSITIONS = """
WITH pos AS (
    SELECT r.record_id, r.object, r.line, f.start + r.file_row_number AS row
    FROM read_parquet({paths}, filename = true, file_row_number = true) r
    JOIN ho_files f USING (filename))
SELECT p.row, m.record_id, m.split FROM ({members}) m
JOIN pos p ON m.record_id = p.record_id AND m.object = p.object AND m.line = p.line
"""
# The same rows by the dedup layer's decisions table (per global row, its clusters position
# ``pos`` and its representative's global row ``rep``, null for an excluded row): integer joins
# only, from each representative's split by clusters position (``Represented``). A join of
# every clusters row on its representative's id cost the layer ~0.3 CPU-s more at 1.1 GB.
# Neither sorts: its readers order by row themselves (sorting every member was wasted). Each
# row keeps its own clusters position, not its record id: the ids are joined only for the rows
# a pair names (``BY_POSITION``; every row's id copied into ``ho_members`` was ~0.1 CPU-s).
BY_REPRESENTATIVE = """
WITH d AS (
    SELECT file_row_number AS row, rep, pos FROM read_parquet({path}, file_row_number = true))
SELECT d.row, d.pos, s.split FROM d
JOIN d r ON d.rep = r.row
JOIN ({splits}) s ON s.pos = r.pos
"""
BY_POSITION = """
(SELECT m.row, k.record_id, m.split FROM {members} m
 JOIN (SELECT file_row_number AS pos, record_id FROM {clusters}) k ON k.pos = m.pos)
"""
EMPTY_ROWS = np.empty(0, dtype=np.int64)


def row_order(files: VerifiedFiles, dedup: LayerIndex, total: int) -> str | None:
    """The path of the dedup layer's decisions table (per global canonical row, its position
    ``pos`` in the clusters table) when the current dedup code stored one for these rows: the
    members' rows are then an integer join on the clusters table's row number. None (join on
    record id, object and line) otherwise."""
    if dedup.code != DEDUP_CODE or "decisions" not in dedup.outputs:
        return None
    try:
        path = files.path(dedup.output("decisions")["digest"], "dedup decisions")
    except CasError:
        return None
    return path if pq.ParquetFile(path).metadata.num_rows == total else None


@dataclass(frozen=True)
class Members:
    """The searched members by global row; their ids and splits in ``con``'s ``ho_members``
    (None without chunks), looked up only for the rows asked for."""

    rows: np.ndarray  # ascending global rows
    held: np.ndarray  # per ``rows[i]``: held out (not in train)
    con: duckdb.DuckDBPyConnection | None
    digests: RowDigests  # per global row, read when taken
    single: bool = False  # whether ``con`` lists every row once (no forged duplicate)
    # the relation (row, record_id, split) lookups read: ``ho_members``, or its rows' ids
    # joined by clusters position (``Represented.named``)
    named_rows: str = "ho_members"

    def named(self, changed: pa.Array) -> np.ndarray:
        """The ascending rows of the members whose record id is in ``changed``."""
        if self.con is None:
            return EMPTY_ROWS
        ids = pa.table({"record_id": pa.array(changed, pa.string())})
        with registered(self.con, "ho_changed", ids):
            found = self.con.sql(
                f"SELECT row FROM {self.named_rows} WHERE record_id IN "
                "(SELECT record_id FROM ho_changed) ORDER BY row"
            ).fetchnumpy()
        return np.asarray(found["row"], dtype=np.int64)

    def pairs(self, found: HeldoutPairs) -> pa.Table:
        """The found pairs as ``PAIR_COLUMNS`` rows, in the search's (a, b) order."""
        k = len(found.a)
        if self.con is None or not k:
            return PAIR_COLUMNS.empty_table()
        a, b = found.a.astype(np.int64), found.b.astype(np.int64)
        rows, at_a, at_b = distinct_rows(a, b)  # each row named once, ascending
        # one thread under the sort cap: at 1.1 GB the pairs name ~650k rows, and this join,
        # window and sort on the connection's full cap was the gate's peak; each row's member
        # is read and sorted once, then taken for the pairs naming it (a join and sort of both
        # sides of every pair took ~7x the query's CPU at 1.1 GB)
        # one member per row: a forged members table may list a record twice (the
        # record_ids_unique rule names it), which must not stop this rule; only the rows
        # wanted are numbered (the window was over every member), and only when some row is
        # listed twice
        once = (
            ""
            if self.single
            else "QUALIFY row_number() OVER (PARTITION BY row ORDER BY record_id, split) = 1"
        )
        wanted_rows = pa.table({"row": rows})
        with registered(self.con, "ho_wanted", wanted_rows), tightened(self.con, SORT_LIMIT):
            got = self.con.sql(
                f"SELECT row, record_id, split FROM {self.named_rows} "
                f"WHERE row IN (SELECT row FROM ho_wanted) {once} ORDER BY row"
            ).to_arrow_table()
        del wanted_rows
        if got.num_rows != len(rows):
            named = np.asarray(got["row"], dtype=np.int64)
            missing = int(np.isin(np.concatenate([a, b]), named, invert=True).sum())
            raise ValueError(f"held-out pairs name {missing} row(s) no member has")
        ids, splits = got["record_id"], got["split"]
        del got
        return pa.table(
            {
                "record_a": ids.take(pa.array(at_a)).combine_chunks(),
                "split_a": splits.take(pa.array(at_a)).combine_chunks(),
                "record_b": ids.take(pa.array(at_b)).combine_chunks(),
                "split_b": splits.take(pa.array(at_b)).combine_chunks(),
                "jaccard": pa.array(found.jaccard, pa.float64()),
            },
            schema=PAIR_COLUMNS,
        )

    def close(self) -> None:
        if self.con is not None:
            self.con.unregister("ho_members")  # Arrow rows (``Represented.positions``)
            self.con.execute("DROP TABLE IF EXISTS ho_members")


def searched_records(clusters: str, splits: str) -> str:
    """Every record of the dedup table but the excluded, with the split of the member standing
    for it (itself, or a removed duplicate's representative): a removed copy's content is in
    that split, as in the leakage graph. Records whose member is gone (quarantined) drop out."""
    return (
        f"SELECT k.record_id, k.object, k.line, k.leakage_id, s.split FROM {clusters} k "
        f"JOIN {splits} s ON s.record_id = CASE WHEN k.is_representative THEN k.record_id "
        "ELSE k.representative_id END WHERE k.verdict <> 'excluded'"
    )


@dataclass(frozen=True)
class Represented:
    """The searched records given by the dedup ``clusters`` table (read with
    ``file_row_number``) and ``splits``, its members' record_id and split (and their clusters
    position ``pos``, when it has one): with the dedup decisions table each global row's split
    is its representative's, found by integer joins (``BY_REPRESENTATIVE``); without,
    ``searched_records`` is joined on (record id, object, line)."""

    clusters: str
    splits: str

    def query(self, con: duckdb.DuckDBPyConnection, decisions: str) -> str:
        """row, pos (its clusters position), split of every searched row (``decisions``: the
        table's path); ``named`` gives their record ids."""
        if "pos" in con.sql(f"FROM {self.splits} LIMIT 0").columns:
            splits = f"SELECT pos, split FROM {self.splits}"
        else:
            splits = (
                f"SELECT k.file_row_number AS pos, s.split FROM {self.clusters} k "
                f"JOIN {self.splits} s ON s.record_id = k.record_id WHERE k.is_representative"
            )
        return BY_REPRESENTATIVE.format(path=decisions, splits=splits, clusters=self.clusters)

    def positions(self, con: duckdb.DuckDBPyConnection, decisions: str) -> pa.Table | None:
        """``query``'s rows (row, pos, split: dictionary-encoded, a byte a row) in row order,
        joined in numpy over the decisions table's rep and pos columns and the splits' (pos,
        split) rows: DuckDB's two joins of every row were ~0.3 CPU-s of a 1.1 GB child. None
        (``query`` then) when the splits have no pos, or a null or repeated one, or a null
        split."""
        if "pos" not in con.sql(f"FROM {self.splits} LIMIT 0").columns:
            return None
        splits = con.sql(f"SELECT pos, split FROM {self.splits}").to_arrow_table()
        kept = np.asarray(splits["pos"].to_numpy(zero_copy_only=False))
        if splits["pos"].null_count or splits["split"].null_count or kept.min(initial=0) < 0:
            return None
        where = np.full(int(kept.max(initial=-1)) + 1, -1, dtype=np.int64)
        where[kept] = np.arange(len(kept))
        if np.count_nonzero(where >= 0) != len(kept):  # a position twice
            return None
        decided = pq.read_table(decisions, columns=["rep", "pos"])
        if decided["pos"].null_count:
            return None
        pos = np.asarray(decided["pos"].to_numpy(), dtype=np.int64)
        at = np.array(pc.fill_null(decided["rep"], -1).to_numpy(), dtype=np.int64)  # a copy
        del decided
        ok = (at >= 0) & (at < len(pos))
        at[ok] = pos[at[ok]]  # each row's representative's clusters position
        at[~ok] = -1
        ok = (at >= 0) & (at < len(where))
        at[ok] = where[at[ok]]  # its row of ``splits``
        at[~ok] = -1
        rows = np.flatnonzero(at >= 0)
        names = pc.dictionary_encode(splits["split"]).combine_chunks()  # a byte per row
        codes = names.indices.take(pa.array(at[rows])).cast(pa.int8())
        split = pa.DictionaryArray.from_arrays(codes, names.dictionary)  # VARCHAR in SQL
        return pa.table({"row": rows.astype(np.int64), "pos": pos[rows], "split": split})

    def named(self, members: str) -> str:
        """row, record_id, split of ``members`` (a table of ``query``'s rows), as a subquery."""
        return BY_POSITION.format(members=members, clusters=self.clusters)

    def records(self) -> str:
        return searched_records(self.clusters, self.splits)
