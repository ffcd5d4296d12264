"""The held-out gate's changed records, read from the parts a child does not share with its parent.

When both snapshots store the dedup clusters and the members tables as chunk parts, a part whose
digest is the parent's (same chunk, same records) holds the parent's rows. A searched row
(record id, object, line, the split of its member: itself or its representative) can then
differ from the parent's only where it is read from a clusters part they do not share, or
where its member's members row sits in a members part they do not share with another split.
A row is one (object, line) of one chunk and a member id is once among the members, so a row
of an unshared part never equals a row of a shared one: the difference over the unshared
clusters parts, plus the shared parts' rows whose member moved, is the whole difference
(``heldout_check.changed_records`` over every row; the tests compare the two). What it reads
grows with the parts that changed, not with the table (at 1.1 GB of raw text the whole
difference was ~0.5 CPU-s of a +1% child's check).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from corpus_assets.core.runtime.snapshot_manifest import ChunkPart
from corpus_assets.core.storage.cas_queries import VerifiedFiles, ordered_parts
from corpus_assets.core.training_view.splits import searched_records

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

# members whose (record id, split) row the parent's members do not hold: new, or moved
MOVED = """
CREATE OR REPLACE TEMP TABLE ho_moved AS
SELECT record_id FROM (
    SELECT record_id, split FROM {child} EXCEPT SELECT record_id, split FROM {parent})
"""
# rows of shared clusters parts searched under a moved member (excluded rows are never searched)
BEHIND_MOVED = """
SELECT record_id FROM {shared} WHERE verdict <> 'excluded'
AND (CASE WHEN is_representative THEN record_id ELSE representative_id END)
    IN (SELECT record_id FROM ho_moved)
"""
# no parts: no rows, with every column the queries here read of a clusters or members part
_EMPTY = (
    "(SELECT NULL::VARCHAR AS record_id, NULL::VARCHAR AS object, NULL::BIGINT AS line, "
    "NULL::VARCHAR AS leakage_id, NULL::VARCHAR AS split, NULL::VARCHAR AS verdict, "
    "NULL::BOOLEAN AS is_representative, NULL::VARCHAR AS representative_id WHERE false)"
)
UNSHARED = """
SELECT record_id FROM (
    SELECT record_id, object, line, split FROM ({child})
    EXCEPT SELECT record_id, object, line, split FROM ({parent}))
"""


@dataclass(frozen=True)
class Side:
    """One snapshot's clusters and members parts, and the DuckDB relation of all its members."""

    clusters: tuple[ChunkPart, ...]
    members: tuple[ChunkPart, ...]
    all_members: str


def changed_by_parts(
    con: DuckDBPyConnection, files: VerifiedFiles, child: Side, parent: Side
) -> pa.Array:
    """The record ids of the child's searched rows that are not, as they are, the parent's
    (module docstring); every part read is verified by ``files``."""
    shared, child_only = _split(child.clusters, parent.clusters)
    _, parent_only = _split(parent.clusters, child.clusters)
    moved_child = _split(child.members, parent.members)[1]
    moved_parent = _split(parent.members, child.members)[1]
    con.execute(
        MOVED.format(
            child=_relation(files, moved_child, "members part"),
            parent=_relation(files, moved_parent, "parent members part"),
        )
    )
    unshared = UNSHARED.format(
        child=searched_records(_relation(files, child_only, "dedup clusters"), child.all_members),
        parent=searched_records(
            _relation(files, parent_only, "parent dedup clusters"), parent.all_members
        ),
    )
    behind = BEHIND_MOVED.format(shared=_relation(files, shared, "dedup clusters"))
    try:
        found = con.sql(f"{unshared} UNION {behind}").to_arrow_table()["record_id"]
    finally:
        con.execute("DROP TABLE IF EXISTS ho_moved")
    return found


def unshared_parts(child: Side, parent: Side) -> int:
    """How many of the child's clusters and members parts its parent does not hold."""
    return len(_split(child.clusters, parent.clusters)[1]) + len(
        _split(child.members, parent.members)[1]
    )


def _split(
    mine: tuple[ChunkPart, ...], theirs: tuple[ChunkPart, ...]
) -> tuple[list[ChunkPart], list[ChunkPart]]:
    """``mine``'s parts that ``theirs`` holds too (same chunk, records and digest), and the
    others."""
    held = {(p.chunk, p.records, p.digest) for p in theirs}
    shared = [p for p in mine if (p.chunk, p.records, p.digest) in held]
    return shared, [p for p in mine if (p.chunk, p.records, p.digest) not in held]


def _relation(files: VerifiedFiles, parts: list[ChunkPart], what: str) -> str:
    """The parts' rows as one FROM item (no parts: ``_EMPTY``)."""
    if not parts:
        return _EMPTY
    return f"({ordered_parts(files.paths([p.digest for p in parts], what))})"
