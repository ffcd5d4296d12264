"""No row vanishes: every term of a snapshot's accounting re-counted from the layers' own tables.

Per source, ``records = members + duplicates removed + duplicate ids + id conflicts + tombstoned
+ records a split conflict quarantined``, each term counted in the table that holds it: the
canonical records (Parquet footers), the dedup clusters table by verdict and exclusion reason,
the members table, the split moves. Counts an index or the manifest merely restate are compared
with these, never trusted for them, so a row dropped from any table - or a count edited with it -
is named. Each canonical chunk must also hold its own account: rows in = records + exclusions.
"""

from collections import Counter
from dataclasses import dataclass, field

import pyarrow.parquet as pq

from corpus_assets.core.dedup.coding import DUPLICATE_ID, ID_CONFLICT
from corpus_assets.core.dedup.verdicts import EXACT, KEEP, NEAR
from corpus_assets.core.publication.evidence import Evidence
from corpus_assets.core.runtime.snapshot_manifest import Manifest

CLUSTER_TERMS = """
SELECT source_id,
  CASE WHEN verdict <> 'excluded' THEN verdict
       WHEN starts_with(excluded, ?) THEN 'id_conflicts'
       WHEN starts_with(excluded, ?) THEN 'duplicate_ids'
       WHEN starts_with(excluded, 'tombstone ') THEN 'tombstoned'
       ELSE 'excluded for no known reason' END AS term, count(*)
FROM {clusters} GROUP BY ALL
"""
TERMS = ("members", "duplicates removed", "duplicate ids", "id conflicts", "tombstoned")


@dataclass
class SourceCounts:
    """One source's terms, each as its own table has it."""

    records: int = 0  # rows of the canonical records tables
    terms: Counter[str] = field(default_factory=Counter)

    def accounted(self) -> int:
        return sum(self.terms[t] for t in (*TERMS, "split-quarantined"))


def per_source(ev: Evidence) -> dict[str, SourceCounts]:
    """Every source's records and terms, read from the snapshot's tables."""
    found: dict[str, SourceCounts] = {}
    for chunk in ev.canonical.chunks():
        path = ev.files.path(chunk.records["digest"], chunk.what)
        source = found.setdefault(chunk.key.split("/", 1)[0], SourceCounts())
        source.records += pq.read_metadata(path).num_rows
    query = CLUSTER_TERMS.format(clusters=ev.clusters())
    names = {KEEP: "dedup kept", EXACT: "duplicates removed", NEAR: "duplicates removed"}
    names.update(id_conflicts="id conflicts", duplicate_ids="duplicate ids")
    for source, term, n in ev.rows(query, [ID_CONFLICT, DUPLICATE_ID]):
        found.setdefault(source, SourceCounts()).terms[names.get(term, term)] += n
    for source, n in ev.rows("SELECT source_id, count(*) FROM members GROUP BY ALL"):
        found.setdefault(source, SourceCounts()).terms["members"] += n
    for record_id in ev.quarantined:  # a record id is "<source>/<its own id>"
        found.setdefault(record_id.split("/", 1)[0], SourceCounts()).terms["split-quarantined"] += 1
    return dict(sorted(found.items()))


def source_findings(counts: dict[str, SourceCounts]) -> list[str]:
    """The identity per source, and dedup's keeps all placed (a member or split-quarantined)."""
    findings = []
    for source, c in counts.items():
        if c.records != c.accounted():
            terms = ", ".join(f"{c.terms[t]} {t}" for t in (*TERMS, "split-quarantined"))
            known = {*TERMS, "split-quarantined", "dedup kept"}
            terms += "".join(f"; {n} {t}" for t, n in sorted(c.terms.items()) if t not in known)
            findings.append(
                f"source {source!r}: {c.records} canonical records != {c.accounted()} "
                f"accounted for ({terms})"
            )
        placed = c.terms["members"] + c.terms["split-quarantined"]
        if c.terms["dedup kept"] != placed:
            findings.append(
                f"source {source!r}: dedup kept {c.terms['dedup kept']} records != "
                f"{c.terms['members']} members + {c.terms['split-quarantined']} split-quarantined"
            )
    return findings


def chunk_findings(ev: Evidence) -> list[str]:
    """Each canonical chunk's account against its own tables: rows in = records + exclusions."""
    findings = []
    for entry in ev.canonical.entries:
        descriptor = ev.canonical.descriptor(entry)
        account = descriptor.account
        records = sum(
            pq.read_metadata(ev.files.path(p.records["digest"], entry.chunk)).num_rows
            for p in descriptor.parts()
        )
        excluded = pq.read_metadata(ev.files.path(descriptor.excluded["digest"], entry.chunk))
        reasons = sum(account.quarantined.values()) + sum(account.rejected.values())
        if (records, excluded.num_rows) != (account.kept, reasons) or (
            account.rows_in != account.kept + reasons
        ):
            findings.append(
                f"chunk {entry.chunk}: {account.rows_in} rows in, account {account.kept} kept + "
                f"{reasons} excluded, tables hold {records} records + "
                f"{excluded.num_rows} exclusions"
            )
    return findings


def manifest_findings(manifest: Manifest, counts: dict[str, SourceCounts]) -> list[str]:
    """The manifest's restated totals must be what the tables hold (a term an older snapshot's
    manifest does not state must be 0)."""
    total: Counter[str] = Counter()
    for c in counts.values():
        total.update(c.terms)
        total["records"] += c.records
    stated = manifest.counts
    keys = {
        "records": "records",
        "members": "members",
        "duplicates_removed": "duplicates removed",
        "duplicate_ids": "duplicate ids",
        "id_conflicts": "id conflicts",
        "tombstoned": "tombstoned",
    }
    return [
        f"manifest counts.{key} is {getattr(stated, key) or 0}, the tables hold {total[term]}"
        for key, term in keys.items()
        if (getattr(stated, key) or 0) != total[term]
    ]
