"""Samples located by the partitioned join (``packing.locate``) are the old whole-table join's
places, whatever the partition or worker count; a missing or doubled row is named; the driver
is left holding fixed-width columns, no string per sample."""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml

from corpus_assets.core.pipeline import DIRECT_BUILDERS, build_all
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import LayerIndex, read_layer_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.tokens.cache import TokenCache, open_tokens, token_cache
from corpus_assets.core.tokens.spec import resolve_tokenizer
from corpus_assets.core.training_view.packing.locate import (
    KINDS,
    PartitionWriter,
    PartJob,
    join_part,
    record_parts,
)
from corpus_assets.core.training_view.packing.samples import (
    ROW_KEY,
    SampleLookupError,
    locate_samples,
)
from corpus_assets.demo import write_demo
from corpus_assets_tests.core.publication.test_packed_layer import PAIRS


@dataclass(frozen=True)
class Built:
    """The demo (with a preference source) built once: what locating needs."""

    config: Path
    samples: list[str]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    home = tmp_path_factory.mktemp("locate") / "corpus"
    config = write_demo(home)
    folder = home / "demo-sources" / "prefs"
    folder.mkdir()
    (folder / "prefs-00000.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    document = yaml.safe_load(config.read_text())
    document["sources"].append(
        {"id": "prefs", "kind": "objects", "path": "demo-sources/prefs", "adapter": "preference.v1"}
    )
    document["policies"]["splits"].update(
        {"train_percent": 100, "validation_percent": 0, "test_percent": 0}
    )
    document["policies"]["packing"]["block_tokens"] = 256
    config.write_text(yaml.safe_dump(document))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CORPUS_HOME", str(home))
        env.setenv("CORPUS_CONFIG", str(config))
        env.delenv("CORPUS_CATALOG_URL", raising=False)
        with open_workspace(config) as ws:
            build_all(ws, "p1")
            _ref, mixed = read_layer_index(ws, "p1", "mixed_samples")
            order = get_table(ws.cas, mixed.output("samples"), "samples", ["record_id"])
        yield Built(config, order.column("record_id").to_pylist())


def _parts(ws: Workspace) -> tuple[CanonicalIndex, TokenCache, LayerIndex]:
    canonical = CanonicalIndex.read(ws, "p1")[1]
    _ref, dedup = read_layer_index(ws, "p1", "dedup_clusters")
    return canonical, token_cache(ws, canonical.chunks(), resolve_tokenizer(ws)), dedup


def _old_join(ws: Workspace, samples: list[str]) -> dict[str, list]:
    """The replaced lookup's answer, as one table of every member row in memory: members
    joined to the canonical rows on (record id, object, line), samples looked up by id."""
    canonical, cache, dedup = _parts(ws)
    clusters = PartedTable.read(ws.cas, dedup.output("clusters"), "c").table(
        VerifiedFiles(ws.cas), "c"
    )
    members = clusters.filter(clusters.column("is_representative")).select(ROW_KEY)
    tables = []
    for n, (chunk, cached) in enumerate(zip(canonical.chunks(), cache.chunks, strict=True)):
        table = get_table(ws.cas, chunk.records, "records", [*ROW_KEY, "kind"])
        arrays = open_tokens(ws, cached, cache.spec, ids=False)
        tables.append(
            table.append_column("chunk", pa.array(np.full(table.num_rows, n)))
            .append_column("row", pa.array(np.arange(table.num_rows)))
            .append_column("length", pa.array(arrays.counts()))
            .append_column("pair_split", pa.array(np.asarray(arrays.pair_splits)))
        )
    rows = members.join(pa.concat_tables(tables), ROW_KEY, join_type="inner").to_pylist()
    by_id = {row["record_id"]: row for row in rows}
    assert len(by_id) == len(rows)
    found = [by_id[sample] for sample in samples]
    columns = {name: [row[name] for row in found] for name in ("chunk", "row", "length")}
    columns["pair_split"] = [row["pair_split"] for row in found]
    columns["kind"] = [KINDS.index(row["kind"]) for row in found]
    return columns


@pytest.mark.parametrize(("workers", "partitions"), [(1, 1), (1, 5), (2, None)])
def test_located_columns_are_the_old_joins(built: Built, workers: int, partitions: int) -> None:
    """Repeated samples and preference pairs included; 2 workers run the partitions' joins
    in the spawn pool (``in_process_bytes`` 0)."""
    samples = [*built.samples, *built.samples[::-3], built.samples[7]]
    document = yaml.safe_load(built.config.read_text())
    document["execution"] = {"workers": workers, "in_process_bytes": 0}
    config = built.config.with_name(f"locate-{workers}-{partitions}.yaml")
    config.write_text(yaml.safe_dump(document))
    with open_workspace(config) as ws:
        want = _old_join(ws, samples)
        canonical, cache, dedup = _parts(ws)
        order = pa.chunked_array([pa.array(samples[:100]), pa.array(samples[100:])])
        with locate_samples(ws, canonical, cache, order, dedup, partitions=partitions) as rows:
            got = {name: np.asarray(getattr(rows, name)).tolist() for name in want}
            ids = rows.record_ids.take(np.arange(len(samples))).to_pylist()
            folder = rows.folder
        assert not folder.exists()  # closed: the located columns are gone from tmp
    assert got == want
    assert ids == samples
    assert KINDS.index("preference") in got["kind"] and max(got["pair_split"]) > 0
    assert len(set(samples)) < len(samples)


def test_the_driver_holds_fixed_width_columns_no_string_per_sample(built: Built) -> None:
    """~50k samples: what ``locate_samples`` returns holds no Arrow memory (the old join kept
    every sample's record id and kind as Arrow strings) and its columns are memory-mapped."""
    samples = pa.chunked_array([pa.array(built.samples * (50_000 // len(built.samples)))])
    with open_workspace(built.config) as ws:
        canonical, cache, dedup = _parts(ws)
        before = pa.total_allocated_bytes()
        rows = locate_samples(ws, canonical, cache, samples, dedup)
        held = pa.total_allocated_bytes() - before
        assert held < 4096, f"{held} bytes of Arrow memory held for {len(samples)} samples"
        values = list(vars(rows).values())
        assert not any(isinstance(v, pa.Array | pa.ChunkedArray | list) for v in values)
        for name in ("chunk", "row", "length", "pair_split", "kind"):
            assert isinstance(getattr(rows, name), np.memmap) and getattr(rows, name).ndim == 1
        assert rows.kind.dtype == np.int8
        rows.close()


def test_a_missing_sample_is_named_first_in_stream_order(built: Built) -> None:
    """Two unknown records in different partitions: the error names the earlier sample."""
    late, early = "nope/late", "nope/early"
    assert len(set(record_parts(pa.array([late, early]), 7).tolist())) == 2
    samples = [*built.samples[:5], early, *built.samples[5:], late]
    with open_workspace(built.config) as ws:
        canonical, cache, dedup = _parts(ws)
        with pytest.raises(SampleLookupError, match=r"'nope/early' has no kept .* \(2 samples"):
            locate_samples(ws, canonical, cache, pa.chunked_array([samples]), dedup, partitions=7)
        assert not list((ws.home / "tmp").glob("pack-samples-*"))  # nothing left behind


def test_a_member_on_two_rows_is_named(tmp_path: Path) -> None:
    """A partition whose member key matches two canonical rows: the sample is named."""
    writer = PartitionWriter(tmp_path, 2)
    writer.write("samples", pa.table({"pos": [0, 1, 2], "record_id": ["a/1", "b/2", "a/1"]}))
    writer.write("members", pa.table({"record_id": ["a/1", "b/2"], "object": [0, 0],
                                      "line": [1, 2]}))  # fmt: skip
    rows = {"record_id": ["a/1", "a/1", "b/2"], "object": [0] * 3, "line": [1, 1, 2],
            "kind": ["document"] * 3, "chunk": [0, 1, 0], "row": [0, 0, 1], "length": [5] * 3,
            "pair_split": [0] * 3}  # fmt: skip
    writer.write("rows", pa.table(rows))
    writer.close()
    reports = [join_part(None, PartJob(str(tmp_path), part), None, None) for part in (0, 1)]  # type: ignore[arg-type]
    assert sum(r.found for r in reports) == 5 and sum(r.samples for r in reports) == 3
    assert min(r.first_twice for r in reports if r.first_twice[0] >= 0) == (0, "a/1")


def test_a_full_build_is_the_same_bytes_at_one_and_two_workers(built: Built) -> None:
    """The packed layer rebuilt with two workers (partitions and shards in the spawn pool):
    the same index digest, so the same shards, spans and counts."""
    digests = []
    for workers in (1, 2):
        document = yaml.safe_load(built.config.read_text())
        document["execution"] = {"workers": workers, "in_process_bytes": 0}
        config = built.config.with_name(f"layer-{workers}.yaml")
        config.write_text(yaml.safe_dump(document))
        with open_workspace(config) as ws:
            digests.append(DIRECT_BUILDERS["packed_blocks"](ws, "p1").digest)
    assert digests[0] == digests[1]
