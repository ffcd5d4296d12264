"""Scrub: re-hash every byte the aliases can serve, so bit rot is found before a training run.

A build's validation re-hashes only new objects and trusts the rest by stat (``storage.trust``),
which cannot see corruption beneath the filesystem. Scrub closes that gap on a schedule: every
snapshot an alias can serve - ACTIVE (served now, or restorable by ``rollback``) and APPROVED
(next to be activated) - is verified in full (``verify``: snapshotId, schema, signature against
the trust root, every object re-hashed). An object shared by several snapshots is hashed once per
scrub. Objects that hashed right are recorded as verified, as any verifier records them, so a
later validation may trust them while their files stay unchanged.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import select

from corpus_assets.core.governance import states
from corpus_assets.core.publication.verify import verify
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, snapshots
from corpus_assets.core.storage.trust import StatTrust

SERVABLE = (states.ACTIVE, states.APPROVED)


class OncePerScrub(StatTrust):
    """Trusts only what this scrub already hashed right, never a stat recorded earlier."""

    def __init__(self, cas: ContentStore, catalog: Catalog) -> None:
        super().__init__(cas, catalog)
        self._hashed_now: set[str] = set()

    def unchanged(self, digests: Iterable[str]) -> set[str]:
        return set(digests) & self._hashed_now

    def hashed(self, digest: str, before: str | None) -> None:
        super().hashed(digest, before)
        self._hashed_now.add(digest)


@dataclass
class ScrubbedSnapshot:
    """One snapshot's outcome: its alias and state, what was read, and what was wrong."""

    snapshot_id: str
    alias: str
    state: str
    objects: int
    bytes_hashed: int
    findings: list[str]


@dataclass
class ScrubReport:
    """Every servable snapshot scrubbed, in alias then creation order."""

    snapshots: list[ScrubbedSnapshot] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(not s.findings for s in self.snapshots)

    @property
    def bytes_hashed(self) -> int:
        return sum(s.bytes_hashed for s in self.snapshots)


def servable(catalog: Catalog, alias: str | None = None) -> list[states.Snapshot]:
    """The ACTIVE and APPROVED snapshots of ``alias`` (every alias when None)."""
    query = select(snapshots.c.snapshot_id).where(snapshots.c.state.in_(SERVABLE))
    if alias is not None:
        query = query.where(snapshots.c.alias == alias)
    query = query.order_by(snapshots.c.alias, snapshots.c.created_at, snapshots.c.snapshot_id)
    with catalog.begin() as conn:
        ids = list(conn.scalars(query))
    return [states.get(catalog, sid) for sid in ids]


def scrub(cas: ContentStore, catalog: Catalog, alias: str | None = None) -> ScrubReport:
    """Verify every servable snapshot in full; ``alias`` narrows it to one alias."""
    trust = OncePerScrub(cas, catalog)
    report = ScrubReport()
    for snapshot in servable(catalog, alias):
        checked = verify(cas, catalog, snapshot.snapshot_id, trust=trust)
        report.snapshots.append(
            ScrubbedSnapshot(
                snapshot.snapshot_id,
                snapshot.alias,
                snapshot.state,
                checked.objects_checked,
                checked.bytes_checked,
                list(checked.findings),
            )
        )
    return report
