"""The leakage graph: records joined by a shared group id, an exact or a verified near edge.

Vertices are the records of the dedup table (kept and removed: an edge through a removed
duplicate still joins its neighbours, since its content is in the snapshot through its
representative) plus one vertex per group id; edges are record-group memberships and the dedup
layer's published ``edges``. Records a split conflict quarantined are taken out with the removed
records standing behind them: their content is in no split. Components come from
``scipy.sparse.csgraph``, all vectors, no Python loop per record. The splits layer resolves
what this finds; the validation gate recomputes it from the published tables.
"""

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

GRAPH_COLUMNS = ["record_id", "group_id", "verdict", "representative_id"]


def component_labels(size: int, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Per vertex 0..size-1 its component's label over the undirected edges (rows, cols).
    scipy is imported here, not at module level: a build whose layers are all reused (and
    every command that only loads the build's modules) never pays its ~0.4 s of imports."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    graph = coo_matrix((np.ones(len(rows), np.int8), (rows, cols)), shape=(size, size))
    return connected_components(graph, directed=False)[1]


def dropped_with_copies(clusters: pa.Table, quarantined: Iterable[str]) -> pa.Array:
    """``quarantined`` plus every removed record whose representative is one of them."""
    out = pa.array(sorted(set(quarantined)), pa.string())
    behind = pc.is_in(clusters.column("representative_id"), value_set=out)
    removed = pc.invert(clusters.column("is_representative"))
    copies = clusters.filter(pc.and_(removed, behind)).column("record_id")
    return pa.concat_arrays([out, copies.combine_chunks().cast(pa.string())])


def components(
    clusters: pa.Table, edges: pa.Table, dropped: pa.Array, cut_groups: pa.Array | None = None
) -> pa.Table:
    """record_id -> component number over the graph without ``dropped`` (and without records
    the dedup layer excluded: repeated ids and tombstones are in no split) and without the
    group vertices ``cut_groups``."""
    live = pc.and_(
        pc.not_equal(clusters.column("verdict"), "excluded"),
        pc.invert(pc.is_in(clusters.column("record_id"), value_set=dropped)),
    )
    records = clusters.filter(live)
    ids = records.column("record_id").combine_chunks()
    n = len(ids)
    groups = pc.dictionary_encode(records.column("group_id").combine_chunks()).indices
    a = pc.index_in(edges.column("record_a"), value_set=ids)
    b = pc.index_in(edges.column("record_b"), value_set=ids)
    both = pc.and_(pc.is_valid(a), pc.is_valid(b))
    a, b = pc.filter(a, both).to_numpy(), pc.filter(b, both).to_numpy()
    joined = np.ones(n, bool)
    if cut_groups is not None:
        joined = pc.invert(pc.is_in(records["group_id"], value_set=cut_groups)).to_numpy()
    members = np.flatnonzero(joined)
    rows = np.concatenate([members, a])
    cols = np.concatenate([n + groups.to_numpy(zero_copy_only=False)[members], b])
    size = n + (int(pc.max(groups).as_py()) + 1 if n else 0)
    labels = component_labels(size, rows, cols)
    return pa.table({"record_id": ids, "component": pa.array(labels[:n].astype(np.int64))})


def straddling(component_of: pa.Table, split_of: pa.Table) -> pa.Table:
    """Components whose members (record_id, split) sit in more than one split, with each
    split's member count: columns component, split, members, sorted."""
    joined = component_of.join(split_of, "record_id", join_type="inner")
    per = joined.group_by(["component", "split"]).aggregate([("record_id", "count")])
    per = per.rename_columns(["component", "split", "members"])
    spread = per.group_by("component").aggregate([("split", "count")])
    wide = spread.filter(pc.greater(spread.column("split_count"), 1)).column("component")
    out = per.filter(pc.is_in(per.column("component"), value_set=wide.combine_chunks()))
    return out.sort_by([("component", "ascending"), ("split", "ascending")])
