"""The readers of the dedup clusters table give the same answers over it stored as chunk parts
(as dedup writes it) as over the one table (as snapshots before parts stored it)."""

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.governance import deletion_index
from corpus_assets.core.governance.deletion_reach import _carried_by
from corpus_assets.core.publication import accounting_check, verify
from corpus_assets.core.publication.evidence import Evidence
from corpus_assets.core.runtime.layer_index import LayerIndex, load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import (
    CLUSTER_PARTS_SCHEMA,
    ChunkParts,
    Manifest,
    read_manifest,
)
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import Ref, put_json, put_table
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.storage.table_lookup import TrustedFiles
from corpus_assets_tests.core.publication.test_member_parts import clusters_parts_ref
from corpus_assets_tests.core.training_view.test_packing_incremental import (  # noqa: F401 (an autouse fixture)
    _no_env_catalog,
)


def _manifest(ws: Workspace, key: str) -> Manifest:
    return read_manifest(ws.cas, ws.catalog.layer_output(key, "manifest"))


def _with_clusters(dedup: LayerIndex, clusters: Ref) -> LayerIndex:
    """The dedup index naming ``clusters`` as its clusters table."""
    return dedup.model_copy(update={"outputs": {**dedup.outputs, "clusters": clusters}})


def _parted_manifest(ws: Workspace, manifest: Manifest, clusters: Ref) -> Manifest:
    """The manifest with a dedup index naming ``clusters`` (stored, as readers load it)."""
    dedup = load_index(ws.cas, manifest.layers["dedup_clusters"], "dedup_clusters")
    ref = put_json(ws.cas, _with_clusters(dedup, clusters).document())
    return manifest.model_copy(update={"layers": {**manifest.layers, "dedup_clusters": ref}})


def _whole_ref(ws: Workspace, parts: Ref) -> Ref:
    """The clusters table ``parts`` names stored whole, as snapshots before parts stored it."""
    table = PartedTable.read(ws.cas, parts, "dedup clusters")
    return put_table(ws.cas, table.table(VerifiedFiles(ws.cas), "dedup clusters"))


def test_the_accounting_counts_the_same_terms_over_parts(child_home: Path) -> None:
    with open_workspace(child_home) as ws:
        parts = clusters_parts_ref(ws, TrustedFiles(ws.cas, ws.catalog), "p2")
        with Evidence.load(ws.cas, ws.catalog, _manifest(ws, "p2")) as ev:
            over_parts, read = accounting_check.per_source(ev), ev.clusters()
            ev.dedup = _with_clusters(ev.dedup, _whole_ref(ws, parts))
            assert ev.clusters() != read  # the one table is read
            whole = accounting_check.per_source(ev)
            assert over_parts == whole
    assert sum(c.terms["duplicates removed"] for c in whole.values()) > 0


def test_the_reach_scan_finds_the_same_removed_duplicates_over_parts(child_home: Path) -> None:
    with open_workspace(child_home) as ws:
        manifest = _manifest(ws, "p2")
        parts = clusters_parts_ref(ws, _files(ws), "p2")
        parted = _parted_manifest(ws, manifest, _whole_ref(ws, parts))  # stored whole
        table = PartedTable.read(ws.cas, parts, "dedup clusters")
        clusters = table.table(VerifiedFiles(ws.cas), "dedup clusters")
        removed = pc.is_in(clusters.column("verdict"), pa.array(["exact_duplicate"]))
        row = clusters.filter(removed).slice(0, 1).to_pylist()[0]
        for kind, target in (("record", row["record_id"]), ("object", row["object"])):
            expected = _sorted(_carried_by(ws.cas, manifest, kind, target))
            assert expected and _sorted(_carried_by(ws.cas, parted, kind, target)) == expected
        assert not _carried_by(ws.cas, parted, "record", "no/such-record").num_rows


def test_a_missing_clusters_part_leaves_the_deletion_inputs_incomplete(child_home: Path) -> None:
    """A parent whose clusters parts document is stored but one of its parts is not cannot
    base a child's deletion index."""
    with open_workspace(child_home) as ws:
        manifest = _manifest(ws, "p2")
        ref = clusters_parts_ref(ws, _files(ws), "p2")
        parted = _parted_manifest(ws, manifest, ref)
        assert deletion_index._inputs_stored(ws.cas, _put(ws, parted))
        table = PartedTable.read(ws.cas, ref, "dedup clusters")
        missing = "sha256:" + "0" * 64
        gone = table.parts[0].model_copy(update={"chunk": "gone", "digest": missing, "count": 0})
        count = sum(table.counts or ())
        parts = [*table.parts, gone]
        document = ChunkParts(schema=CLUSTER_PARTS_SCHEMA, code="test", count=count, parts=parts)
        broken = _parted_manifest(ws, manifest, put_json(ws.cas, document.document()))
        assert not deletion_index._inputs_stored(ws.cas, _put(ws, broken))


def _put(ws: Workspace, manifest: Manifest) -> str:
    return put_json(ws.cas, manifest.document())["digest"]


def _files(ws: Workspace) -> TrustedFiles:
    return TrustedFiles(ws.cas, ws.catalog)


def _sorted(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda row: sorted((k, str(v)) for k, v in row.items()))


def test_verify_finds_a_clusters_part_whose_rows_are_not_the_count_its_document_states(
    child_home: Path,
) -> None:
    """Readers number the clusters rows by the parts' stated counts, so ``verify`` checks each
    part's footer against them: the real parts pass; two parts whose counts are swapped (the
    total still right) are each named."""
    with open_workspace(child_home) as ws:
        manifest = _manifest(ws, "p2")
        ref = manifest.layers["dedup_clusters"]
        assert verify.cluster_counts(ws.cas, ref) == []
        table = PartedTable.read(ws.cas, load_index(ws.cas, ref, "d").output("clusters"), "c")
        counted = [n for n, part in enumerate(table.parts) if part.count]
        a = counted[0]
        b = next(n for n in counted if table.parts[n].count != table.parts[a].count)
        parts = list(table.parts)
        parts[a] = parts[a].model_copy(update={"count": table.parts[b].count})
        parts[b] = parts[b].model_copy(update={"count": table.parts[a].count})
        count = sum(table.counts or ())
        document = ChunkParts(schema=CLUSTER_PARTS_SCHEMA, code="test", count=count, parts=parts)
        forged = _parted_manifest(ws, manifest, put_json(ws.cas, document.document()))
        findings = verify.cluster_counts(ws.cas, forged.layers["dedup_clusters"])
    assert len(findings) == 2 and all(f.startswith("clusters table sha256:") for f in findings)
