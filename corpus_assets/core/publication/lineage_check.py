"""Lineage: every member traces to a pinned object and the canonical row it came from.

A member row of a part is a row of its own chunk's records table (``member_parts``), so the
check asks each part first against that table alone: a part whose every row is found there,
naming a pinned object, holds, and its outcome is kept (``part_memo``) under the part's and
the records table's digests with the objects it named. A part recorded so, whose records
table is one of this snapshot's chunks and whose objects this snapshot pins, holds without
being read: a child checks only the parts it does not share with a checked snapshot. A row
not found in its own chunk is looked for among every canonical row (any chunk of its object),
exactly as the whole check does, so the findings, their order and the count are the same.
"""

from typing import Any

import pyarrow as pa

from corpus_assets.core.publication import part_memo
from corpus_assets.core.publication.evidence import Evidence
from corpus_assets.core.runtime.snapshot_manifest import ChunkPart
from corpus_assets.core.storage.cas_queries import PART_ROWS_BITS, sql_list

RULE = "lineage_complete"
# A member's own canonical row (record id, object, line): an id repeated in the canonical rows
# (a duplicate or an id conflict dedup excluded) does not make the kept row's lineage ambiguous.
ORPHANS_OF = """
SELECT m.record_id, count(*) OVER () FROM {members} m
WHERE m.object IS NULL OR m.object NOT IN (SELECT digest FROM pinned) OR NOT EXISTS (
    SELECT 1 FROM {canonical} c
    WHERE c.record_id = m.record_id AND c.object = m.object AND c.line = m.line)
ORDER BY m.file_row_number LIMIT 20
"""
# the rows of the parts checked now (numbered as in the whole ``members`` view, each with its
# chunk's records table's number ``rec``), and the records tables' rows
ROWS = """
WITH n AS (SELECT {parts}[file_index::BIGINT + 1]::BIGINT AS part, *
           FROM read_parquet({part_files}, file_row_number = true)),
     m AS (SELECT part, {owner}[part + 1]::BIGINT AS rec, record_id, object, line,
                  file_row_number + (part << {bits}) AS file_row_number FROM n),
     r AS (SELECT file_index::BIGINT AS rec, record_id, object, line
           FROM read_parquet({records_files})),
     checked AS (SELECT m.*, m.object IS NULL OR m.object NOT IN (SELECT digest FROM pinned)
                             OR NOT EXISTS (SELECT 1 FROM r WHERE r.rec = m.rec
                                 AND r.record_id = m.record_id AND r.object = m.object
                                 AND r.line = m.line) AS bad FROM m)
"""
# per part: its objects' bounds (they meet: the one object of its chunk) and how many of its
# rows its own chunk does not account for
PARTS = ROWS + (
    "SELECT part, min(object), max(object), count(*) FILTER (WHERE bad) FROM checked GROUP BY part"
)
SUSPECTS = "CREATE OR REPLACE TEMP TABLE lineage_suspects AS " + ROWS + "FROM checked WHERE bad"


def orphans(ev: Evidence) -> tuple[list[str], int]:
    """The first 20 members without lineage (record ids, in table order) and how many
    there are."""
    ev.register("pinned", pa.table({"digest": pa.array(list(ev.pinned), pa.string())}))
    parts = ev.member_parts
    if parts is None:  # one members table (a manifest written before parts): every row
        return _found(ev.rows(_orphans("members", ev.canonical_view)))
    keys = [part_memo.part_key(RULE, part) for part in parts]
    recalled = part_memo.recall(ev.catalog, keys)
    counted = [n for n, part in enumerate(parts) if part.count]
    todo = [n for n in counted if not _holds(ev, parts[n], recalled.get(keys[n]))]
    ev.parts_checked[RULE] = len(todo)
    if len(todo) < len(counted):
        ev.narrowed.append(RULE)
    if not todo:
        return [], 0
    found = {n: (low, high, bad) for n, low, high, bad in ev.rows(_query(PARTS, ev, parts, todo))}
    suspects = [n for n in todo if found[n][2]]
    for n in todo:  # a part of one object (a chunk's) that held: recorded with its object
        if n not in suspects and found[n][0] == found[n][1]:
            ev.proven[keys[n]] = {"objects": [found[n][0]]}
    if not suspects:
        return [], 0
    ev.con.execute(_query(SUSPECTS, ev, parts, suspects))
    return _found(ev.rows(_orphans("lineage_suspects", ev.canonical_view)))


def _holds(ev: Evidence, part: ChunkPart, facts: dict[str, Any] | None) -> bool:
    """Whether a recorded pass of the part stands for this snapshot: its records table is one
    of this snapshot's chunks and every object it named is pinned here."""
    if facts is None:
        return False
    return part.records in ev.records_digests and all(o in ev.pinned for o in facts["objects"])


def _query(template: str, ev: Evidence, parts: list[ChunkPart], chosen: list[int]) -> str:
    """``template`` over the rows of the ``chosen`` parts and their chunks' records tables."""
    owners = list(dict.fromkeys(parts[n].records for n in chosen))
    owner = [0] * len(parts)
    for n in chosen:
        owner[n] = owners.index(parts[n].records)
    return template.format(
        parts=chosen,
        owner=owner,
        bits=PART_ROWS_BITS,
        part_files=sql_list(_part_paths(ev, parts, chosen)),
        records_files=sql_list([ev.files.path(d, "canonical records") for d in owners]),
    )


def _part_paths(ev: Evidence, parts: list[ChunkPart], todo: list[int]) -> list[str]:
    return ev.files.paths([parts[n].digest for n in todo], "members table")


def _orphans(members: str, canonical: str) -> str:
    return ORPHANS_OF.format(members=members, canonical=canonical)


def _found(rows: list[tuple[Any, ...]]) -> tuple[list[str], int]:
    return [rid for rid, _ in rows], (rows[0][1] if rows else 0)
