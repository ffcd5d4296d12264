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
"""

from corpus_assets.core.governance import states
from corpus_assets.core.publication import part_memo
from corpus_assets.core.publication.evidence import Evidence
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
