"""packed_blocks end to end on the demo: planned packing into verified shards, packed equals
unpacked, labels inside segments, accounting, overlong and tail policies, determinism."""

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml

from corpus_assets.core.governance import states
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.release.block_reader import BlockReader
from corpus_assets.core.release.packing_check import packing_findings
from corpus_assets.core.release.validation import validate_snapshot
from corpus_assets.core.runtime.layers import read_layer_index
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_json, get_table, put_table
from corpus_assets.core.tokens.spec import UTF8_IDS

PAD = UTF8_IDS["pad"]


def _workspace(demo_home: Path, name: str, packing: dict) -> Workspace:
    """The demo with its packing policy updated and every record in train (so all pack)."""
    document = yaml.safe_load((demo_home / "corpus.yaml").read_text())
    document["policies"]["packing"].update(packing)
    document["policies"]["splits"].update(
        {"train_percent": 100, "validation_percent": 0, "test_percent": 0}
    )
    config = demo_home / f"{name}.yaml"
    config.write_text(yaml.safe_dump(document))
    return open_workspace(config)


def _built(ws: Workspace, key: str = "p1") -> tuple[dict, dict, list[dict], dict[str, list[int]]]:
    """Build; the packed index's outputs and counts, its spans, and every record's tokens."""
    build_all(ws, key)
    _ref, index = read_layer_index(ws, key, "packed_blocks")
    spans = get_table(ws.cas, index.output("spans")).to_pylist()
    records = CanonicalIndex.read(ws, key)[1].table(["record_id", "text"]).to_pylist()
    tokens = {r["record_id"]: [*r["text"].encode(), UTF8_IDS["eos"]] for r in records}
    return index.outputs, index.counts, spans, tokens


def _blocks(ws: Workspace, outputs: dict) -> dict[str, np.ndarray]:
    with BlockReader.open(ws.cas, outputs["shard_index"]["digest"]) as reader:
        batches = list(reader.batches())
        return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def _samples(ws: Workspace, key: str = "p1") -> Counter:
    _ref, mixed = read_layer_index(ws, key, "mixed_samples")
    return Counter(get_table(ws.cas, mixed.output("samples")).column("record_id").to_pylist())


def test_packed_equals_unpacked_and_labels_stay_inside_segments(demo_home: Path) -> None:
    with _workspace(demo_home, "atomic", {"block_tokens": 64}) as ws:
        outputs, counts, spans, tokens = _built(ws)
        blocks, samples = _blocks(ws, outputs), _samples(ws)
    ids, segments = blocks["input_ids"], blocks["segment_ids"]
    assert ids.shape == (counts["blocks"], 64)
    streams: dict[tuple[str, int], list[int]] = {}
    for span in spans:  # every span holds its record's tokens at its offset
        piece = ids[span["block"], span["start"] : span["end"]].tolist()
        offset = span["record_offset"]
        assert piece == tokens[span["record_id"]][offset : offset + len(piece)], span
        assert set(segments[span["block"], span["start"] : span["end"]].tolist()) == {
            segments[span["block"], span["start"]]
        }
        streams.setdefault((span["record_id"], offset), []).append(len(piece))
    covered = Counter()
    for (record_id, _offset), lengths in streams.items():
        covered[record_id] += sum(lengths)
    # every sample (with its repeats) is packed whole, nothing else is
    assert covered == Counter({r: n * len(tokens[r]) for r, n in samples.items()})
    assert int((segments == 0).sum()) == counts["pad_tokens"]
    assert bool((ids[segments == 0] == PAD).all())
    # a label at t needs t + 1 in the same segment; documents are all targets
    same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] != 0)
    assert np.array_equal(blocks["label_mask"][:, :-1].astype(bool), same)
    assert not blocks["label_mask"][:, -1].any()
    assert int(blocks["label_mask"].sum()) == counts["label_tokens"]
    assert counts["label_tokens"] == counts["content_tokens"] - len(spans)


def test_accounting_and_the_layout_are_declared(demo_home: Path) -> None:
    with _workspace(demo_home, "atomic", {"block_tokens": 64}) as ws:
        outputs, counts, spans, _tokens = _built(ws)
        layout = json.loads(ws.cas.get_bytes(outputs["layout"]["digest"]))
    assert counts["tokens"] == counts["blocks"] * 64
    assert counts["content_tokens"] + counts["pad_tokens"] == counts["tokens"]
    assert counts["content_tokens"] == counts["input_tokens"]  # split: nothing dropped
    assert (counts["dropped_tokens"], counts["data_loss_ppm"]) == (0, 0)
    assert counts["utilisation_ppm"] == counts["content_tokens"] * 1_000_000 // counts["tokens"]
    assert counts["special_tokens"] == sum(s["specials"] == "document.eos" for s in spans)
    assert layout["mode"] == "atomic" and layout["fields"]["label_mask"] == "|u1"
    assert {s["shard"] for s in spans} == {0}


def test_best_fit_pads_less_than_next_fit_on_the_demo(demo_home: Path) -> None:
    with _workspace(demo_home, "bfd", {"block_tokens": 128}) as ws:
        atomic = _built(ws)[1]
    with _workspace(demo_home, "nf", {"block_tokens": 128, "mode": "next_fit"}) as ws:
        next_fit = _built(ws)[1]
    assert atomic["content_tokens"] == next_fit["content_tokens"]
    assert atomic["pad_tokens"] < next_fit["pad_tokens"]


def test_continuous_drop_counts_the_lost_tail(demo_home: Path) -> None:
    policy = {"block_tokens": 64, "mode": "continuous", "tail": "drop"}
    with _workspace(demo_home, "cont", policy) as ws:
        outputs, counts, _spans, _tokens = _built(ws)
        blocks = _blocks(ws, outputs)
    assert counts["pad_tokens"] == 0 and not (blocks["segment_ids"] == 0).any()
    assert counts["dropped_tokens"] == counts["input_tokens"] % 64
    assert counts["data_loss_ppm"] == counts["dropped_tokens"] * 1_000_000 // counts["input_tokens"]


def test_quarantine_lists_overlong_samples_and_packs_none_of_them(demo_home: Path) -> None:
    with _workspace(demo_home, "quarantine", {"block_tokens": 64, "overlong": "quarantine"}) as ws:
        outputs, counts, spans, tokens = _built(ws)
        quarantined = get_table(ws.cas, outputs["quarantined"])
        samples = _samples(ws)
    long = {r for r in samples if len(tokens[r]) > 64}
    assert long and set(quarantined.column("record_id").to_pylist()) == long
    assert counts["quarantined_samples"] == sum(samples[r] for r in long)
    assert not long & {s["record_id"] for s in spans}
    assert counts["dropped_tokens"] == pc.sum(quarantined.column("tokens")).as_py()


@pytest.mark.parametrize("policy", [{"block_tokens": 64}, {"block_tokens": 64, "seed": "other"}])
def test_the_same_build_gives_the_same_shards_and_the_seed_only_reorders(
    demo_home: Path, policy: dict
) -> None:
    with _workspace(demo_home, "first", {"block_tokens": 64}) as ws:
        first, _counts, first_spans, _ = _built(ws)
    with _workspace(demo_home, "second", policy) as ws:
        second, _counts, second_spans, _ = _built(ws, "p2")
    if "seed" not in policy:
        assert second["shard_index"] == first["shard_index"]
        assert second["spans"] == first["spans"]
        return
    assert second["shard_index"] != first["shard_index"]

    def content(spans: list[dict]) -> list[tuple]:
        return sorted((s["record_id"], s["record_offset"], s["end"] - s["start"]) for s in spans)

    assert content(second_spans) == content(first_spans)


def _replaced(column: str, values: list):
    """A spans change: ``column`` set to ``values`` (the first rows; the rest unchanged)."""

    def change(spans: pa.Table) -> pa.Table:
        at = spans.schema.get_field_index(column)
        old = spans.column(column).to_pylist()
        new = pa.array(values + old[len(values) :], spans.schema.field(column).type)
        return spans.set_column(at, column, new)

    return change


def test_the_packing_gate_refuses_unsound_spans(demo_home: Path) -> None:
    with _workspace(demo_home, "gate", {"block_tokens": 64}) as ws:
        sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
        report = validate_snapshot(ws, sid)
        assert report.ok and report.gate.packing_violations == 0
        _ref, packed = read_layer_index(ws, "p1", "packed_blocks")
        manifest = get_json(ws.cas, states.get(ws.catalog, sid).manifest_digest)
        members = get_table(ws.cas, manifest["members"])
        spans = get_table(ws.cas, packed.output("spans"))

        def findings(change) -> list[str]:
            outputs = {**packed.outputs, "spans": put_table(ws.cas, change(spans))}
            return packing_findings(ws.cas, packed.model_copy(update={"outputs": outputs}), members)

    assert findings(lambda t: t) == []
    first = spans.slice(0, 1).to_pylist()[0]
    wider = findings(_replaced("end", [first["end"] + 1]))  # into the next span or past T
    assert any("overlap" in f or "outside" in f for f in wider)
    assert any("cover" in f for f in wider)
    moved = findings(_replaced("shard", [first["shard"] + 1]))
    assert any("1 spans lie outside their block or shard" in f for f in moved)
    stranger = findings(_replaced("record_id", ["x/y"]))
    assert any("1 packed records are not train members" in f and "x/y" in f for f in stranger)
