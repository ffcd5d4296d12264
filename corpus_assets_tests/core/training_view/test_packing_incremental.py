"""A child's packed_blocks keeps its parent's blocks.

Real builds of the demo in throwaway homes: a parent is built and activated, ~1% new essays are
added (or a record is tombstoned) and the child is built. Most parent blocks come back byte for
byte, every child sample is packed whole, the gate passes, the layer is the same on a rerun and
at 1 or 2 workers; ``incremental: false`` gives a fresh home's full layout; a padding bound
that is exceeded forces a full repack, recorded in the manifest with its reason.
"""

import json
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from corpus_assets.assets.metadata import layer_metadata
from corpus_assets.core.governance import states
from corpus_assets.core.governance.tombstones import add_tombstone
from corpus_assets.core.pipeline import BUILDERS, DIRECT_BUILDERS, build_all
from corpus_assets.core.publication.block_reader import BlockReader
from corpus_assets.core.publication.publish import activate, approve
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import LAYERS, LayerIndex, read_layer_index
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_json, get_table
from corpus_assets.core.storage.shards import load_index
from corpus_assets.core.storage.table_lookup import TrustedFiles
from corpus_assets.core.tokens.cache import token_cache
from corpus_assets.core.tokens.spec import resolve_tokenizer
from corpus_assets.core.training_view.packing import memo_part
from corpus_assets.core.training_view.packing import shards as pack_shards
from corpus_assets.core.training_view.packing.incremental import (
    SAMPLE_MAP,
    SAMPLE_MAP_BY_ROW,
    SampleMap,
    parent_pack,
    sample_map,
    sample_steps,
)
from corpus_assets.core.training_view.packing.locate import KINDS, LOCATED
from corpus_assets.demo import WORDS, write_demo

NEW_ESSAYS = 3  # about 1% of the demo's ~280 records
SHARD_BYTES = 40_000  # ~10 blocks of 512 tokens (7 bytes a token: uint16 ids and fields)
Signature = tuple[tuple[int, int, str, int, str, str], ...]


@pytest.fixture(autouse=True)
def _no_env_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """No catalog from the environment; shards of ~10 blocks, so the demo has a dozen."""
    monkeypatch.delenv("CORPUS_CATALOG_URL", raising=False)
    monkeypatch.setattr(pack_shards.build_shards, "__defaults__", (SHARD_BYTES, None))


def _home(folder: Path, packing: dict | None = None, workers: int | None = None) -> Path:
    """The demo in ``folder`` (its own home and catalog), every record in train."""
    config = write_demo(folder)
    document = yaml.safe_load(config.read_text())
    # one new block of the demo's ~130 is ~0.8% of positions: the bound is set above that
    defaults = {"block_tokens": 512, "max_extra_padding": "0.05"}
    document["policies"]["packing"].update({**defaults, **(packing or {})})
    document["policies"]["splits"].update(
        {"train_percent": 100, "validation_percent": 0, "test_percent": 0}
    )
    document["storage"] = {"home": "."}
    if workers is not None:
        document["execution"] = {"workers": workers}
    config.write_text(yaml.safe_dump(document))
    return config


def _add_essays(folder: Path, count: int = NEW_ESSAYS, words: int = 40) -> list[str]:
    """``count`` new essays of ``words`` + 9n random words (distinct: no dedup between them)."""
    rng = random.Random(32)
    rows = [
        {"id": f"n{n:03d}", "text": " ".join(rng.choice(WORDS) for _ in range(words + 9 * n))}
        for n in range(count)
    ]
    path = folder / "demo-sources" / "essays" / "essays-00002.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [f"essays/{r['id']}" for r in rows]


def _active(ws: Workspace, key: str) -> str:
    sid = build_all(ws, key)["manifest"].digests["snapshotId"]
    approve(ws, sid, by="reviewer")
    activate(ws, sid, actor="test")
    return sid


def _packed(ws: Workspace, key: str) -> tuple[str, LayerIndex, list[dict]]:
    ref, index = read_layer_index(ws, key, "packed_blocks")
    return ref["digest"], index, get_table(ws.cas, index.output("spans")).to_pylist()


def _by_block(spans: list[dict]) -> dict[int, Signature]:
    """Each block's content as its spans say, without block, shard or stream numbers."""
    out: dict[int, list] = {}
    for s in spans:
        row = (s["start"], s["end"], s["record_id"], s["record_offset"])
        out.setdefault(s["block"], []).append((*row, s["transform"], s["specials"]))
    return {block: tuple(sorted(rows)) for block, rows in out.items()}


def _blocks(ws: Workspace, index: LayerIndex) -> dict[str, np.ndarray]:
    with BlockReader.open(ws.cas, index.output("shard_index")["digest"]) as reader:
        batches = list(reader.batches())
    return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def _kept(ws: Workspace, parent: LayerIndex, child: LayerIndex, spans: tuple) -> list[int]:
    """Parent blocks found again in the child (same spans); asserts their bytes are equal."""
    old, new = _by_block(spans[0]), {sig: b for b, sig in _by_block(spans[1]).items()}
    old_arrays, new_arrays = _blocks(ws, parent), _blocks(ws, child)
    kept = [b for b, sig in old.items() if sig in new]
    for b in kept:
        for name, values in old_arrays.items():
            assert np.array_equal(values[b], new_arrays[name][new[old[b]]]), (name, b)
    return kept


def _manifest(ws: Workspace, sid: str) -> dict:
    return get_json(ws.cas, states.get(ws.catalog, sid).manifest_digest)


def _whole(ws: Workspace, key: str, spans: list[dict], index: LayerIndex) -> None:
    """Every mixed sample is packed whole and nothing else is (split policy: no loss)."""
    _ref, mixed = read_layer_index(ws, key, "mixed_samples")
    samples = get_table(ws.cas, mixed.output("samples")).column("record_id").to_pylist()
    covered = Counter()
    for s in spans:
        covered[s["record_id"]] += s["end"] - s["start"]
    assert set(covered) == set(samples)
    assert sum(covered.values()) == index.counts["content_tokens"] == index.counts["input_tokens"]


def test_a_child_keeps_most_parent_blocks_byte_for_byte(tmp_path: Path) -> None:
    folder = tmp_path / "home"
    with open_workspace(_home(folder)) as ws:
        _active(ws, "p1")
        parent_digest, parent, parent_spans = _packed(ws, "p1")
        assert parent.outputs["packing"] == {
            "mode": "full",
            "reason": "no parent snapshot",
            "parent": None,
        }
        added = _add_essays(folder)
        built = build_all(ws, "p2")
        sid = built["manifest"].digests["snapshotId"]
        digest, child, spans = _packed(ws, "p2")
        kept = _kept(ws, parent, child, (parent_spans, spans))
        report = validate_snapshot(ws, sid)
        manifest = _manifest(ws, sid)
        assert memo_part(ws, "p2") == parent_digest
        _whole(ws, "p2", spans, child)
        shards = [i.output("shard_index")["digest"] for i in (parent, child)]
        entries = [load_index(ws.cas, d).shards for d in shards]
    blocks = parent.counts["blocks"]
    assert len(kept) == blocks  # nothing left the stream, so every parent block is kept
    assert set(added) <= {s["record_id"] for s in spans}
    assert report.ok and report.gate.packing_violations == 0
    packing = manifest["packing"]
    assert (packing["mode"], packing["parent"]) == ("incremental", parent_digest)
    assert packing["reason"].startswith(f"kept {len(kept)} of {blocks} parent blocks")
    assert parent_digest in [p["digest"] for p in child.parents]  # the layout names its parent
    assert digest != parent_digest
    assert len(entries[0]) > 5  # every parent shard but the last (short) one is reused as is
    assert entries[1][: len(entries[0]) - 1] == entries[0][:-1]
    assert built["packed_blocks"].run_stats["shards_reused"] == len(entries[0]) - 1
    summary = layer_metadata(built["packed_blocks"])["summary"].value  # the UI says it too
    assert summary.endswith(f"Packed incremental: {packing['reason']}.")


def test_the_parents_last_shard_is_copied_into_the_childs_as_a_rebuild_would_write_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's shard that goes on past the parent's last (short) one begins with that
    shard's blocks copied from its bytes, not rebuilt from the token cache: the layer is the
    one the rebuild gives, byte for byte, and no block of it is built from samples."""
    from corpus_assets.core.training_view.packing import kept_shards
    from corpus_assets.core.training_view.packing.blocks import build_batch

    folder = tmp_path / "home"
    with open_workspace(_home(folder)) as ws:
        _active(ws, "p1")
        _add_essays(folder)
        built = {}
        for layer in LAYERS[: LAYERS.index("packed_blocks")]:
            BUILDERS[layer](ws, "p2")
        _ref, parent = read_layer_index(ws, "p1", "packed_blocks")
        last = load_index(ws.cas, parent.output("shard_index")["digest"]).shards[-1]
        batches: list[int] = []

        def counting_batch(plan: Any, first: int, last: int, *args: Any) -> Any:
            batches.extend(range(first, last))
            return build_batch(plan, first, last, *args)

        with monkeypatch.context() as patched:
            patched.setattr(pack_shards, "build_batch", counting_batch)
            built["copied"] = DIRECT_BUILDERS["packed_blocks"](ws, "p2")
        copied_blocks = list(batches)
        whole_only = kept_shards.reused_shards

        def no_prefix(*args: Any) -> dict:
            kept = whole_only(*args)
            return {n: o for n, o in kept.items() if not isinstance(o, pack_shards.KeptPrefix)}

        monkeypatch.setattr(kept_shards, "reused_shards", no_prefix)
        import corpus_assets.core.training_view.packing.build as pack_build

        monkeypatch.setattr(pack_build, "reused_shards", no_prefix)
        built["rebuilt"] = DIRECT_BUILDERS["packed_blocks"](ws, "p2")
    assert last.blocks < 10  # the parent's last shard is a short one the child goes on past
    assert built["copied"].run_stats["shard_blocks_copied"] == last.blocks
    assert built["rebuilt"].run_stats["shard_blocks_copied"] == 0
    assert built["copied"].digest == built["rebuilt"].digest
    assert built["copied"].counts == built["rebuilt"].counts
    assert not set(range(last.first_block, last.first_block + last.blocks)) & set(copied_blocks)
    assert copied_blocks  # the new blocks are built


def test_the_child_layer_is_the_same_on_a_rerun_and_at_one_or_two_workers(tmp_path: Path) -> None:
    folder = tmp_path / "home"
    with open_workspace(_home(folder)) as ws:
        _active(ws, "p1")
        _add_essays(folder)
        first = build_all(ws, "p2")["packed_blocks"].digest
    digests = []
    for workers in (1, 2):
        with open_workspace(_home(folder, workers=workers)) as ws:
            result = DIRECT_BUILDERS["packed_blocks"](ws, "p2")  # no memo: a real rebuild
            digests.append(result.digest)
            assert result.details["packing"]["mode"] == "incremental"
    assert digests == [first, first]


def test_incremental_false_gives_the_full_layout_of_a_fresh_home(tmp_path: Path) -> None:
    folder = tmp_path / "home"
    with open_workspace(_home(folder, {"incremental": False})) as ws:
        _active(ws, "p1")
        _add_essays(folder)
        sid = build_all(ws, "p2")["manifest"].digests["snapshotId"]
        _digest, child, _spans = _packed(ws, "p2")
        packing = _manifest(ws, sid)["packing"]
    fresh = tmp_path / "fresh"
    with open_workspace(_home(fresh, {"incremental": False})) as ws:
        _add_essays(fresh)
        build_all(ws, "p1")
        _digest, full, _spans = _packed(ws, "p1")
    assert packing == {
        "mode": "full",
        "reason": "policies.packing.incremental is false",
        "parent": None,
    }
    for name in ("shard_index", "spans"):
        assert child.output(name) == full.output(name)


def test_a_padding_bound_exceeded_forces_a_full_repack(tmp_path: Path) -> None:
    folder = tmp_path / "home"
    with open_workspace(_home(folder, {"max_extra_padding": "0.000001"})) as ws:
        _active(ws, "p1")
        parent_digest = _packed(ws, "p1")[0]
        # two essays of ~260 and ~320 tokens: two new blocks, where a full repack needs one
        _add_essays(folder, 2, 36)
        sid = build_all(ws, "p2")["manifest"].digests["snapshotId"]
        packing = _manifest(ws, sid)["packing"]
        report = validate_snapshot(ws, sid)
    assert (packing["mode"], packing["parent"]) == ("full", parent_digest)
    assert packing["reason"].startswith("extra padding ")
    assert report.ok


def test_a_tombstoned_record_drops_its_block_and_repacks_the_others(tmp_path: Path) -> None:
    folder = tmp_path / "home"
    with open_workspace(_home(folder)) as ws:
        _active(ws, "p1")
        _digest, parent, parent_spans = _packed(ws, "p1")
        blocks_of: dict[str, set[int]] = {}
        for s in parent_spans:
            blocks_of.setdefault(s["record_id"], set()).add(s["block"])
        records_in = Counter(s["block"] for s in parent_spans)
        victim = next(
            r
            for r, b in sorted(blocks_of.items())
            if r.startswith("essays/") and len(b) == 1 and records_in[min(b)] >= 3
        )
        block = min(blocks_of[victim])
        neighbours = {s["record_id"] for s in parent_spans if s["block"] == block} - {victim}
        add_tombstone(ws.catalog, "record", victim, "erasure")
        spans, kept, report, packing = _child_p2(ws, parent, parent_spans)
    packed = {s["record_id"] for s in spans}
    assert victim not in packed and neighbours <= packed
    assert block not in kept and len(kept) == parent.counts["blocks"] - 1
    assert packing["mode"] == "incremental" and report.ok


def _child_p2(
    ws: Workspace, parent: LayerIndex, parent_spans: list[dict[str, Any]]
) -> tuple[Any, ...]:
    """Build child ``p2`` and return its spans, the parent blocks it kept, its validation report
    and its manifest's packing record; every sample of it is checked packed whole."""
    sid = build_all(ws, "p2")["manifest"].digests["snapshotId"]
    _digest, child, spans = _packed(ws, "p2")
    kept = _kept(ws, parent, child, (parent_spans, spans))
    report = validate_snapshot(ws, sid)
    packing = _manifest(ws, sid)["packing"]
    _whole(ws, "p2", spans, child)
    return spans, kept, report, packing


PAIRS = [
    {"id": f"p{n}", "prompt": f"Question {n}: which is better?", "chosen": f"Answer {n} " * (n + 1),
     "rejected": f"No {n}."}
    for n in range(12)
]  # fmt: skip


def _with_pairs(folder: Path, config: Path) -> None:
    """A preference source beside the demo's: its records pack as pairs (two segments)."""
    prefs = folder / "demo-sources" / "prefs"
    prefs.mkdir()
    (prefs / "prefs-00000.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    document = yaml.safe_load(config.read_text())
    document["sources"].append(
        {"id": "prefs", "kind": "objects", "path": "demo-sources/prefs", "adapter": "preference.v1"}
    )
    config.write_text(yaml.safe_dump(document))


def test_pairs_are_kept_with_their_block_or_repacked_whole(tmp_path: Path) -> None:
    folder = tmp_path / "home"
    config = _home(folder)
    _with_pairs(folder, config)
    with open_workspace(config) as ws:
        _active(ws, "p1")
        _digest, parent, parent_spans = _packed(ws, "p1")
        pair_blocks = sorted(
            {s["block"] for s in parent_spans if s["record_id"].startswith("prefs/")}
        )
        block = pair_blocks[0]  # drop one block holding a pair: tombstone another record in it
        others = {s["record_id"] for s in parent_spans if s["block"] == block}
        victim = min(r for r in others if not r.startswith("prefs/"))
        add_tombstone(ws.catalog, "record", victim, "erasure")
        _add_essays(folder)
        spans, kept, report, packing = _child_p2(ws, parent, parent_spans)
    assert packing["mode"] == "incremental" and report.ok, (packing, report.findings)
    assert block not in kept and set(pair_blocks[1:]) <= set(kept)
    freed = {r for r in others if r.startswith("prefs/")}
    assert freed, "the dropped block held a pair"
    for record in freed:  # repacked whole: two adjacent segments of one new block
        first, second = sorted(
            (s for s in spans if s["record_id"] == record), key=lambda s: s["start"]
        )
        assert first["block"] == second["block"] and first["end"] == second["start"]
        assert (
            first["record_offset"] == 0 and second["record_offset"] == first["end"] - first["start"]
        )


def test_a_sample_that_changed_repeat_drops_its_block_and_the_rest_stay(tmp_path: Path) -> None:
    """A budget of 400 documents repeats some records; adding essays moves the budget's
    passes, so some (record, repeat) samples leave: their blocks go, the others stay."""
    folder = tmp_path / "home"
    config = _home(folder)
    document = yaml.safe_load(config.read_text())
    document["policies"]["mixing"].update({"budget": 400, "max_epochs": 3})
    config.write_text(yaml.safe_dump(document))
    with open_workspace(config) as ws:
        _active(ws, "p1")
        _digest, parent, parent_spans = _packed(ws, "p1")
        before = _stream(ws, "p1")
        _add_essays(folder, 8)
        sid = build_all(ws, "p2")["manifest"].digests["snapshotId"]
        _digest, child, spans = _packed(ws, "p2")
        after = _stream(ws, "p2")
        kept = _kept(ws, parent, child, (parent_spans, spans))
        report = validate_snapshot(ws, sid)
        packing = _manifest(ws, sid)["packing"]
        _whole(ws, "p2", spans, child)
    assert max(r for _, r in before) >= 1  # some records repeat
    left = {before[s["sample"]] for s in parent_spans} - set(after)
    assert left, "the budget moved some passes"
    gone = {s["block"] for s in parent_spans if before[s["sample"]] in left}
    blocks = parent.counts["blocks"]
    assert set(range(blocks)) - gone <= set(kept)  # (a gone block's content may come back new)
    assert packing["reason"].startswith(f"kept {blocks - len(gone)} of {blocks} parent blocks")
    assert packing["mode"] == "incremental" and report.ok, (packing, report.findings)


def _stream(ws: Workspace, key: str) -> list[tuple[str, int]]:
    """(record id, repeat) of every sample, in stream order."""
    _ref, mixed = read_layer_index(ws, key, "mixed_samples")
    table = get_table(ws.cas, mixed.output("samples"), "samples", ["record_id", "repeat"])
    return list(zip(table["record_id"].to_pylist(), table["repeat"].to_pylist(), strict=True))


def _change_text(folder: Path, sampled: set[str]) -> str:
    """Give the first essay of the second essays file that is ``sampled`` a new text (same id):
    the child's record is another sample than the parent's."""
    path = folder / "demo-sources" / "essays" / "essays-00001.jsonl"
    rows = [json.loads(r) for r in path.read_text().splitlines() if r.strip()]
    row = next(r for r in rows if f"essays/{r['id']}" in sampled)
    row["text"] = " ".join(random.Random(7).choice(WORDS) for _ in range(60))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"essays/{row['id']}"


def _sample_maps(ws: Workspace, key: str) -> tuple[SampleMap, SampleMap]:
    """The child's sample map by canonical row (the dedup decisions' positions) and by the
    (record id, object, line) join (the same dedup layer without its decisions table)."""
    _ref, mixed = read_layer_index(ws, key, "mixed_samples")
    _ref, canonical = CanonicalIndex.read(ws, key)
    _ref, dedup = read_layer_index(ws, key, "dedup_clusters")
    outputs = {name: ref for name, ref in dedup.outputs.items() if name != "decisions"}
    by_keys = dedup.model_copy(update={"outputs": outputs})
    files = TrustedFiles(ws.cas, ws.catalog)
    chunks = canonical.chunks()
    assert sample_steps(files, dedup, chunks, {}) == SAMPLE_MAP_BY_ROW
    assert sample_steps(files, by_keys, chunks, {}) == SAMPLE_MAP
    shared = [chunks[0], replace(chunks[1], records=chunks[0].records), *chunks[2:]]
    assert sample_steps(files, dedup, shared, {}) == SAMPLE_MAP  # rows numbered by file
    cache = token_cache(ws, canonical.chunks(), resolve_tokenizer(ws))
    parent = parent_pack(ws, key)
    assert parent is not None
    samples = mixed.output("samples")
    maps = [sample_map(ws, parent, samples, canonical, d, cache) for d in (dedup, by_keys)]
    return maps[0], maps[1]


def test_the_sample_map_by_canonical_row_is_the_record_key_join(tmp_path: Path) -> None:
    """Each parent sample maps to the child sample of the same record id, repeat and text, and
    every child sample to its representative's cached row, whichever way the map joins."""
    folder = tmp_path / "home"
    config = _home(folder)
    _with_pairs(folder, config)
    with open_workspace(config) as ws:
        _active(ws, "p1")
        before = _stream(ws, "p1")
        _add_essays(folder)
        changed = _change_text(folder, {record for record, _ in before})
        for layer in LAYERS[: LAYERS.index("packed_blocks")]:
            BUILDERS[layer](ws, "p2")
        after = _stream(ws, "p2")
        by_row, by_keys = _sample_maps(ws, "p2")
        assert by_row.rows is not None and by_keys.rows is not None
        for name in LOCATED:
            assert np.array_equal(getattr(by_row.rows, name), getattr(by_keys.rows, name)), name
        kinds = set(np.asarray(by_row.rows.kind).tolist())
        by_row.rows.close()
        by_keys.rows.close()
    at = {sample: n for n, sample in enumerate(after)}
    expected = [-1 if record == changed else at.get((record, r), -1) for record, r in before]
    assert by_row.child_of.tolist() == expected == by_keys.child_of.tolist()
    assert 0 < expected.count(-1) < len(before)
    assert kinds == {KINDS.index("document"), KINDS.index("messages"), KINDS.index("preference")}
