"""Unique member ids over a parent's proven ones: a child looks only at the parts it adds.

``record_ids_unique`` groups every member's id (at 1.1 GB ~0.12 CPU-s a check). Once it held
for a members table, that is recorded (``gate_results``, like a part's outcome in ``part_memo``)
under the parts document's digest, the rule and the transform image. A child's members are
parts of that document (same digests, same rows: ids once each) and parts it adds; an id
repeated among them is repeated among the added parts' rows or is one of them found in a part
it shares (a part named twice is its ids twice: the whole query). So a child whose parent's
members are recorded so asks only that (the added parts' ids, and the shared parts' ids among
them): none, and the ids are unique; any, and the whole query runs, so the findings are always
the whole query's.

``rows_explained`` counts the distinct ids of every canonical row the same way: a check records
the count under its chunks' records digests, and a child whose chunks hold all of its parent's
adds the distinct ids of its other chunks that the parent's do not hold.
"""

from corpus_assets.core.governance import states
from corpus_assets.core.publication import part_memo
from corpus_assets.core.publication.evidence import Evidence
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.snapshot_manifest import ManifestError, read_manifest
from corpus_assets.core.runtime.transform import transform_image
from corpus_assets.core.storage.cas import CasError
from corpus_assets.core.storage.cas_queries import sql_list
from corpus_assets.core.storage.digests import json_digest

RULE = "record_ids_unique"
# how many of the added parts' ids are repeated among them or held by a shared part
REPEATED_OVER = """
WITH added AS (SELECT record_id FROM read_parquet({added}))
SELECT (SELECT count(*) FROM (SELECT record_id FROM added GROUP BY ALL HAVING count(*) > 1))
     + (SELECT count(*) FROM read_parquet({shared})
        WHERE record_id IN (SELECT record_id FROM added))
"""


def unique_key(members_digest: str) -> str:
    """Where the rule's pass over the members parts document ``members_digest`` is kept."""
    return json_digest({"rule": RULE, "members": members_digest, "image": transform_image()})


def held(ev: Evidence) -> None:
    """The rule held for this snapshot's members: kept with its other outcomes."""
    if ev.member_parts is not None:
        ev.proven[unique_key(ev.manifest.members.digest)] = {"parts": len(ev.member_parts)}


def unique_over_parent(ev: Evidence) -> bool:
    """True if the parent's members are recorded unique and the parts this snapshot adds
    repeat no id (among themselves or of a shared part); False: run the whole query."""
    parts = ev.member_parts
    if parts is None or not ev.manifest.parents:
        return False
    held = [part.digest for part in parts if part.count]
    if len(set(held)) < len(held):  # a part twice: its ids are repeated
        return False
    try:
        snapshot = states.get(ev.catalog, ev.manifest.parents[0])
        members = read_manifest(ev.cas, snapshot.manifest_digest).members
        if not part_memo.recall(ev.catalog, [unique_key(members.digest)]):
            return False
        theirs = {part.digest for part in members.parts(ev.cas).parts}
    except (CasError, ManifestError, states.StateError):
        return False
    added = [digest for digest in held if digest not in theirs]
    shared = [digest for digest in held if digest in theirs]
    if added and shared:
        query = REPEATED_OVER.format(
            added=sql_list(ev.files.paths(added, "members table")),
            shared=sql_list(ev.files.paths(shared, "members table")),
        )
        if ev.scalar(query):
            return False
    elif added:  # nothing shared: the whole query is this one
        return False
    ev.narrowed.append(RULE)
    ev.parts_checked[RULE] = len(added)
    return True


EXPLAINED = "rows_explained"
# distinct ids of the added chunks less those the kept chunks hold too (nulls are no id)
ADDED_RECORDS = """
WITH added AS (SELECT record_id FROM read_parquet({added}) WHERE record_id IS NOT NULL)
SELECT (SELECT count(DISTINCT record_id) FROM added)
     - (SELECT count(DISTINCT record_id) FROM read_parquet({kept})
        WHERE record_id IN (SELECT record_id FROM added))
"""


def records_key(digests: set[str]) -> str:
    """Where the distinct record ids of the canonical chunks ``digests`` (a set) are kept."""
    return json_digest({"rule": EXPLAINED, "records": sorted(digests), "image": transform_image()})


def distinct_records(ev: Evidence) -> int:
    """The distinct record ids of every canonical row: the parent's recorded count plus those
    of the chunks this snapshot adds that no kept chunk holds, when its chunks are a superset
    of the parent's (distinct ids of a union of sets); else counted over every row. Recorded
    for this snapshot's chunks either way."""
    mine = ev.records_digests
    found = _over_parent(ev, mine)
    if found is None:
        found = int(ev.scalar(f"SELECT count(DISTINCT record_id) FROM {ev.canonical_view}"))
    else:
        ev.narrowed.append(EXPLAINED)
    ev.proven[records_key(mine)] = {"records": found}
    return found


def _over_parent(ev: Evidence, mine: set[str]) -> int | None:
    """``distinct_records`` over the parent's recorded count, or None."""
    if not ev.manifest.parents:
        return None
    try:
        snapshot = states.get(ev.catalog, ev.manifest.parents[0])
        manifest = read_manifest(ev.cas, snapshot.manifest_digest)
        canonical = CanonicalIndex.load(ev.cas, manifest.layers["canonical_records"])
        theirs = {chunk.records["digest"] for chunk in canonical.chunks()}
    except (CasError, ManifestError, states.StateError):
        return None
    recorded = part_memo.recall(ev.catalog, [records_key(theirs)])
    if not recorded or not theirs <= mine or not theirs:
        return None
    before = int(next(iter(recorded.values()))["records"])
    added = sorted(mine - theirs)
    if not added:
        return before
    query = ADDED_RECORDS.format(
        added=sql_list(ev.files.paths(added, "canonical records")),
        kept=sql_list(ev.files.paths(sorted(theirs), "canonical records")),
    )
    return before + int(ev.scalar(query))
