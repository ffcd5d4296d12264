"""The objects a child's clusters table may differ from its parent's in, from dedup's record:
what the manifest's deletion index build diffs the removed duplicates of (``deletion_build``).

A child's dedup that copied rows from its parent's clusters table records the canonical chunks
(records digests) holding every row it joined instead (``dedup.reuse.remember_changed``): every
other child row is a parent row byte for byte, one for one, and a parent row not copied is
either the old row of a joined one (same chunk, so same records and objects) or in a chunk the
child does not list as often as the parent. So the rows of every other object are the same in
both tables, and the multiset difference of the two (the deletion index's delta) is that of
the rows of these objects (and of rows naming none): at 1.1 GB ~1% of the rows, not two whole
tables (with its own scan for the changed representatives: 0.48 -> 0.22 CPU-s). None when dedup
recorded nothing for the two tables.
"""

from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.dedup.reuse import changed_chunks
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.snapshot_manifest import Manifest, read_manifest
from corpus_assets.core.storage.cas import CasError, ContentStore
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.table_lookup import TrustedFiles


def changed_objects(
    cas: ContentStore, catalog: Catalog, manifest_digest: str, parent_digest: str
) -> list[str] | None:
    """The objects (sorted) of the chunks holding every clusters row the child's and the
    parent's tables may not share, or None (dedup recorded no such chunks for the two): what
    the manifest hands ``deletion_index.ensure``."""
    child, parent = read_manifest(cas, manifest_digest), read_manifest(cas, parent_digest)
    dedup = load_index(cas, child.layers["dedup_clusters"], "dedup_clusters")
    theirs = load_index(cas, parent.layers["dedup_clusters"], "dedup_clusters")
    clusters = (theirs.output("clusters")["digest"], dedup.output("clusters")["digest"])
    joined = changed_chunks(catalog, dedup.code, *clusters)
    if joined is None:
        return None
    ours, old = _chunks(cas, child), _chunks(cas, parent)
    listed, before = Counter(ours), Counter(old)
    uneven = {digest for digest in listed | before if listed[digest] != before[digest]}
    files = TrustedFiles(cas, catalog)
    objects: set[str] = set()
    try:
        for digest in sorted(joined | uneven):
            table = pq.read_table(files.path(digest, "canonical records"), columns=["object"])
            objects |= set(pc.unique(table.column("object").drop_null()).to_pylist())
    except (CasError, KeyError, pa.ArrowInvalid):
        return None
    return sorted(objects)


def _chunks(cas: ContentStore, manifest: Manifest) -> list[str]:
    """The records digest of each of the snapshot's canonical chunks (repeats kept)."""
    canonical = CanonicalIndex.load(cas, manifest.layers["canonical_records"])
    return [chunk.records["digest"] for chunk in canonical.chunks()]
