"""Token materialisation: encoders against direct calls, the per-chunk cache in real builds,
tokenizers by digest, and a BPE fitted on the train split only."""

import hashlib
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers

from corpus_assets.core.consumption.training import TrainingReader, take_permit
from corpus_assets.core.pipeline import BUILDERS, build_all
from corpus_assets.core.publication.block_reader import BlockReader
from corpus_assets.core.publication.publish import activate, approve
from corpus_assets.core.publication.verify import verify
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import read_layer_index
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_json, get_table
from corpus_assets.core.tokens.bpe import train_byte_level_bpe
from corpus_assets.core.tokens.cache import ensure_tokens, open_tokens, token_cache
from corpus_assets.core.tokens.chat_template import DEFAULT_CHAT_TEMPLATE
from corpus_assets.core.tokens.encode import byte_slices, encode_batch
from corpus_assets.core.tokens.spec import (
    HUGGINGFACE,
    Special,
    TokenizerError,
    TokenizerSpec,
    resolve_tokenizer,
    utf8_spec,
)
from corpus_assets.core.training_view.tokenizer_fit import fit_tokenizer
from corpus_assets.demo import demo_objects
from corpus_assets_tests.conftest import use_demo_copy

SPECIALS = ["<|endoftext|>", "<|pad|>"]
ALPHABET = "abcdefghij klmnop\n\té✓ж中🙂"


@pytest.fixture
def catalog_url(tmp_path: Path) -> str:
    """SQLite only: the token cache uses the task table like every other chunk task."""
    return f"sqlite:///{tmp_path / 'catalog.sqlite'}"


def _texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 60))) for _ in range(n)]


def _demo_texts() -> list[str]:
    texts = []
    for data in demo_objects().values():
        if data.startswith(b"{"):
            texts += [json.loads(line).get("text", "") for line in data.splitlines() if line]
    return texts


def _hf_spec(tokenizer: Tokenizer, digest: str, bos: str | None = None) -> TokenizerSpec:
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    return TokenizerSpec(
        kind=HUGGINGFACE,
        digest=digest,
        file=None,
        vocab_size=max(vocab.values()) + 1,
        eos=Special(SPECIALS[0], vocab[SPECIALS[0]]),
        pad=Special(SPECIALS[1], vocab[SPECIALS[1]]),
        bos=Special(bos, vocab[bos]) if bos else None,
    )


def _records(tokens: np.ndarray, counts: np.ndarray) -> list[list[int]]:
    ends = np.cumsum(counts)
    return [tokens[e - c : e].tolist() for e, c in zip(ends, counts, strict=True)]


# --- encoders ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_utf8_bytes_are_the_utf8_of_each_text_then_eos(kind: pa.DataType) -> None:
    texts = _texts(500)
    array = pa.array(["x", *texts, "y"], kind).slice(1, len(texts))  # an offset into buffers
    tokens, counts = encode_batch(utf8_spec(), array)
    assert tokens.dtype == np.dtype("<u2")
    assert _records(tokens, counts) == [[*t.encode("utf-8"), 256] for t in texts]
    tokens, counts = encode_batch(utf8_spec(bos=True), array)
    assert _records(tokens, counts) == [[258, *t.encode("utf-8"), 256] for t in texts]
    empty_tokens, empty_counts = encode_batch(utf8_spec(), pa.array([], kind))
    assert (len(empty_tokens), len(empty_counts)) == (0, 0)
    with pytest.raises(ValueError, match="null"):
        encode_batch(utf8_spec(), pa.array(["a", None]))


def test_byte_slices_bound_each_encode_call_and_keep_every_text() -> None:
    texts = pa.array(["", *_texts(400, seed=2), "x" * 500]).slice(1)
    slices = list(byte_slices(texts, 100))
    assert pa.concat_arrays(slices).to_pylist() == texts.to_pylist()
    for piece in slices:
        size = sum(len(t.encode()) for t in piece.to_pylist())
        assert size <= 100 or len(piece) == 1


def test_huggingface_tokens_equal_direct_encode_calls() -> None:
    tokenizer = Tokenizer.from_str(train_byte_level_bpe([_demo_texts()], 600, SPECIALS).decode())
    spec = _hf_spec(tokenizer, "sha256:" + "0" * 64)
    texts = [*_texts(300, seed=1), "", "  two  spaces ", "Café ✓ 中文 🙂", *_demo_texts()[:50]]
    tokens, counts = encode_batch(spec, pa.array(texts), tokenizer)
    expected = [[*tokenizer.encode(t).ids, spec.eos.id] for t in texts]
    assert _records(tokens, counts) == expected
    with_bos = _hf_spec(tokenizer, spec.digest, bos=SPECIALS[1])  # any declared token will do
    tokens, counts = encode_batch(with_bos, pa.array(texts), tokenizer)
    assert _records(tokens, counts) == [[with_bos.bos.id, *e] for e in expected]  # type: ignore[union-attr]


# --- the cache in real builds ------------------------------------------------------------------


def _index(ws: Workspace, key: str, layer: str) -> tuple[dict, dict]:
    ref, index = read_layer_index(ws, key, layer)
    return ref, index.outputs


def _expected_tokens(
    ws: Workspace, key: str, encode: Callable[[str], list[int]], eos: int
) -> dict[str, list[int]]:
    """Every record's expected tokens: a document's text, a chat record's render under the
    default chat template (each part encoded alone), then EOS."""
    records = CanonicalIndex.read(ws, key)[1].table(["record_id", "kind", "payload", "text"])
    out = {}
    for row in records.to_pylist():
        if row["kind"] == "document":
            out[row["record_id"]] = [*encode(row["text"]), eos]
            continue
        assert row["kind"] == "messages"  # the demo has no preference source
        parts = DEFAULT_CHAT_TEMPLATE.render_parts(json.loads(row["payload"])["messages"])
        out[row["record_id"]] = [t for text, _ in parts for t in encode(text)] + [eos]
    return out


def _packed(ws: Workspace, key: str, dtype: str) -> tuple[dict, np.ndarray, int, list[dict]]:
    """The packed_blocks outputs, its input ids (read through the verified block reader), block
    length and spans; ``dtype`` is the input_ids field the shard index must declare."""
    _ref, packed = _index(ws, key, "packed_blocks")
    with BlockReader.open(ws.cas, packed["shard_index"]["digest"]) as reader:
        assert reader.index.dtypes()["input_ids"] == np.dtype(dtype)
        tokens = np.concatenate(
            [b["input_ids"].reshape(-1) for b in reader.batches()] or [np.empty(0, dtype)]
        )
    block = read_layer_index(ws, key, "packed_blocks")[1].counts["block_tokens"]
    return packed, tokens, block, get_table(ws.cas, packed["spans"]).to_pylist()


def _check_spans(tokens: np.ndarray, block: int, spans: list[dict], expected: dict) -> None:
    """Every span holds its record's expected tokens at its offset."""
    for span in spans:
        at = span["block"] * block
        piece = tokens[at + span["start"] : at + span["end"]].tolist()
        offset = span["record_offset"]
        assert piece == expected[span["record_id"]][offset : offset + len(piece)], span


def _tokens(stats: dict[str, int]) -> dict[str, int]:
    """The token cache's counts of a layer's run stats (splits adds its held-out search's)."""
    return {k: v for k, v in stats.items() if k.startswith("tokens_")}


def test_a_new_snapshot_tokenises_only_its_new_chunk(workspace: Workspace) -> None:
    first = build_all(workspace, "p1")  # splits tokenises first (per-split token counts)
    assert _tokens(first["splits"].run_stats) == {"tokens_tokenized": 289, "tokens_reused": 0}
    assert first["mixed_samples"].run_stats == {"tokens_tokenized": 0, "tokens_reused": 289}
    packed = {  # no parent: nothing reused or copied
        "tokens_tokenized": 0,
        "tokens_reused": 289,
        "shards_reused": 0,
        "shard_blocks_copied": 0,
    }
    assert first["packed_blocks"].run_stats == packed
    extra = [{"id": f"x{n}", "text": f"A new essay number {n} about rivers."} for n in range(5)]
    path = workspace.home / "demo-sources" / "essays" / "essays-00002.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in extra))
    second = build_all(workspace, "p2")
    assert _tokens(second["splits"].run_stats) == {"tokens_tokenized": 5, "tokens_reused": 289}

    _ref, outputs = _index(workspace, "p2", "packed_blocks")
    _ref, mixed = _index(workspace, "p2", "mixed_samples")
    assert outputs["token_cache"] == mixed["token_cache"] and len(outputs["token_cache"]) == 5
    assert outputs["tokenizer"]["digest"] == "utf8-bytes-v1"
    sid = second["manifest"].digests["snapshotId"]
    report = verify(workspace.cas, workspace.catalog, sid)
    assert report.ok, report.findings
    descriptor = get_json(workspace.cas, outputs["token_cache"][0]["tokens"])
    assert {descriptor["ids"]["digest"], descriptor["offsets"]["digest"]} <= report.digests
    manifest = get_json(workspace.cas, workspace.catalog.layer_output("p2", "manifest"))
    assert manifest["tokenizer"] == outputs["tokenizer"]
    assert manifest["mixture"] == mixed["report"]

    tampered = workspace.cas.path(descriptor["ids"]["digest"])  # a flipped token is named
    data = bytearray(tampered.read_bytes())
    data[-1] ^= 1
    tampered.chmod(0o644)
    tampered.write_bytes(bytes(data))
    findings = verify(workspace.cas, workspace.catalog, sid).findings
    assert any(descriptor["ids"]["digest"] in f for f in findings), findings


def test_packed_tokens_and_mixing_counts_come_from_the_cache(built_workspace: Workspace) -> None:
    expected = _expected_tokens(built_workspace, "p1", lambda text: [*text.encode("utf-8")], 256)
    _packed_outputs, tokens, block, spans = _packed(built_workspace, "p1", "<u2")
    _check_spans(tokens, block, spans, expected)
    _ref, mixed = _index(built_workspace, "p1", "mixed_samples")
    samples = get_table(built_workspace.cas, mixed["samples"]).column("record_id").to_pylist()
    for row in mixed["report"]:
        own = [len(expected[r]) for r in samples if r.startswith(row["source"] + "/")]
        assert row["selected_tokens"] == row["population_tokens"] == sum(own)


def _hf_file(home: Path, texts: list[str]) -> Path:
    path = home / "tok.json"
    path.write_bytes(train_byte_level_bpe([texts], 600, SPECIALS))
    return path


def _with_tokenizer(config: Path, name: str, tokenizer: dict) -> Path:
    document = yaml.safe_load(config.read_text())
    document.setdefault("policies", {})["tokenizer"] = tokenizer
    path = config.with_name(name)
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.mark.parametrize("kind", ["utf8-bytes-v1", "huggingface"])
def test_one_and_two_workers_write_the_same_token_bytes(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    digests = []
    for workers in (1, 2):
        home = tmp_path / f"w{workers}"
        use_demo_copy(demo_home, home, workers, monkeypatch)
        config = Path(os.environ["CORPUS_CONFIG"])
        if kind == HUGGINGFACE:
            _hf_file(home, _demo_texts())
            hf = {"kind": kind, "path": "tok.json", "eos": SPECIALS[0], "pad": SPECIALS[1]}
            config = _with_tokenizer(config, "corpus.yaml", hf)
        with open_workspace(config) as ws:
            for layer in ("raw_snapshot", "canonical_records"):
                BUILDERS[layer](ws, "p1")
            chunks = CanonicalIndex.read(ws, "p1")[1].chunks()
            spec = resolve_tokenizer(ws)
            assert ws.config.execution.workers == workers
            # the configured worker count; use_demo_copy sets in_process_bytes 0: the pool
            cached = token_cache(ws, chunks, spec).chunks
            assert all(c.tokenized for c in cached) and len(cached) == 4
            again = ensure_tokens(ws, chunks, spec, workers)
            assert [c.digest for c in again] == [c.digest for c in cached]
            assert not any(c.tokenized for c in again)
            digests.append([c.digest for c in cached])
            arrays = open_tokens(ws, cached[0], spec)
            assert arrays.ids is not None and isinstance(arrays.ids, np.memmap)
    assert digests[0] == digests[1]


# --- tokenizers by digest ----------------------------------------------------------------------


def test_a_huggingface_tokenizer_by_path_and_digest_packs_its_encode_ids(
    workspace: Workspace,
) -> None:
    build_all(workspace, "p1")
    out = workspace.home / "fitted.json"
    fitted = fit_tokenizer(workspace, "p1", 600, SPECIALS, out)
    assert hashlib.sha256(out.read_bytes()).hexdigest() == fitted.digest.removeprefix("sha256:")
    config = workspace.loaded.path
    hf = {"kind": HUGGINGFACE, "path": "fitted.json", "digest": fitted.digest}
    path = _with_tokenizer(config, "hf.yaml", {**hf, "eos": SPECIALS[0], "pad": SPECIALS[1]})
    with open_workspace(path) as ws:
        results = build_all(ws, "p2")
        assert results["splits"].run_stats["tokens_tokenized"] == 289
        manifest = get_json(ws.cas, ws.catalog.layer_output("p2", "manifest"))
        packed, tokens, block, spans = _packed(ws, "p2", "<u2")
        bpe = Tokenizer.from_file(str(out))
        expected = _expected_tokens(ws, "p2", lambda t: bpe.encode(t).ids, 0)
    assert manifest["tokenizer"]["digest"] == fitted.digest
    assert manifest["tokenizer"]["file"]["digest"] == fitted.digest
    assert manifest["tokenizer"]["specialTokens"]["eos"] == {"token": SPECIALS[0], "id": 0}
    assert manifest["tokenizer"]["vocabSize"] == fitted.vocab_size
    assert packed["pad"] == 1 and packed["dtype"] == "uint16-le"
    _check_spans(tokens, block, spans, expected)


def test_tokenizer_errors_name_the_file_the_digests_and_the_token(workspace: Workspace) -> None:
    file = _hf_file(workspace.home, _demo_texts())
    real = "sha256:" + hashlib.sha256(file.read_bytes()).hexdigest()
    wrong = "sha256:" + "1" * 64
    cases = [
        ({"path": "tok.json", "digest": wrong}, [str(file), real, wrong]),
        ({"path": "tok.json", "eos": "<nope>"}, ["policies.tokenizer.eos", "'<nope>'", real]),
        ({"digest": wrong}, [wrong, "not in the CAS", "tokenizer train"]),
        ({"path": "missing.json"}, ["missing.json", "cannot read"]),
    ]
    for change, words in cases:
        section = {"kind": HUGGINGFACE, "eos": SPECIALS[0], "pad": SPECIALS[1], **change}
        config = _with_tokenizer(workspace.loaded.path, "t.yaml", section)
        with open_workspace(config) as ws, pytest.raises(TokenizerError) as info:
            resolve_tokenizer(ws)
        assert all(w in str(info.value) for w in words), (words, str(info.value))


def test_a_vocabulary_above_65536_ids_packs_uint32(workspace: Workspace) -> None:
    demo_words = sorted({w for t in _demo_texts() for w in t.split()})
    assert len(demo_words) < 1000
    words = {f"w{n}": n for n in range(69_000)}  # filler below the demo's words
    words.update({word: 69_000 + n for n, word in enumerate(demo_words)})
    words.update({"[UNK]": 70_000, "<e>": 70_001, "<p>": 70_002})
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(workspace.home / "big.json"))
    section = {"kind": HUGGINGFACE, "path": "big.json", "eos": "<e>", "pad": "<p>"}
    with open_workspace(_with_tokenizer(workspace.loaded.path, "big.yaml", section)) as ws:
        sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
        packed, tokens, block, spans = _packed(ws, "p1", "<u4")
        expected = _expected_tokens(ws, "p1", lambda t: tokenizer.encode(t).ids, 70_001)
        approve(ws, sid, "reviewer")  # validates first
        activate(ws, sid, "publisher")
        permit = take_permit(ws.cas, ws.catalog, sid, "run-1", ws.config.purpose)
        read = [list(block) for _, block in TrainingReader(ws.cas, ws.catalog, permit).blocks()]
    assert read == tokens.reshape(-1, block).tolist()  # the reader reads uint32 blocks
    assert packed["dtype"] == "uint32-le" and packed["pad"] == 70_002
    assert packed["tokenizer"]["vocabSize"] == 70_003 and len(tokens) % block == 0
    _check_spans(tokens, block, spans, expected)
    assert (tokens > 1 << 16).all()  # every id of this vocabulary needs more than 16 bits


# --- the BPE trainer ---------------------------------------------------------------------------


def test_bpe_training_is_byte_for_byte_deterministic(tmp_path: Path) -> None:
    texts = _demo_texts() + _texts(2000, seed=3)
    first = train_byte_level_bpe([texts[:500], texts[500:]], 800, SPECIALS)
    assert train_byte_level_bpe([texts[:500], texts[500:]], 800, SPECIALS) == first
    corpus = tmp_path / "texts.json"
    corpus.write_text(json.dumps(texts))
    script = (
        "import hashlib, json, sys\n"
        "from corpus_assets.core.tokens.bpe import train_byte_level_bpe\n"
        "texts = json.loads(open(sys.argv[1]).read())\n"
        "data = train_byte_level_bpe([texts[:500], texts[500:]], 800, sys.argv[2:])\n"
        "print(hashlib.sha256(data).hexdigest())\n"
    )
    for threads in ("1", None):  # one rayon thread, and the default pool
        env = {k: v for k, v in os.environ.items() if k != "RAYON_NUM_THREADS"}
        env.update({"RAYON_NUM_THREADS": threads} if threads else {})
        done = subprocess.run(
            [sys.executable, "-c", script, str(corpus), *SPECIALS],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout.strip() == hashlib.sha256(first).hexdigest(), threads


def _marker_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """60 records, each its own random 8-letter marker word 30 times: a marker becomes one
    token only if the trainer read its record."""
    rng = random.Random(7)
    markers = sorted(
        {"".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(8)) for _ in range(60)}
    )
    rows = [
        {"id": f"r{n:02d}", "text": " ".join([m] * 30) + " and so on"}
        for n, m in enumerate(markers)
    ]
    home = tmp_path / "markers"
    (home / "web").mkdir(parents=True)
    (home / "web" / "part-0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "version": 1,
        "purpose": "test",
        "sources": [{"id": "web", "kind": "objects", "path": "web"}],
        "policies": {"splits": {"salt": "markers"}},
    }
    (home / "corpus.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("CORPUS_HOME", str(home))
    monkeypatch.setenv("CORPUS_CONFIG", str(home / "corpus.yaml"))
    monkeypatch.delenv("CORPUS_CATALOG_URL", raising=False)
    return home


def test_the_fitted_bpe_never_learns_what_only_held_out_records_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _marker_home(tmp_path, monkeypatch)
    with open_workspace() as ws:
        for layer in ("raw_snapshot", "canonical_records", "dedup_clusters", "splits"):
            BUILDERS[layer](ws, "p1")
        fitted = fit_tokenizer(ws, "p1", 3000, SPECIALS)
        splits = get_table(ws.cas, read_layer_index(ws, "p1", "splits")[1].output("splits"))
        records = CanonicalIndex.read(ws, "p1")[1].table(["record_id", "text"])
        vocab = Tokenizer.from_str(ws.cas.get_bytes(fitted.digest).decode()).get_vocab()
    split_of = dict(
        zip(*(splits.column(c).to_pylist() for c in ("record_id", "split")), strict=True)
    )
    marker_of = {r["record_id"]: r["text"].split()[0] for r in records.to_pylist()}
    held_out = [r for r, s in split_of.items() if s != "train"]
    train = [r for r, s in split_of.items() if s == "train"]
    assert held_out and train and fitted.records == len(train)
    for record in train:
        assert "Ġ" + marker_of[record] in vocab, record
    for record in held_out:
        marker = marker_of[record]
        assert marker not in vocab and "Ġ" + marker not in vocab, (record, marker)


def test_a_repeated_id_packs_the_text_dedup_kept(workspace: Workspace) -> None:
    """Two rows with one record id and other texts: the later row (a longer text, in a later
    object) is quarantined as ``id.conflict``; the sample is the first row's text."""
    longer = " ".join(["a much longer text that now stands for this record id"] * 20)
    path = workspace.home / "demo-sources" / "essays" / "essays-00002.jsonl"
    path.write_text(json.dumps({"id": "e0000", "text": longer}) + "\n")
    every = {"train_percent": 100, "validation_percent": 0, "test_percent": 0}
    document = yaml.safe_load(workspace.loaded.path.read_text())
    document["policies"]["splits"].update(every)
    config = workspace.loaded.path.with_name("all-train.yaml")
    config.write_text(yaml.safe_dump(document))
    with open_workspace(config) as ws:
        build_all(ws, "p1")
        _packed_outputs, tokens, block, spans = _packed(ws, "p1", "<u2")
        rows = CanonicalIndex.read(ws, "p1")[1].table(["record_id", "text"]).to_pylist()
    first = next(r["text"] for r in rows if r["record_id"] == "essays/e0000")
    mine = sorted(
        (s for s in spans if s["record_id"] == "essays/e0000"), key=lambda s: s["record_offset"]
    )
    covered = sum(s["end"] - s["start"] for s in mine)
    assert first != longer
    assert mine and mine[0]["record_offset"] == 0 and covered == len(first.encode()) + 1
    _check_spans(tokens, block, mine, {"essays/e0000": [*first.encode(), 256]})


def test_a_repeated_id_is_one_mixing_candidate_with_the_kept_rows_tokens(
    workspace: Workspace,
) -> None:
    """Two rows with one record id: mixing counts the record once, with the tokens of the row
    dedup kept (the first; the longer one is an id.conflict), so stream and report agree."""
    longer = " ".join(["a much longer text that now stands for this record id"] * 20)
    path = workspace.home / "demo-sources" / "essays" / "essays-00002.jsonl"
    path.write_text(json.dumps({"id": "e0000", "text": longer}) + "\n")
    document = yaml.safe_load(workspace.loaded.path.read_text())
    document["policies"]["splits"].update(
        {"train_percent": 100, "validation_percent": 0, "test_percent": 0}
    )
    config = workspace.loaded.path.with_name("all-train.yaml")
    config.write_text(yaml.safe_dump(document))
    with open_workspace(config) as ws:
        results = build_all(ws, "p1")
        _ref, mixed = _index(ws, "p1", "mixed_samples")
        samples = get_table(ws.cas, mixed["samples"]).to_pylist()
        splits = results["splits"].counts
    assert [s["record_id"] for s in samples].count("essays/e0000") == 1
    assert len(samples) == splits["train"]  # natural: every train member once
    essays = next(r for r in mixed["report"] if r["source"] == "essays")
    assert essays["population_docs"] == sum(1 for s in samples if s["source_id"] == "essays")
    assert sum(r["population_tokens"] for r in mixed["report"]) == splits["train_tokens"]
