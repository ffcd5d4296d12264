"""Dagster's standard table metadata, the summary first, mixture shares side by side and run
statistics kept out of the plotted numbers, read back from a real instance after two Dagster
builds of the demo partition (a cold one and a warm one whose caches are hit)."""

from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest

from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import LAYERS, read_layer_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_json, get_parquet
from corpus_assets.definitions import defs
from corpus_assets.demo import write_demo

KEY = "p1"
NUMERIC = (dg.IntMetadataValue, dg.FloatMetadataValue)
TABLE_OUTPUTS = {  # the layer index output holding each layer's main Parquet table
    "dedup_clusters": "clusters",
    "splits": "splits",
    "mixed_samples": "samples",
    "packed_blocks": "spans",
}

Metadata = dict[str, dict[str, Any]]


def _latest(instance: dg.DagsterInstance) -> Metadata:
    """Each layer's newest materialization metadata of partition ``KEY``, as stored."""
    out = {}
    for layer in LAYERS:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(layer), asset_partitions=[KEY]), limit=1
        ).records
        out[layer] = dict(records[0].asset_materialization.metadata)
    return out


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Metadata, Metadata]]:
    """The module's builds, made once (as ``demo_home`` makes a home, but for the module)."""
    tmp = tmp_path_factory.mktemp("metadata")
    job = defs.resolve_job_def("build_snapshot")
    with pytest.MonkeyPatch.context() as env:
        config = write_demo(tmp / "corpus")
        env.setenv("CORPUS_HOME", str(tmp / "corpus"))
        env.setenv("CORPUS_CONFIG", str(config))
        env.setenv("DAGSTER_HOME", str(tmp / "dagster"))
        env.delenv("CORPUS_CATALOG_URL", raising=False)
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions("snapshots", [KEY])
            assert job.execute_in_process(partition_key=KEY, instance=instance).success
            cold = _latest(instance)
            assert job.execute_in_process(partition_key=KEY, instance=instance).success
            yield cold, _latest(instance)


def _real_table(ws: Workspace, layer: str) -> tuple[int, list[str]] | None:
    """Rows and column names of the layer's main Parquet table, read from the CAS through the
    layer's index (verified); None for raw_snapshot, whose bytes are no table."""
    if layer == "canonical_records":
        table = CanonicalIndex.read(ws, KEY)[1].table()
        return table.num_rows, table.column_names
    if layer == "manifest":
        manifest = get_json(ws.cas, ws.catalog.layer_output(KEY, layer), "manifest")
        members = read_members(ws.cas, manifest["members"])
        return members.num_rows, members.column_names
    if layer not in TABLE_OUTPUTS:
        return None
    index = read_layer_index(ws, KEY, layer)[1]
    table = PartedTable.read(ws.cas, index.output(TABLE_OUTPUTS[layer]), layer)  # or parts
    files = [get_parquet(ws.cas, ref, layer) for ref in table.refs]
    return sum(f.metadata.num_rows for f in files), files[0].schema_arrow.names


def test_each_layer_reports_row_count_and_column_schema_of_its_real_table(
    two_builds: tuple[Metadata, Metadata],
) -> None:
    _, meta = two_builds
    with open_workspace() as ws:
        for layer in LAYERS:
            real = _real_table(ws, layer)
            metadata = meta[layer]
            if real is None:
                objects = read_layer_index(ws, KEY, layer)[1].output("objects")
                assert metadata["dagster/row_count"].value == len(objects)
                assert "dagster/column_schema" not in metadata
                continue
            rows, columns = real
            assert metadata["dagster/row_count"].value == rows, layer
            schema = metadata["dagster/column_schema"].value
            assert [c.name for c in schema.columns] == columns, layer
    spec = {s.key.path[-1]: s for s in defs.resolve_all_asset_specs()}
    declared = spec["dedup_clusters"].metadata["dagster/column_schema"].value  # before any run
    assert {c.name: c.type for c in declared.columns}["match_jaccard"] == "double"


def test_the_summary_comes_first(two_builds: tuple[Metadata, Metadata]) -> None:
    for layer, metadata in two_builds[1].items():
        assert next(iter(metadata)) == "summary", (layer, list(metadata)[:3])
        assert isinstance(metadata["summary"], dg.MarkdownMetadataValue)


def test_run_statistics_are_one_json_entry_never_a_plotted_number(
    two_builds: tuple[Metadata, Metadata],
) -> None:
    """Same bytes twice, caches cold then warm: every plotted number describes the data, so
    it is the same both times; what the runs did differs, and only under ``run``."""
    cold, warm = two_builds
    for layer in LAYERS:
        assert cold[layer]["index_digest"] == warm[layer]["index_digest"], layer
        numbers = [
            {k: v.value for k, v in m[layer].items() if isinstance(v, NUMERIC)}
            for m in (cold, warm)
        ]
        assert numbers[0] == numbers[1], layer
    assert cold["canonical_records"]["run"].value != warm["canonical_records"]["run"].value
    for metadata in (*cold.values(), *warm.values()):
        run = metadata.get("run", dg.MetadataValue.json({}))
        assert isinstance(run, dg.JsonMetadataValue)
        stats = run.value
        plotted = {k for k, v in metadata.items() if isinstance(v, NUMERIC)}
        assert not plotted & ({*stats} | {f"run.{k}" for k in stats}), plotted
        assert not {k for k in plotted if k.startswith("run")}, plotted


def test_target_and_realised_shares_sit_together_per_source(
    two_builds: tuple[Metadata, Metadata],
) -> None:
    mixed = two_builds[1]["mixed_samples"]
    labels = list(mixed)
    sources = [row.data["source"] for row in mixed["mixing_report"].value.records]
    assert sources == ["essays", "dialogs", "chats"]
    for source in sources:
        names = [f"share.{source}.{s}" for s in ("target", "realised_docs", "realised_tokens")]
        assert all(isinstance(mixed[n], dg.FloatMetadataValue) for n in names), source
        start = labels.index(names[0])
        assert labels[start : start + 3] == names  # listed, and so plotted, side by side
        assert mixed[names[1]].value == pytest.approx(mixed[names[0]].value)  # natural mix
