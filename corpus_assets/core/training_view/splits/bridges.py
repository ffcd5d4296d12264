"""Which newcomers bridge two splits: the records ``quarantine_new`` excludes, and no others.

In a conflicted component (its parent members sit in two splits), take the old records (those
with a parent split) and the groups holding one out of the leakage graph; what is left falls
into regions of newcomers (kept or removed) joined by new groups and edges. A region touching
old records (by an edge or an old group) of one split joins that split; a region touching two
or more is a bridge: its kept newcomers are quarantined (``split.bridge``) and its removed ones
unlinked (``split.bridge_copy``), so no path through a newcomer joins two splits. Old
records linked directly are the residual rule's business (``splits``).
"""

from dataclasses import dataclass

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.training_view.leakage_graph import components
from corpus_assets.core.training_view.view_queries import RECORD_ORDER


@dataclass(frozen=True)
class LeakageGraph:
    """The dedup layer's clusters (record_id, group_id, leakage_id, verdict, representative_id,
    is_representative) and edges (record_a, record_b)."""

    clusters: pa.Table
    edges: pa.Table

    def component(self, leakage_id: str) -> "LeakageGraph":
        return self.within(pa.array([leakage_id], pa.string()))

    def within(self, leakage_ids: pa.Array) -> "LeakageGraph":
        """The sub-graph of these leakage components (edges never leave a component)."""
        own = self.clusters.filter(pc.is_in(self.clusters["leakage_id"], value_set=leakage_ids))
        ids = own["record_id"].combine_chunks()
        inside = pc.is_in(self.edges["record_a"], value_set=ids)
        return LeakageGraph(own, self.edges.filter(inside))


GRAPH_CLUSTER_COLUMNS = [
    "record_id",
    "group_id",
    "leakage_id",
    "verdict",
    "representative_id",
    "is_representative",
]


@dataclass(frozen=True)
class StoredGraph:
    """The leakage graph left in the dedup layer's Parquet files (``clusters`` and ``edges``
    are numbered relations over ``con``): only the components asked for are read, as a
    ``LeakageGraph``: clusters rows in record order (``RECORD_ORDER``: chunk parts are not in
    it as a whole), edges in their file's order."""

    con: duckdb.DuckDBPyConnection
    clusters: str
    edges: str

    def component(self, leakage_id: str) -> LeakageGraph:
        return self.within(pa.array([leakage_id], pa.string()))

    def within(self, leakage_ids: pa.Array) -> LeakageGraph:
        self.con.register("graph_ids", pa.table({"leakage_id": leakage_ids.cast(pa.string())}))
        own = self.con.sql(
            f"SELECT {', '.join(GRAPH_CLUSTER_COLUMNS)} FROM {self.clusters} "
            f"WHERE leakage_id IN (SELECT leakage_id FROM graph_ids) ORDER BY {RECORD_ORDER}"
        ).to_arrow_table()
        self.con.unregister("graph_ids")
        self.con.register("graph_records", own.select(["record_id"]))
        edges = self.con.sql(
            f"SELECT record_a, record_b FROM {self.edges} "
            "WHERE record_a IN (SELECT record_id FROM graph_records) ORDER BY file_row_number"
        ).to_arrow_table()
        self.con.unregister("graph_records")
        return LeakageGraph(own, edges)


AnyGraph = LeakageGraph | StoredGraph


def bridge_regions(graph: LeakageGraph, parent: pa.Table) -> pa.Table:
    """Per newcomer record of ``graph`` (one component): record_id, is_representative and
    ``split``: the one split its region touches, or null for a bridge."""
    old = parent.join(graph.clusters.select(["record_id"]), "record_id", join_type="inner")
    old_ids = old["record_id"].combine_chunks()
    records = graph.clusters
    old_groups = pc.unique(
        records.filter(pc.is_in(records["record_id"], value_set=old_ids))["group_id"]
    )
    region = components(records, graph.edges, old_ids, old_groups)
    touched = pa.concat_tables([_by_edges(graph, region, old), _by_groups(graph, region, old)])
    per = touched.group_by("component").aggregate([("split", "count_distinct"), ("split", "min")])
    one = per.filter(pc.equal(per["split_count_distinct"], 1))
    decided = pa.table({"component": one["component"], "split": one["split_min"]})
    flags = graph.clusters.select(["record_id", "is_representative"])
    out = region.join(decided, "component", join_type="left outer").join(flags, "record_id")
    return out.select(["record_id", "is_representative", "split"]).sort_by("record_id")


def _by_edges(graph: LeakageGraph, region: pa.Table, old: pa.Table) -> pa.Table:
    """(component, split) for every edge between a newcomer region and an old record."""
    edges = graph.edges.select(["record_a", "record_b"])
    flipped = edges.rename_columns(["record_b", "record_a"]).select(["record_a", "record_b"])
    both = pa.concat_tables([edges, flipped])
    hits = both.join(
        region.rename_columns(["record_a", "component"]), "record_a", join_type="inner"
    ).join(old.rename_columns(["record_b", "split"]), "record_b", join_type="inner")
    return hits.select(["component", "split"])


def _by_groups(graph: LeakageGraph, region: pa.Table, old: pa.Table) -> pa.Table:
    """(component, split) for every group holding a newcomer region and an old record."""
    groups = graph.clusters.select(["record_id", "group_id"])
    new_groups = region.join(groups, "record_id").select(["component", "group_id"])
    old_groups = old.join(groups, "record_id").select(["group_id", "split"])
    return new_groups.join(old_groups, "group_id", join_type="inner").select(["component", "split"])
