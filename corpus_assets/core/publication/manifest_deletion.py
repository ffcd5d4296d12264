"""The objects a child's clusters table may differ from its parent's in, from the two tables'
parts: what the manifest's deletion index build diffs the removed duplicates of
(``deletion_build``).

A clusters table stored as chunk parts (``PartedTable``) is the concatenation of its parts, so
a part both tables hold (the same digest, as often in each) holds the same rows on both sides
and cancels out of the multiset difference of the two tables (the deletion index's delta).
What is left are rows of the parts one table holds and the other does not: diffing the rows of
those parts' objects (and of rows naming none) gives the same difference - at 1.1 GB ~1% of the
rows, not two whole tables. None when either table is stored whole (snapshots before parts):
the whole tables are diffed.
"""

from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import ManifestError, read_manifest
from corpus_assets.core.storage.cas import CasError, ContentStore
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.table_lookup import TrustedFiles


def changed_objects(
    cas: ContentStore, catalog: Catalog, manifest_digest: str, parent_digest: str
) -> list[str] | None:
    """The objects (sorted) of every clusters row the child's and the parent's tables may not
    share, or None (either table stored whole, or a part unreadable): what the manifest hands
    ``deletion_index.ensure``."""
    try:
        ours, theirs = (_clusters(cas, digest) for digest in (manifest_digest, parent_digest))
        return unshared_objects(TrustedFiles(cas, catalog), ours, theirs)
    except (CasError, ManifestError, KeyError, pa.ArrowInvalid):
        return None


def unshared_objects(
    files: VerifiedFiles, child: PartedTable, parent: PartedTable
) -> list[str] | None:
    """The objects (sorted) named by the rows of the parts one of the two clusters tables
    holds and the other does not (a multiset difference of the parts' digests), or None when
    either is stored whole."""
    if child.counts is None or parent.counts is None:
        return None
    ours = Counter(ref["digest"] for ref in child.refs)
    theirs = Counter(ref["digest"] for ref in parent.refs)
    unshared = sorted((ours - theirs) | (theirs - ours))
    objects: set[str] = set()
    for path in files.paths(unshared, "dedup clusters part"):
        table = pq.read_table(path, columns=["object"])
        objects |= set(pc.unique(table.column("object").drop_null()).to_pylist())
    return sorted(objects)


def _clusters(cas: ContentStore, manifest_digest: str) -> PartedTable:
    """The snapshot's dedup clusters table (one Parquet table or chunk parts)."""
    manifest = read_manifest(cas, manifest_digest)
    dedup = load_index(cas, manifest.layers["dedup_clusters"], "dedup_clusters")
    return PartedTable.read(cas, dedup.output("clusters"), "dedup clusters")
