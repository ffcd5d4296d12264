"""The held-out search bounded to changed records, without finding every member's row.

A pair the narrowed search wants has a changed record (held out, or a member beside a held-out
one). So the changed records' rows are searched against every canonical row, and only the rows
their candidates name are looked up: whether each is a member and held out. Both lookups are
joins on (record id, object, line) of the searched records against the records tables (the
gate's own join: it takes no build's decisions table on trust), the first over the changed
records only, the second over the few rows read from their chunk tables - not a join of every
member with every records table. The pairs are those ``HeldoutScan.pairs(changed=)`` finds:
the changed held-out records against the members, every held-out record against the changed
members.
"""

from functools import partial
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from corpus_assets.core.dedup.fingerprint_store import TextLookup
from corpus_assets.core.dedup.heldout_search import (
    EMPTY,
    likely_pairs,
    side_candidates,
    verified_pairs,
)
from corpus_assets.core.storage.cas_queries import registered, sql_list
from corpus_assets.core.training_view.splits.heldout_known import known_jaccards
from corpus_assets.core.training_view.splits.heldout_rows import Members
from corpus_assets.core.training_view.splits.heldout_tasks import RowDigests, fingerprint_rows
from corpus_assets.core.training_view.splits.schema import TRAIN

if TYPE_CHECKING:
    from corpus_assets.core.training_view.splits.heldout import HeldoutScan, Reuse

KEYS = ("record_id", "object", "line")
# the changed records' rows: the hash table holds the changed records only
CHANGED_ROWS = """
SELECT f.start + r.file_row_number AS row, m.record_id, m.split
FROM read_parquet({paths}, filename = true, file_row_number = true) r
JOIN ho_files f USING (filename)
JOIN (SELECT * FROM ({members}) WHERE record_id IN (SELECT record_id FROM ho_changed)) m
ON m.record_id = r.record_id AND m.object = r.object AND m.line = r.line
"""
# the searched records at the rows candidates name (``ho_keys``: those rows' keys)
ROWS_NAMED = """
SELECT k.row, m.record_id, m.split FROM ho_keys k
JOIN ({members}) m ON m.record_id = k.record_id AND m.object = k.object AND m.line = k.line
"""


def narrowed_pairs(
    scan: "HeldoutScan",
    con: duckdb.DuckDBPyConnection,
    members: str,
    known: "Reuse | None",
    changed: pa.Array,
) -> tuple[pa.Table, dict[str, int | float]]:
    """``scan.pairs(con, members, known, keep=False, changed=changed)``: the same pairs, with
    the rows of the changed records and of their candidates' partners found, not every
    member's. ``members`` has columns record_id, object, line, split."""
    digests = RowDigests(scan.ws, scan.chunks)
    paths = [scan.files.path(c.records["digest"], c.what) for c in scan.chunks]  # checked
    n = len(scan.thresholds)
    moved, read = _changed_rows(con, members, paths, digests, changed)
    a, b = np.divmod(
        side_candidates(scan.blocks, [(moved, np.arange(n))], scan.params, n), max(n, 1)
    )
    partners = np.setdiff1d(np.concatenate([a, b]), moved)
    _add_rows(con, members, paths, digests, partners)
    found_in = _members(con, digests)
    is_member = np.isin(a, found_in.rows) & np.isin(b, found_in.rows)
    held = found_in.rows[found_in.held]
    keep = is_member & (np.isin(a, held) | np.isin(b, held))
    likely = likely_pairs(scan.blocks, a[keep], b[keep], scan.params)
    del a, b  # only the likely pairs live through the verification (its texts: the peak)
    tables = known.tables if known is not None else ()
    texts = TextLookup(scan.ws, scan.chunks, verified=True)  # the paths above checked them
    found = verified_pairs(
        likely,
        scan.params,
        partial(fingerprint_rows, texts, scan.spec),
        scan.thresholds,
        partial(known_jaccards, con, tables, digests),
        scan.ws.home / "tmp",
    )
    table = found_in.pairs(found)
    found_in.close()
    stats = {"changed": len(moved), "tables_read": read, "looked_up": len(found_in.rows)}
    stats |= found.stats
    return table, stats


def _changed_rows(
    con: duckdb.DuckDBPyConnection,
    members: str,
    paths: list[str],
    digests: RowDigests,
    changed: pa.Array,
) -> tuple[np.ndarray, int]:
    """``ho_members`` (row, record_id, split) of the searched records in ``changed``; their
    ascending unique rows, and how many chunk tables were read: only those that may hold their
    objects."""
    ids = pa.table({"record_id": pa.array(changed, pa.string())})
    with registered(con, "ho_changed", ids):
        objects = con.sql(
            f"SELECT DISTINCT object FROM ({members}) "
            "WHERE record_id IN (SELECT record_id FROM ho_changed)"
        ).fetchnumpy()["object"]
        read = _holding(paths, {str(o) for o in objects})
        files = pa.table(
            {"filename": [paths[i] for i in read], "start": [digests.starts()[i] for i in read]}
        )
        query = CHANGED_ROWS.format(paths=sql_list(files["filename"].to_pylist()), members=members)
        with registered(con, "ho_files", files):
            empty = "SELECT NULL::BIGINT AS row, NULL::VARCHAR AS record_id, NULL::VARCHAR AS split"
            body = query if read else f"{empty} WHERE false"
            con.execute(f"CREATE OR REPLACE TEMP TABLE ho_members AS {body}")
    rows = con.sql("SELECT DISTINCT row FROM ho_members ORDER BY row").fetchnumpy()["row"]
    return np.asarray(rows, dtype=np.int64), len(read)


def _holding(paths: list[str], objects: set[str]) -> list[int]:
    """The indices of the tables whose ``object`` column holds one of ``objects`` (read as
    its dictionary: a chunk table holds one object, the column's pages are a few bytes)."""
    kept = []
    for i, path in enumerate(paths):
        column = pq.read_table(path, columns=["object"], read_dictionary=["object"])["object"]
        values = {v for part in column.chunks for v in part.dictionary.to_pylist()}
        if values & objects:
            kept.append(i)
    return kept


def _add_rows(
    con: duckdb.DuckDBPyConnection,
    members: str,
    paths: list[str],
    digests: RowDigests,
    rows: np.ndarray,
) -> None:
    """The searched records at ascending global ``rows`` added to ``ho_members``: their keys
    read from the chunk tables holding them, joined with ``members``."""
    keys = _row_keys(paths, digests.starts(), rows)
    with registered(con, "ho_keys", keys):
        con.execute(f"INSERT INTO ho_members {ROWS_NAMED.format(members=members)}")


def _row_keys(paths: list[str], starts: list[int], rows: np.ndarray) -> pa.Table:
    """row, record_id, object, line of ascending global ``rows`` (a chunk table read only
    when it holds one of them, only the key columns; the object as its dictionary, decoded
    for the rows taken: decoding a 71-character digest per row of every table read was half
    the read's ~0.13 CPU-s in a 1.1 GB child's check)."""
    ends = [*starts[1:], np.iinfo(np.int64).max]
    cut = np.searchsorted(rows, [*starts, ends[-1]])
    parts = [pa.table({"row": pa.array([], pa.int64()), **_empty_keys()})]
    for i, path in enumerate(paths):
        local = rows[cut[i] : cut[i + 1]] - starts[i]
        if len(local):
            read = pq.read_table(path, columns=list(KEYS), read_dictionary=["object"])
            table = read.take(pa.array(local, pa.int64()))
            row = pa.array(local + starts[i], pa.int64())
            parts.append(table.add_column(0, "row", row).cast(parts[0].schema))
    return pa.concat_tables(parts)


def _empty_keys() -> dict[str, pa.Array]:
    return {
        "record_id": pa.array([], pa.string()),
        "object": pa.array([], pa.string()),
        "line": pa.array([], pa.int64()),
    }


def _members(con: duckdb.DuckDBPyConnection, digests: RowDigests) -> Members:
    """The rows looked up (ascending, once each) and whether a held-out record stands there."""
    found = con.sql(
        f"SELECT row, bool_or(split <> '{TRAIN}') AS held, count(*) AS n FROM ho_members "
        "GROUP BY row ORDER BY row"
    ).fetchnumpy()
    rows = np.asarray(found["row"], dtype=np.int64) if len(found["row"]) else EMPTY
    single = bool(np.all(np.asarray(found["n"]) == 1))
    return Members(rows, np.asarray(found["held"], dtype=bool), con, digests, single)
