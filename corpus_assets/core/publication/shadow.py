"""Shadow diff: what approving a candidate would change against the alias's active snapshot.

Reviewers approve a digest; this tells them what that digest means relative to what training
reads today: members added and removed, records that migrated between splits, and distribution
shifts (share of each source and split, byte-length quantiles).

The member changes are a join of the two members tables restricted to the record ids of the
parts they do not share (whole, they cost ~0.8 CPU-s at 1.1 GB), and a function of the two
tables alone, so a build (its manifest, then the candidate's review observation) and
every later build against the same active snapshot take them from a memo keyed by both tables'
digests and this code (``remembered``), and each table's profile from a memo keyed by its
digest (a build's candidate is profiled once; as the active snapshot of the next build it is
not read again); ``corpus-assets diff`` and approval join and read again.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.governance import alias_gate
from corpus_assets.core.publication import manifest_queries
from corpus_assets.core.publication.verify import load_manifest, resolve
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.snapshot_manifest import Manifest, MembersEntry
from corpus_assets.core.storage.artifacts import Ref
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import VerifiedFiles, ordered_parts
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.digests import json_digest
from corpus_assets.core.storage.trust import StatTrust

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

CODE = stage_code("shadow.member-changes.v1", __name__)  # its closure, hashed at import
MEMO = "shadow.member_changes"  # the memo rows' layer name
PROFILE_MEMO = "shadow.profile"  # a members table's profile, by its digest
QUANTILES = (0.1, 0.5, 0.9, 0.99)
EXAMPLES = 5
SPLIT_OF = """CREATE VIEW {name} AS SELECT record_id, arg_max_null(split, file_row_number) AS split
FROM ({table}) {where} GROUP BY record_id"""  # last row wins, as a dict
MIGRATED = """SELECT record_id || ': ' || coalesce(o.split, 'None') || ' -> '
    || coalesce(n.split, 'None') FROM n JOIN o USING (record_id)
WHERE n.split IS DISTINCT FROM o.split"""


def _members(files: VerifiedFiles, manifest: Manifest) -> pa.Table:
    """The profile's columns (two of few distinct values, one integer): small per member."""
    columns = ["source_id", "split", "text_bytes"]
    paths = manifest.members.paths(files)
    return pa.concat_tables([pq.read_table(path, columns=columns) for path in paths])


def _profile(members: pa.Table) -> dict[str, Any]:
    total = max(members.num_rows, 1)
    shares: dict[str, dict[str, str]] = {}
    for column in ("source_id", "split"):
        counts = pc.value_counts(members.column(column)).to_pylist()
        shares[column] = {
            c["values"]: f"{100 * c['counts'] / total:.2f}%"
            for c in sorted(counts, key=lambda c: c["values"])
        }
    lengths = members.column("text_bytes")
    quantiles = (
        pc.quantile(lengths, q=list(QUANTILES), interpolation="nearest").to_pylist()
        if members.num_rows
        else [0] * len(QUANTILES)
    )
    return {
        "members": members.num_rows,
        "source_share": shares["source_id"],
        "split_share": shares["split"],
        "text_bytes_quantiles": {
            f"p{int(q * 100)}": v for q, v in zip(QUANTILES, quantiles, strict=True)
        },
    }


def shadow_diff(
    cas: ContentStore,
    catalog: Catalog,
    digest: str,
    trust: StatTrust | None = None,
    remembered: bool = False,
) -> dict[str, Any]:
    """Candidate vs the active snapshot of its alias (or vs nothing, for the first one).
    ``trust``: a members table unchanged since it last hashed right is read without re-hashing
    (for a preview, such as the approval Launchpad; approval itself re-hashes every byte).
    ``remembered``: member changes joined before for the same two tables are taken from the
    memo (module docstring)."""
    candidate = resolve(catalog, digest)
    manifest = load_manifest(cas, candidate)
    files = VerifiedFiles(cas)  # each members table re-hashed once, then read as often as needed
    active_id = alias_gate.read_alias_gate(catalog, candidate.alias).active_snapshot
    old_manifest = (
        load_manifest(cas, resolve(catalog, active_id))
        if active_id not in (None, candidate.snapshot_id)
        else None
    )
    if trust is not None:
        tables = [m.members for m in (manifest, old_manifest) if m is not None]
        parts = [ref["digest"] for entry in tables for ref in entry.part_refs(cas)]
        files.verified |= trust.unchanged(parts)
    profile = remembered_profile if remembered else _read_profile
    diff: dict[str, Any] = {"candidate": candidate.snapshot_id, "active": active_id}
    diff["candidate_profile"] = profile(catalog, files, manifest)
    if old_manifest is None:
        added = diff["candidate_profile"]["members"]
        diff.update(added=added, removed=0, split_migrations=0, examples={})
        return diff
    if old_manifest.members.digest == manifest.members.digest:  # a re-build
        diff.update(added=0, removed=0, split_migrations=0)
        diff["examples"] = {"added": [], "removed": [], "migrated": []}
        diff["active_profile"] = diff["candidate_profile"]
        return diff
    old, new_entry = old_manifest.members, manifest.members
    changes = (
        remembered_changes(cas, catalog, old, new_entry, files)
        if remembered
        else member_changes(cas, old.part_refs(cas), new_entry.part_refs(cas), files)
    )
    diff.update(changes)
    diff["active_profile"] = profile(catalog, files, old_manifest)
    return diff


def _read_profile(_catalog: Catalog, files: VerifiedFiles, manifest: Manifest) -> dict[str, Any]:
    return _profile(_members(files, manifest))


def remembered_profile(
    catalog: Catalog, files: VerifiedFiles, manifest: Manifest
) -> dict[str, Any]:
    """A members table's profile from the memo when this code profiled the same table before
    (a build's candidate is the next build's active snapshot), else read and remembered."""
    table = manifest.members.digest
    key = json_digest({"table": PROFILE_MEMO, "code": CODE, "members": table})
    hit = catalog.memo(key)
    if hit is not None:
        return dict(json.loads(hit[1]))
    profile = _read_profile(catalog, files, manifest)
    catalog.remember(key, PROFILE_MEMO, table, json.dumps(profile))
    return profile


def member_changes(
    cas: ContentStore,
    old: list[Ref],
    new: list[Ref],
    files: VerifiedFiles | None = None,
) -> dict[str, Any]:
    """Members added, removed and moved between splits from table ``old`` to ``new`` (the
    refs of their parts, in order), counted and the first few named, joined in DuckDB rather
    than in Python sets; ``files``: the caller's verified files, so a table it read is not
    re-hashed."""
    files = files if files is not None else VerifiedFiles(cas)
    with manifest_queries.connect(cas) as con:
        where = _changed_ids(con, files, old, new)
        for name, refs in (("o", old), ("n", new)):
            paths = files.paths([ref["digest"] for ref in refs], "members table")
            table = ordered_parts(paths, numbered=True)
            con.execute(SPLIT_OF.format(name=name, table=table, where=where))
        added, added_n = _first(con, "SELECT record_id FROM n ANTI JOIN o USING (record_id)")
        removed, removed_n = _first(con, "SELECT record_id FROM o ANTI JOIN n USING (record_id)")
        migrated, migrated_n = _first(con, MIGRATED)
    return {
        "added": added_n,
        "removed": removed_n,
        "split_migrations": migrated_n,
        "examples": {"added": added, "removed": removed, "migrated": migrated},
    }


def _changed_ids(
    con: DuckDBPyConnection, files: VerifiedFiles, old: list[Ref], new: list[Ref]
) -> str:
    """A filter to the record ids of the parts the two tables do not share ("": every row).
    An id found only in shared parts has the same rows, in the same order, in both, so it is
    neither added, removed nor moved; reading only the others' ids keeps a child's diff in
    proportion to its change."""
    shared = {ref["digest"] for ref in old} & {ref["digest"] for ref in new}
    changed = [r["digest"] for r in [*old, *new] if r["digest"] not in shared]
    if not shared or not changed:
        return ""
    paths = files.paths(list(dict.fromkeys(changed)), "members table")
    con.execute(
        f"CREATE TEMP TABLE changed AS SELECT DISTINCT record_id FROM ({ordered_parts(paths)})"
    )
    return "WHERE record_id IN (SELECT record_id FROM changed)"


def remembered_changes(
    cas: ContentStore,
    catalog: Catalog,
    old: MembersEntry,
    new: MembersEntry,
    files: VerifiedFiles,
) -> dict[str, Any]:
    """``member_changes`` from the memo when this code joined the same two tables before, else
    joined and remembered (the row names the newer table)."""
    key = json_digest({"table": MEMO, "code": CODE, "old": old.digest, "new": new.digest})
    hit = catalog.memo(key)
    if hit is not None:
        return dict(json.loads(hit[1]))
    changes = member_changes(cas, old.part_refs(cas), new.part_refs(cas), files)
    catalog.remember(key, MEMO, new.digest, json.dumps(changes))
    return changes


def _first(con: DuckDBPyConnection, query: str) -> tuple[list[str], int]:
    """The first ``EXAMPLES`` rows of a one-column query in sorted order, and its row count."""
    rows = con.execute(
        f"SELECT v, count(*) OVER () FROM ({query}) t(v) ORDER BY v LIMIT {EXAMPLES}"
    ).fetchall()
    return [v for v, _ in rows], (rows[0][1] if rows else 0)
