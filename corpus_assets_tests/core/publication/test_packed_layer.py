"""packed_blocks end to end on the demo: planned packing into verified shards, packed equals
unpacked, labels inside segments, accounting, overlong and tail policies, determinism."""

import json
from collections import Counter
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml

from corpus_assets.core.governance import states
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.block_reader import BlockReader, cu_seqlens
from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.publication.packing_check import packing_findings, pair_findings
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import read_layer_index
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_json, get_table, put_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.shards import write_shards
from corpus_assets.core.tokens.cache import open_tokens, token_cache
from corpus_assets.core.tokens.spec import UTF8_IDS, resolve_tokenizer, utf8_spec
from corpus_assets.core.training_view.packing import PackingError
from corpus_assets.core.training_view.packing.samples import SampleTokens, locate_samples
from corpus_assets_tests.conftest import BuiltDemo, all_train_packing

PAD, EOS = UTF8_IDS["pad"], UTF8_IDS["eos"]


def _workspace(demo_home: Path, name: str, packing: dict) -> Workspace:
    """The demo with its packing policy updated and every record in train (so all pack)."""
    return open_workspace(all_train_packing(demo_home / "corpus.yaml", packing, name))


def _built(ws: Workspace, key: str = "p1") -> tuple[dict, dict, list[dict], dict]:
    """Build, then ``_packed``."""
    build_all(ws, key)
    return _packed(ws, key)


def _packed(ws: Workspace, key: str = "p1") -> tuple[dict, dict, list[dict], dict]:
    """The packed index's outputs and counts, its spans, and every record's expected (tokens,
    targets), derived here from the record and the pinned template."""
    _ref, index = read_layer_index(ws, key, "packed_blocks")
    spans = get_table(ws.cas, index.output("spans")).to_pylist()
    records = CanonicalIndex.read(ws, key)[1].table(["record_id", "kind", "payload", "text"])
    return (
        index.outputs,
        index.counts,
        spans,
        {r["record_id"]: _expected(r) for r in records.to_pylist()},
    )


def _expected(record: dict) -> tuple[list[int], list[int]]:
    """utf8-bytes-v1 tokens and targets: a document's bytes then EOS, all targets; a chat's
    template parts (targets where the template marks generation), then EOS (no target)."""
    if record["kind"] == "document":
        tokens = [*record["text"].encode(), EOS]
        return tokens, [1] * len(tokens)
    messages = json.loads(record["payload"])["messages"]
    parts = utf8_spec().chat_template.render_parts(messages)
    tokens = [b for text, _ in parts for b in text.encode()] + [EOS]
    targets = [int(t) for text, t in parts for _ in text.encode()] + [0]
    return tokens, targets


def _blocks(ws: Workspace, outputs: dict) -> dict[str, np.ndarray]:
    with BlockReader.open(ws.cas, outputs["shard_index"]["digest"]) as reader:
        batches = list(reader.batches())
        return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def _samples(ws: Workspace, key: str = "p1") -> Counter:
    _ref, mixed = read_layer_index(ws, key, "mixed_samples")
    return Counter(get_table(ws.cas, mixed.output("samples")).column("record_id").to_pylist())


# The shared build (read only) of ``_workspace``'s config with {"block_tokens": 64}.
SHARED_64 = pytest.mark.parametrize("built_packed_demo", ["sqlite"], indirect=True)


@SHARED_64
def test_packed_equals_unpacked_and_labels_stay_inside_segments(
    built_packed_demo: BuiltDemo,
) -> None:
    with open_workspace(built_packed_demo.config) as ws:
        outputs, counts, spans, expected = _packed(ws)
        blocks, samples = _blocks(ws, outputs), _samples(ws)
    ids, segments, labels = blocks["input_ids"], blocks["segment_ids"], blocks["label_mask"]
    assert ids.shape == (counts["blocks"], 64)
    assert {expected[r][0][-1] for r in samples} == {EOS}
    assert any(0 in expected[r][1] for r in samples)  # chats mask their context
    covered = Counter()
    for span in spans:  # every span holds its record's tokens at its offset, in one segment
        tokens, targets = expected[span["record_id"]]
        begin, end, offset = span["start"], span["end"], span["record_offset"]
        piece = ids[span["block"], begin:end].tolist()
        assert piece == tokens[offset : offset + len(piece)], span
        assert len(set(segments[span["block"], begin:end].tolist())) == 1
        # a label at t: t + 1 in the same segment and a target there; none on its last token
        want = [*targets[offset + 1 : offset + len(piece)], 0]
        assert labels[span["block"], begin:end].tolist() == want, span
        covered[span["record_id"]] += len(piece)
    # every sample (with its repeats) is packed whole, nothing else is
    assert covered == Counter({r: n * len(expected[r][0]) for r, n in samples.items()})
    assert int((segments == 0).sum()) == counts["pad_tokens"]
    assert bool((ids[segments == 0] == PAD).all()) and not labels[segments == 0].any()
    assert int(labels.sum()) == counts["label_tokens"]


@SHARED_64
def test_accounting_and_the_layout_are_declared(built_packed_demo: BuiltDemo) -> None:
    with open_workspace(built_packed_demo.config) as ws:
        outputs, counts, spans, _tokens = _packed(ws)
        layout = json.loads(ws.cas.get_bytes(outputs["layout"]["digest"]))
    assert counts["tokens"] == counts["blocks"] * 64
    assert counts["content_tokens"] + counts["pad_tokens"] == counts["tokens"]
    assert counts["content_tokens"] == counts["input_tokens"]  # split: nothing dropped
    assert (counts["dropped_tokens"], counts["data_loss_ppm"]) == (0, 0)
    assert counts["utilisation_ppm"] == counts["content_tokens"] * 1_000_000 // counts["tokens"]
    ends = Counter(s["specials"] for s in spans if s["specials"].endswith(".eos"))
    assert set(ends) == {"document.eos", "chat.chatml.v1.eos"}  # one EOS per sample
    assert counts["special_tokens"] == sum(ends.values())
    assert {
        s["transform"].split(" chat-template ")[-1] for s in spans if "chat" in s["specials"]
    } == {outputs["chat_template"]["digest"]}
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
    long = {r for r in samples if len(tokens[r][0]) > 64}
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
        members = read_members(ws.cas, manifest["members"])
        spans = get_table(ws.cas, packed.output("spans"))

        def findings(change) -> list[str]:
            outputs = {**packed.outputs, "spans": put_table(ws.cas, change(spans))}
            with duckdb.connect() as con:
                con.register("members", members)
                return packing_findings(ws.cas, packed.model_copy(update={"outputs": outputs}), con)

    assert findings(lambda t: t) == []
    backwards = pa.array(range(spans.num_rows - 1, -1, -1))
    assert findings(lambda t: t.take(backwards)) == []  # out of block order: sorted, still sound
    first = spans.slice(0, 1).to_pylist()[0]
    wider = findings(_replaced("end", [first["end"] + 1]))  # into the next span or past T
    assert any("overlap" in f or "outside" in f for f in wider)
    assert findings(lambda t: _replaced("end", [first["end"] + 1])(t).take(backwards)) == wider
    assert any("cover" in f for f in wider)
    moved = findings(_replaced("shard", [first["shard"] + 1]))
    assert any("1 spans lie outside their block or shard" in f for f in moved)
    stranger = findings(_replaced("record_id", ["x/y"]))
    assert any("1 packed records are not train members" in f and "x/y" in f for f in stranger)
    # each stranger once, the first ``SHOWN`` in spans order (not sorted)
    many = findings(_replaced("record_id", ["z/9", "x/y", "z/9", *(f"a/{n}" for n in range(6))]))
    assert (
        "8 packed records are not train members, e.g. ['z/9', 'x/y', 'a/0', 'a/1', 'a/2']" in many
    )


PAIRS = [
    {"id": f"p{n}", "prompt": f"Question {n}: which is better?", "chosen": f"Answer {n} " * (n + 1),
     "rejected": f"No {n}."}
    for n in range(6)
]  # fmt: skip


def _with_pairs(demo_home: Path) -> None:
    """A preference source beside the demo's (written by hand as another tool would)."""
    folder = demo_home / "demo-sources" / "prefs"
    folder.mkdir()
    (folder / "prefs-00000.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    document = yaml.safe_load((demo_home / "corpus.yaml").read_text())
    document["sources"].append(
        {"id": "prefs", "kind": "objects", "path": "demo-sources/prefs", "adapter": "preference.v1"}
    )
    (demo_home / "corpus.yaml").write_text(yaml.safe_dump(document))


def test_a_preference_pair_is_two_segments_of_one_block_with_one_prompt(demo_home: Path) -> None:
    _with_pairs(demo_home)
    with _workspace(demo_home, "pairs", {"block_tokens": 256}) as ws:
        sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
        report = validate_snapshot(ws, sid)
        _ref, packed = read_layer_index(ws, "p1", "packed_blocks")
        spans = get_table(ws.cas, packed.output("spans")).to_pylist()
        blocks = _blocks(ws, packed.outputs)
        samples = _samples(ws)
    assert report.ok, report.findings
    pairs = [r for r in samples if r.startswith("prefs/")]
    assert pairs and packed.counts["pairs"] == sum(samples[r] for r in pairs)
    for record in pairs:
        by_sample: dict[int, list[dict]] = {}
        for span in (s for s in spans if s["record_id"] == record):
            by_sample.setdefault(span["sample"], []).append(span)
        for first, second in (sorted(v, key=lambda s: s["start"]) for v in by_sample.values()):
            assert first["block"] == second["block"] and first["end"] == second["start"]
            assert (first["record_offset"], second["record_offset"]) == (
                0,
                first["end"] - first["start"],
            )
            ids, seg, labels = (
                blocks[f][first["block"]] for f in ("input_ids", "segment_ids", "label_mask")
            )
            assert seg[first["start"]] != seg[second["start"]]  # two segments
            texts = [
                bytes(ids[s["start"] : s["end"] - 1].tolist()).decode() for s in (first, second)
            ]
            pair = next(p for p in PAIRS if record == f"prefs/{p['id']}")
            assert pair["prompt"] in texts[0] and pair["chosen"] in texts[0]
            assert pair["prompt"] in texts[1] and pair["rejected"] in texts[1]
            # no label predicts a prompt token: the first label sits just before the answer
            for s, answer in ((first, pair["chosen"]), (second, pair["rejected"])):
                first_label = s["start"] + int(np.flatnonzero(labels[s["start"] : s["end"]])[0])
                text = bytes(ids[s["start"] : first_label + 1].tolist()).decode()
                assert pair["prompt"] in text and answer not in text


def test_continuous_packing_refuses_pairs_naming_one(demo_home: Path) -> None:
    _with_pairs(demo_home)
    policy = {"block_tokens": 256, "mode": "continuous"}
    refused = r"continuous .* preference pairs whole \(e\.g\. 'prefs/p"
    with (
        _workspace(demo_home, "cont-pairs", policy) as ws,
        pytest.raises(PackingError, match=refused),
    ):
        build_all(ws, "p1")


def test_the_pair_gate_reads_the_prompts_from_the_shards(tmp_path: Path) -> None:
    """One block holding a pair whose second prompt differs in one token: found; the same
    block with equal prompts: nothing."""
    cas = ContentStore(tmp_path / "cas")

    def findings(second_prompt: list[int]) -> list[str]:
        ids = np.array([[1, 2, 3, 9, 9, *second_prompt, 8, 8, 0, 0]], np.uint16)
        labels = np.array([[0, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0]], np.uint8)
        segments = np.array([[1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 0, 0]], np.uint16)
        fields = {"input_ids": "<u2", "segment_ids": "<u2", "label_mask": "|u1"}
        batch = {"input_ids": ids, "segment_ids": segments, "label_mask": labels}
        index, _ref = write_shards(cas, [batch], 12, fields)
        spans = pa.table(
            {"sample": [0, 0], "record_id": ["prefs/x"] * 2, "block": [0, 0], "start": [0, 5],
             "end": [5, 10], "specials": ["chat.chatml.v1.eos"] * 2}
        )  # fmt: skip
        return pair_findings(cas, index, spans)

    assert findings([1, 2, 3]) == []
    assert findings([1, 7, 3]) == [
        "1 preference pairs have different prompts, e.g. ['prefs/x (block 0)']"
    ]


@SHARED_64
def test_samples_are_read_by_pread_whatever_the_open_file_limit(
    built_packed_demo: BuiltDemo,
) -> None:
    """With one chunk file open at a time (every other read reopens one), each sample's tokens
    are exactly the cache's mapped view of them."""
    with open_workspace(built_packed_demo.config) as ws:
        canonical = CanonicalIndex.read(ws, "p1")[1]
        _ref, dedup = read_layer_index(ws, "p1", "dedup_clusters")
        cache = token_cache(ws, canonical.chunks(), resolve_tokenizer(ws))
        order = pa.chunked_array([pa.array(sorted(_samples(ws)))])
        rows = locate_samples(ws, canonical, cache, order, dedup)
        mapped = [open_tokens(ws, c, cache.spec) for c in cache.chunks]
        with SampleTokens(ws, cache, rows.chunk, rows.row, open_files=1) as fetch:
            for sample in np.random.default_rng(3).permutation(len(rows.length)).tolist():
                want = mapped[rows.chunk[sample]].record(int(rows.row[sample]))
                assert np.array_equal(fetch(sample), want)
        assert len({int(c) for c in rows.chunk}) > 1


@SHARED_64
def test_cu_seqlens_from_the_stored_segment_ids_match_the_built_ones(
    built_packed_demo: BuiltDemo,
) -> None:
    with open_workspace(built_packed_demo.config) as ws:
        outputs = _packed(ws)[0]
        stored = _blocks(ws, outputs)["segment_ids"]
    assert cu_seqlens(np.array([1, 1, 2, 2, 2, 3, 0, 0])).tolist() == [0, 2, 5, 6]
    for block in stored:
        ends = cu_seqlens(block)
        segments = int(block.max())
        assert len(ends) == segments + 1 and ends[-1] == int((block != 0).sum())
        assert np.diff(ends).tolist() == np.bincount(block, minlength=segments + 1)[1:].tolist()


def test_a_snapshot_with_no_train_records_packs_no_blocks_and_validates(demo_home: Path) -> None:
    """Nothing to train on is a valid, empty pack (0 blocks, 0 shards), not a crash."""
    document = yaml.safe_load((demo_home / "corpus.yaml").read_text())
    document["policies"]["splits"].update(
        {"train_percent": 0, "validation_percent": 50, "test_percent": 50}
    )
    config = demo_home / "no-train.yaml"
    config.write_text(yaml.safe_dump(document))
    with open_workspace(config) as ws:
        sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
        report = validate_snapshot(ws, sid)
        _ref, packed = read_layer_index(ws, "p1", "packed_blocks")
    assert report.ok, report.findings
    assert (packed.counts["blocks"], packed.counts["samples"], packed.outputs["shards"]) == (
        0,
        0,
        [],
    )
