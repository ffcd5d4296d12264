"""Record-level lineage, both directions, against a real built, activated and read snapshot.

Every field of an answer is checked against the layer tables read here independently (whole,
with ``get_table``: the demo is small) and against the raw object's bytes: the line found at the
recorded byte offset is the record's row. The demo's mixing is given a budget above the train
split (so records repeat across passes) and its packing small shards (so there are several).
"""

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus_assets.assets.lineage_jobs import record_lineage_run_config
from corpus_assets.core.audit.record_lineage import RecordNotFound, record_lineage
from corpus_assets.core.audit.span_records import SpanQuery, SpanQueryError, span_records
from corpus_assets.core.consumption.training import take_permit
from corpus_assets.core.dedup.explain import explain
from corpus_assets.core.governance import states
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.publication.publish import activate, approve
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import read_manifest
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.storage.digests import sha256_digest
from corpus_assets.core.storage.table_lookup import SortedTable
from corpus_assets.core.training_view.packing import shards as pack_shards
from corpus_assets.definitions import defs
from corpus_assets.demo import write_demo

SHARD_BLOCKS = 40  # blocks per shard: the demo's ~350 blocks make several shards
BLOCK_BYTES = 256 * (2 + 2 + 2 + 1)  # 256 tokens of input_ids, segment_ids, positions, label_mask
CLI = str(Path(sys.executable).with_name("corpus-assets"))


@dataclass(frozen=True)
class Built:
    home: Path
    config: Path
    sid: str


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """One demo snapshot with repeats and several shards, ACTIVE, read by run ``run-a``."""
    root = tmp_path_factory.mktemp("record-lineage")
    home = root / "corpus"
    config = write_demo(home)
    text = config.read_text()
    mixing = "mixing: {seed: demo-mix-v1, budget: 400, max_epochs: 3}"
    config.write_text(text.replace("mixing: {seed: demo-mix-v1}", mixing))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CORPUS_HOME", str(home))
        patch.setenv("CORPUS_CONFIG", str(config))
        patch.setenv("DAGSTER_HOME", str(root / "dagster"))
        patch.delenv("CORPUS_CATALOG_URL", raising=False)
        patch.setattr(pack_shards.build_shards, "__defaults__", (SHARD_BLOCKS * BLOCK_BYTES, None))
        with open_workspace() as ws:
            sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
            assert validate_snapshot(ws, sid).ok
            approve(ws, sid, "reviewer")
            activate(ws, sid, "publisher")
            take_permit(ws.cas, ws.catalog, sid, "run-a", ws.config.purpose)
        yield Built(home, config, sid)


@pytest.fixture
def ws(built: Built, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workspace]:
    monkeypatch.setenv("CORPUS_HOME", str(built.home))
    monkeypatch.setenv("CORPUS_CONFIG", str(built.config))
    with open_workspace() as opened:
        yield opened


class Layers:
    """The snapshot's tables, read whole: the independent reference."""

    def __init__(self, ws: Workspace, sid: str) -> None:
        self.ws = ws
        self.snapshot = states.get(ws.catalog, sid)
        self.manifest = read_manifest(ws.cas, self.snapshot.manifest_digest)
        self.canonical = CanonicalIndex.load(ws.cas, self.manifest.layers["canonical_records"])
        self.records = self.canonical.table([c for c in self.canonical_columns()])
        self.members = read_members(ws.cas, self.manifest.members)
        self.clusters = self.output("dedup_clusters", "clusters")
        self.splits = self.output("splits", "splits")
        self.samples = self.output("mixed_samples", "samples")
        self.spans = self.output("packed_blocks", "spans")
        packed = load_index(ws.cas, self.manifest.layers["packed_blocks"], "packed_blocks")
        self.shards = [ref["digest"] for ref in packed.outputs["shards"]]

    @staticmethod
    def canonical_columns() -> list[str]:
        return ["record_id", "source_id", "object", "line", "byte_offset", "record_digest"]

    def output(self, layer: str, name: str) -> pa.Table:
        index = load_index(self.ws.cas, self.manifest.layers[layer], layer)
        table = PartedTable.read(self.ws.cas, index.output(name), name)  # whole or chunk parts
        rows = table.table(VerifiedFiles(self.ws.cas), name)
        if name != "clusters":
            return rows
        return rows.sort_by([(k, "ascending") for k in ("record_id", "object", "line")])

    def rows(self, table: pa.Table, column: str, value: Any) -> list[dict[str, Any]]:
        return table.filter(pc.equal(table.column(column), value)).to_pylist()

    def raw(self, digest: str) -> bytes:
        """The pinned object's decompressed bytes."""
        data = self.ws.cas.get_bytes(digest)
        if data.startswith(b"\x28\xb5\x2f\xfd"):
            return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
        return data

    def spans_of(self, record_id: str) -> list[tuple]:
        return sorted(
            (r["block"], r["start"], r["end"], r["record_offset"], r["sample"], r["shard"])
            for r in self.rows(self.spans, "record_id", record_id)
        )


def _spans(answer_spans: list[dict[str, Any]]) -> list[tuple]:
    return sorted(
        (s["block"], s["start"], s["end"], s["record_offset"], s["sample"], s["shard_index"])
        for s in answer_spans
    )


def _check_origin(layers: Layers, answer: dict[str, Any], local_id: str | None) -> None:
    """The line at the recorded byte offset is the record's raw row, at the recorded line."""
    origin = answer["origin"]
    data = layers.raw(origin["object"]["digest"])
    offset = origin["byte_offset"]
    assert offset == 0 or data[offset - 1 : offset] == b"\n"
    line = data[offset:].split(b"\n", 1)[0].removesuffix(b"\r")
    assert data[:offset].count(b"\n") + 1 == origin["line"]
    assert origin["raw_line"] == {"bytes": len(line), "sha256": sha256_digest(line)}
    if local_id is not None:
        assert json.loads(line)["id"] == local_id


def test_a_member_traces_to_its_raw_line_split_repeated_samples_spans_and_run(
    ws: Workspace, built: Built
) -> None:
    layers = Layers(ws, built.sid)
    counts = pc.value_counts(layers.samples.column("record_id")).to_pylist()
    repeated = {c["values"] for c in counts if c["counts"] > 1}
    picked = {}  # one repeated member from each pinned object: compressed and plain
    for member in layers.members.to_pylist():
        if member["record_id"] in repeated:
            picked.setdefault(member["object"], member)
    assert len(picked) == 4
    for member in picked.values():
        rid = member["record_id"]
        answer = record_lineage(ws.cas, ws.catalog, layers.snapshot, rid, ws.config)
        (row,) = layers.rows(layers.records, "record_id", rid)
        assert answer["status"] == "member"
        origin = answer["origin"]
        assert (origin["source_id"], origin["object"]["digest"], origin["line"]) == (
            row["source_id"],
            row["object"],
            row["line"],
        )
        assert (origin["byte_offset"], origin["record_digest"]) == (
            row["byte_offset"],
            row["record_digest"],
        )
        assert origin["record_digest"] == member["record_digest"]
        _check_origin(layers, answer, rid.split("/", 1)[1])
        assert answer["canonical"]["replay"]["reproduced"] is True
        (split,) = layers.rows(layers.splits, "record_id", rid)
        assert answer["split"]["split"] == split["split"] == member["split"] == "train"
        samples = layers.rows(layers.samples, "record_id", rid)
        assert len(answer["samples"]) == len(samples) >= 2
        assert sorted((s["position"], s["repeat"]) for s in answer["samples"]) == sorted(
            (s["position"], s["repeat"]) for s in samples
        )
        assert len({s["repeat"] for s in answer["samples"]}) == len(samples)  # each pass once
        assert _spans(answer["packed"]) == layers.spans_of(rid)
        repeat_at = {s["position"]: s["repeat"] for s in samples}
        for span in answer["packed"]:
            assert span["shard"] == layers.shards[span["shard_index"]]
            assert span["repeat"] == repeat_at[span["sample"]]
        (run,) = answer["runs"]["permits"]
        assert (run["run_id"], run["read_record"]) == ("run-a", True)
        assert run["blocks"] == sorted({s["block"] for s in answer["packed"]})


def test_canonical_stages_report_pii_counts_and_replayed_repairs(
    ws: Workspace, built: Built
) -> None:
    snapshot = states.get(ws.catalog, built.sid)
    chat = record_lineage(ws.cas, ws.catalog, snapshot, "chats/c000", ws.config)["canonical"]
    assert (chat["kind"], chat["adapter"]) == ("messages", "chat-messages.v1")
    assert chat["pii_redacted"] == chat["replay"]["pii"] == {"email": 1}
    assert chat["stages_passed"][-1] == "contamination" and chat["reason"] is None
    folded = record_lineage(ws.cas, ws.catalog, snapshot, "essays/e0007", ws.config)["canonical"]
    assert folded["replay"]["reproduced"] and folded["replay"]["repairs"]  # NFC folded "Café"
    plain = record_lineage(ws.cas, ws.catalog, snapshot, "essays/e0008", ws.config)["canonical"]
    assert plain["replay"]["reproduced"] and plain["replay"]["repairs"] == {}
    no_config = record_lineage(ws.cas, ws.catalog, snapshot, "essays/e0008")["canonical"]
    assert no_config["replay"]["replayed"] is False


@pytest.mark.parametrize("rid", ["essays/e0004", "essays/e0020"])
def test_a_removed_duplicate_shows_its_verdict_evidence_and_the_record_that_carried_it(
    ws: Workspace, built: Built, rid: str
) -> None:
    layers = Layers(ws, built.sid)
    answer = record_lineage(ws.cas, ws.catalog, layers.snapshot, rid, ws.config)
    (row,) = layers.rows(layers.clusters, "record_id", rid)
    assert row["verdict"] in ("exact_duplicate", "near_duplicate")
    assert answer["status"] == "removed_by_dedup" and row["verdict"] in answer["why"]
    assert answer["dedup"] == explain(ws.cas, layers.manifest, rid)  # the dedup command's answer
    assert answer["dedup"]["record"]["match_jaccard"] == row["match_jaccard"]
    assert layers.rows(layers.members, "record_id", rid) == []
    assert answer["split"]["split"] is None and answer["samples"] == answer["packed"] == []
    _check_origin(layers, answer, rid.split("/", 1)[1])
    carried = answer["carried_by"]
    assert carried["record_id"] == row["representative_id"]
    reference = layers.spans_of(row["representative_id"])
    assert _spans(carried["packed"]) == reference
    (split,) = layers.rows(layers.splits, "record_id", row["representative_id"])
    assert bool(reference) == (split["split"] == "train")  # only the train split is packed
    (run,) = answer["runs"]["permits"]
    assert run["read_record"] is False
    assert run["read_content_via"] == (row["representative_id"] if reference else None)


def test_the_dedup_evidence_is_the_clusters_and_splits_tables(ws: Workspace, built: Built) -> None:
    """The verdict's cluster (same representative) and leakage group (with splits), for
    removed duplicates and for a kept record of a dialog thread (a group of several)."""
    layers = Layers(ws, built.sid)
    threads = pc.value_counts(layers.members.column("group_id")).to_pylist()
    thread = next(
        t["values"] for t in threads if t["values"].startswith("dialogs/") and t["counts"] > 1
    )
    (turn, *_) = layers.rows(layers.members, "group_id", thread)
    split_of = {r["record_id"]: r["split"] for r in layers.splits.to_pylist()}
    for rid in ("essays/e0004", "essays/e0020", "dialogs/copied", turn["record_id"]):
        dedup = record_lineage(ws.cas, ws.catalog, layers.snapshot, rid)["dedup"]
        (row,) = layers.rows(layers.clusters, "record_id", rid)
        assert dedup["record"] == row
        cluster = layers.rows(layers.clusters, "representative_id", row["representative_id"])
        assert [r["record_id"] for r in dedup["cluster"]] == [r["record_id"] for r in cluster]
        group = layers.rows(layers.clusters, "leakage_id", row["leakage_id"])
        assert dedup["leakage_group"]["records"] == [
            {
                "record_id": r["record_id"],
                "verdict": r["verdict"],
                "split": split_of.get(r["record_id"]),
            }
            for r in group
        ]
    assert len(group) > len(cluster) == 1  # the thread's group is wider than the record's cluster


def test_a_quarantined_row_is_found_by_location_or_by_its_id(ws: Workspace, built: Built) -> None:
    layers = Layers(ws, built.sid)
    excluded = {(r["name"], r["line"]): r for r in layers.canonical.excluded_rows()}
    snapshot = layers.snapshot
    for rid, where, local in [
        ("essays/essays-00000.jsonl.zst#L121", ("essays-00000.jsonl.zst", 121), None),
        ("chats/not-a-chat", ("chats-00000.jsonl", 21), "not-a-chat"),
    ]:
        answer = record_lineage(ws.cas, ws.catalog, snapshot, rid, ws.config)
        row = excluded[where]
        assert answer["status"] == "quarantined"
        assert answer["canonical"]["reason"] == row["reason"]
        assert answer["canonical"]["replay"]["reason"] == row["reason"]
        assert (answer["origin"]["object"]["digest"], answer["origin"]["line"]) == (
            row["object"],
            row["line"],
        )
        _check_origin(layers, answer, local)
        assert answer["samples"] == answer["packed"] == [] and answer["dedup"] is None


def test_an_unknown_record_is_an_error_naming_it_and_the_snapshot(
    ws: Workspace, built: Built
) -> None:
    snapshot = states.get(ws.catalog, built.sid)
    for rid in ("essays/nope", "nosource/x", "essays/essays-00000.jsonl.zst#L999"):
        with pytest.raises(RecordNotFound, match=f"record '{rid}' is not in snapshot {built.sid}"):
            record_lineage(ws.cas, ws.catalog, snapshot, rid)


def test_every_span_of_a_few_shards_maps_to_records_and_back(ws: Workspace, built: Built) -> None:
    layers = Layers(ws, built.sid)
    assert len(layers.shards) >= 3
    for shard in (0, len(layers.shards) - 1):
        named = layers.shards[shard] if shard else "0"  # by digest and by position
        answer = span_records(ws.cas, ws.catalog, layers.snapshot, SpanQuery(shard=named))
        mine = layers.spans.filter(pc.equal(layers.spans.column("shard"), shard))
        assert _spans(answer["spans"]) == sorted(
            (r["block"], r["start"], r["end"], r["record_offset"], r["sample"], r["shard"])
            for r in mine.to_pylist()
        )
        for span in answer["spans"]:
            (record,) = layers.rows(layers.records, "record_id", span["record_id"])
            assert (span["object"], span["line"], span["byte_offset"]) == (
                record["object"],
                record["line"],
                record["byte_offset"],
            )
            back = record_lineage(ws.cas, ws.catalog, layers.snapshot, span["record_id"])
            assert (span["block"], span["start"], span["end"]) in {
                (s["block"], s["start"], s["end"]) for s in back["packed"]
            }
            for other in back["packed"]:  # record -> span -> records holds it again
                query = SpanQuery(block=other["block"], start=other["start"], end=other["end"])
                found = span_records(ws.cas, ws.catalog, layers.snapshot, query)
                assert span["record_id"] in found["records"]


def test_a_token_range_lists_only_the_spans_it_overlaps(ws: Workspace, built: Built) -> None:
    layers = Layers(ws, built.sid)
    counts = pc.value_counts(layers.spans.column("block")).to_pylist()
    block = next(c["values"] for c in counts if c["counts"] >= 2)
    first, second = sorted(layers.rows(layers.spans, "block", block), key=lambda r: r["start"])[:2]
    query = SpanQuery(block=block, start=second["start"], end=second["start"] + 1)
    answer = span_records(ws.cas, ws.catalog, layers.snapshot, query)
    assert [s["record_id"] for s in answer["spans"]] == [second["record_id"]]
    query = SpanQuery(block=block, start=first["end"] - 1, end=second["start"] + 1)
    assert len(span_records(ws.cas, ws.catalog, layers.snapshot, query)["spans"]) == 2
    with pytest.raises(SpanQueryError, match="holds blocks"):
        span_records(ws.cas, ws.catalog, layers.snapshot, SpanQuery(shard="1", block=0))
    with pytest.raises(SpanQueryError, match="no shard"):
        span_records(ws.cas, ws.catalog, layers.snapshot, SpanQuery(shard="sha256:" + "0" * 64))


def _cli(built: Built, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    env.update(CORPUS_HOME=str(built.home), CORPUS_CONFIG=str(built.config))
    return subprocess.run(
        [CLI, "lineage", built.sid, *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_cli_answers_in_text_and_json_and_refuses_an_unknown_record(built: Built) -> None:
    shown = _cli(built, "--record", "essays/e0004")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"record essays/e0004 in snapshot {built.sid}")
    assert "status     removed_by_dedup" in shown.stdout and "carried " in shown.stdout
    spans = json.loads(_cli(built, "--shard", "0", "--block", "3", "--format", "json").stdout)
    assert spans["blocks"] == [3, 3] and spans["spans"]
    missing = _cli(built, "--record", "essays/nope")
    assert missing.returncode == 1
    assert f"error: record 'essays/nope' is not in snapshot {built.sid}" in missing.stderr


def test_the_record_lineage_job_shows_the_answer_on_its_run(ws: Workspace, built: Built) -> None:
    job = defs.resolve_job_def("record_lineage")
    snapshot = states.get(ws.catalog, built.sid)
    expected = record_lineage(ws.cas, ws.catalog, snapshot, "essays/e0004", ws.config)
    assert expected["carried_by"]["packed"]  # its representative is in the train split
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("snapshots", ["p1"])
        result = job.execute_in_process(
            record_lineage_run_config(built.sid, "essays/e0004"), instance=instance
        )
        (output,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
        metadata = output.event_specific_data.metadata
        assert metadata["record_lineage_json"].value == json.loads(json.dumps(expected))
        markdown = metadata["record_lineage"].value
        assert (
            "essays/e0004" in markdown and expected["carried_by"]["packed"][0]["shard"] in markdown
        )
        # a lookup is no event of the snapshot: the partition's newest observation stays its state
        assert result.asset_observations_for_node("trace_lineage") == []
        block = expected["carried_by"]["packed"][0]["block"]
        spans = job.execute_in_process(
            record_lineage_run_config(built.sid, block=block), instance=instance
        )
        (output,) = [e for e in spans.all_events if e.event_type_value == "STEP_OUTPUT"]
        records = output.event_specific_data.metadata["record_lineage_json"].value["records"]
        assert expected["carried_by"]["record_id"] in records
        failed = job.execute_in_process(
            record_lineage_run_config(built.sid, "essays/nope"),
            instance=instance,
            raise_on_error=False,
        )
        assert not failed.success
        assert "record 'essays/nope' is not in snapshot" in str(
            failed.failure_data_for_node("trace_lineage").error
        )


@settings(max_examples=40, deadline=None)
@given(
    keys=st.lists(st.integers(0, 30), min_size=1, max_size=60),
    group=st.integers(1, 7),
    low=st.integers(-2, 32),
    width=st.integers(0, 10),
)
def test_sorted_lookup_over_any_row_groups_equals_a_filter(
    tmp_path_factory: pytest.TempPathFactory, keys: list[int], group: int, low: int, width: int
) -> None:
    """Keys repeated across row-group boundaries, tables written without statistics (as the
    pinned writer does): bisection finds exactly what a full filter finds."""
    path = tmp_path_factory.mktemp("sorted") / "t.parquet"
    keys.sort()
    table = pa.table({"k": keys, "v": [f"v{n}" for n in range(len(keys))]})
    pq.write_table(table, path, row_group_size=group, write_statistics=False)
    with SortedTable(str(path), "k") as sorted_table:
        wanted = [low, low + width]
        assert (
            sorted_table.rows(wanted, ["v"]).to_pylist()
            == table.filter(pc.is_in(table.column("k"), pa.array(wanted))).to_pylist()
        )
        between = sorted_table.between(low, low + width, ["v"]).to_pylist()
    keep = pc.and_(
        pc.greater_equal(table.column("k"), low), pc.less_equal(table.column("k"), low + width)
    )
    assert between == table.filter(keep).to_pylist()
