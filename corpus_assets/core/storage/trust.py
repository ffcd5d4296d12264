"""Stat-trusted verification: an object hashed once is not hashed again while its file is unchanged.

Every CAS read re-hashes its bytes, which is what catches a flipped bit; but re-hashing the ~5 GB
of unchanged objects an unchanged snapshot names was most of a re-build. Like git's index and
rsync's quick check, a build may trust a file whose (size, mtime_ns, ctime_ns, inode, device) all
equal what was recorded right after its bytes last hashed to their name (the ``verified_files``
table). Any write through the filesystem changes the mtime and the ctime - a flipped byte, a
truncation, a replaced or re-linked file, even a ``touch`` that restores the mtime (the ctime
cannot be set back) - so it is hashed again and reported. What stat cannot see is corruption
beneath the filesystem (bit rot, a bad sector): ``corpus-assets verify`` and approval re-hash
every byte and never trust a stat, so nothing reaches training unhashed by the approving command;
activation, which follows approval, trusts it as a build does, and ``scrub`` finds rot later.
"""

import os
import time
from collections.abc import Iterable
from pathlib import Path

from sqlalchemy import delete, insert, select
from sqlalchemy.exc import IntegrityError

from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, verified_files

BATCH = 500  # digests per catalog query


def file_stat(path: Path) -> str | None:
    """``size:mtime_ns:ctime_ns:inode:device`` of a regular file, or None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:{st.st_dev}"


class StatTrust:
    """Which objects of a local CAS are unchanged since they were last hashed, and the record of
    newly hashed ones (written by ``flush``)."""

    def __init__(self, cas: ContentStore, catalog: Catalog) -> None:
        self.cas = cas
        self.catalog = catalog
        self._pending: dict[str, str] = {}

    def unchanged(self, digests: Iterable[str]) -> set[str]:
        """The digests whose local file has exactly the stat recorded when it last hashed right."""
        wanted = sorted(set(digests))
        trusted: set[str] = set()
        for start in range(0, len(wanted), BATCH):
            part = wanted[start : start + BATCH]
            with self.catalog.begin() as conn:
                rows = conn.execute(
                    select(verified_files.c.digest, verified_files.c.file_stat).where(
                        verified_files.c.digest.in_(part)
                    )
                ).all()
            trusted |= {d for d, recorded in rows if file_stat(self.cas.local_path(d)) == recorded}
        return trusted

    def verify_all(self, objects: dict[str, str]) -> int:
        """Re-hash each object (digest -> what it is; CasError if missing or corrupt) unless
        it is unchanged since it last hashed right; record the ones hashed now. Returns how
        many were trusted without reading them."""
        trusted = self.unchanged(objects)
        for digest, what in objects.items():
            if digest not in trusted:
                before = file_stat(self.cas.local_path(digest))
                self.cas.verify(digest, what)
                self.hashed(digest, before)
        self.flush()
        return len(trusted)

    def hashed(self, digest: str, before: str | None) -> None:
        """Note that ``digest`` just hashed right, its file having had stat ``before`` when the
        read began; recorded only if the file is still that one (no write raced the hash)."""
        if before is not None and file_stat(self.cas.local_path(digest)) == before:
            self._pending[digest] = before

    def flush(self) -> None:
        """Record every object hashed since the last flush (one transaction per batch)."""
        pending, self._pending = sorted(self._pending.items()), {}
        now = time.time()
        for start in range(0, len(pending), BATCH):
            part = pending[start : start + BATCH]
            try:
                with self.catalog.begin() as conn:
                    conn.execute(
                        delete(verified_files).where(
                            verified_files.c.digest.in_([d for d, _ in part])
                        )
                    )
                    conn.execute(
                        insert(verified_files),
                        [{"digest": d, "file_stat": s, "verified_at": now} for d, s in part],
                    )
            except IntegrityError:
                pass  # a concurrent verifier recorded them: either record is a right one
