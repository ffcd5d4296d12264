"""CAS references are typed, not guessed.

A Hugging Face ``tokenizer.json`` is an opaque object: its vocabulary may hold the words
``digest``, ``media`` and ``size`` (any large English BPE does), and a walk that took every dict
with those keys for a ref crashed ``snapshot_validates`` (TypeError, the snapshot stayed
BUILDING). Builds go through the real CLI with a real trained tokenizer: one trained on
generated English text (hermetic, always runs) and a 32k one trained on the shared corpora
(skipped when ``../shared`` is absent). The typed walk reaches exactly what the old guessing walk
reached on a real built snapshot whose documents hold no opaque JSON."""

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard

from corpus_assets.core.governance import states
from corpus_assets.core.publication.verify import reachable
from corpus_assets.core.storage.artifacts import JSON, make_ref
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.refs import LEAF, declared_refs
from corpus_assets.core.tokens.bpe import train_byte_level_bpe
from corpus_assets.selftest.attack.store import SPECIALS, ref_word_text
from corpus_assets.selftest.lab import Lab
from corpus_assets_tests.conftest import BuiltDemo
from corpus_assets_tests.paths import CORPORA

CORPORA = CORPORA
ENGLISH = ("licenses", "python-docs", "fortunes")  # the English corpora of ../shared
WORDS = ("digest", "media", "size")


def _shared_english() -> Iterator[list[str]]:
    for name in ENGLISH:
        for path in sorted((CORPORA / name).glob("*.jsonl.zst")):
            with zstandard.open(path, "rb") as raw:
                lines = io.TextIOWrapper(raw, encoding="utf-8")
                batch = [json.loads(line)["text"] for line in lines]
            yield from (batch[n : n + 1000] for n in range(0, len(batch), 1000))


def _write(data: bytes, path: Path) -> Path:
    vocab = json.loads(data)["model"]["vocab"]
    assert set(WORDS) <= set(vocab), "the tokenizer must have digest, media, size as tokens"
    path.write_bytes(data)
    return path


@pytest.fixture(scope="session")
def shared_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 32k byte-level BPE trained once on the shared English corpora."""
    if not CORPORA.is_dir():
        pytest.skip("../shared/corpora is absent: the 32k tokenizer is trained on it")
    data = train_byte_level_bpe(_shared_english(), 32_000, SPECIALS)
    return _write(data, tmp_path_factory.mktemp("tok32k") / "tokenizer.json")


@pytest.fixture
def lab(selftest_lab: Lab) -> Lab:
    return selftest_lab


@pytest.fixture(params=["generated", "shared-32k"])
def tokenizer(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    if request.param == "shared-32k":
        return request.getfixturevalue("shared_tokenizer")
    data = train_byte_level_bpe(ref_word_text(), 1024, SPECIALS)
    return _write(data, tmp_path / "tokenizer.json")


def test_a_tokenizer_whose_vocabulary_spells_a_ref_builds_validates_and_survives_gc(
    lab: Lab, tokenizer: Path
) -> None:
    home, _ = lab.copy_of_reference("hf-tokenizer")
    policy = {"kind": "huggingface", "path": str(tokenizer), "eos": SPECIALS[0]}
    policy["pad"] = SPECIALS[1]
    docs = {"id": "docs", "kind": "objects", "path": str(lab.standard_sources)}
    home.configure([docs], f"policies: {{tokenizer: {json.dumps(policy)}}}\n")
    ran = home.cli("build", "--partition", "p3")
    assert "Traceback" not in ran.err, ran.err[-2000:]
    assert ran.code == 0, ran.err[-2000:]
    assert "VALIDATED" in ran.out, ran.out[-2000:]
    status = json.loads(home.must("status", "--json").out)
    p3 = [s for s in status["snapshots"] if s["partition"] == "p3"]
    assert [s["state"] for s in p3] == ["VALIDATED"]
    verify = home.cli("verify", p3[0]["snapshotId"])
    assert verify.code == 0, verify.out + verify.err
    cas = ContentStore(home.dir / "data" / "cas")
    file_digest = "sha256:" + hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    assert cas.contains(file_digest)
    garbage = json.loads(home.must("gc", "--dry-run", "--json").out)["objects"]
    assert file_digest not in {o["digest"] for o in garbage}  # reached, as a leaf


def _guessing_walk(cas: ContentStore, node: Any, seen: set[str]) -> None:
    """The earlier guessing walk: every dict with digest/media/size is a ref, every JSON one is
    read and walked (kept here as the coverage reference for a snapshot with no opaque JSON)."""
    if isinstance(node, dict) and set(node) >= {"digest", "media", "size"}:
        if node["digest"] not in seen:
            seen.add(node["digest"])
            if node["media"] == JSON:
                _guessing_walk(cas, json.loads(cas.get_bytes(node["digest"])), seen)
        return
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    for child in children:
        _guessing_walk(cas, child, seen)


@pytest.mark.parametrize("built_demo", ["sqlite"], indirect=True)
def test_typed_walk_reaches_what_the_guessing_walk_reached_on_a_real_snapshot(
    built_demo: BuiltDemo,
) -> None:
    cas = ContentStore(built_demo.home / "cas")
    catalog = Catalog(built_demo.catalog_url)
    manifest = states.get(catalog, built_demo.snapshot_id).manifest_digest
    catalog.dispose()
    root = make_ref(manifest, JSON, cas.size(manifest))
    typed, findings = reachable(cas, [root])
    assert findings == []
    guessed: set[str] = set()
    _guessing_walk(cas, root, guessed)
    assert len(typed) > 50
    assert typed == guessed


DIGEST = "sha256:" + "ab" * 32


def test_only_declared_fields_are_refs_and_an_undeclared_one_is_a_finding() -> None:
    tokenizer = {"schema": "corpus.tokenizer.v1", "kind": "huggingface", "digest": DIGEST}
    tokenizer["file"] = make_ref(DIGEST, JSON, 10)
    refs, findings = declared_refs(tokenizer)
    assert refs == [(".file", tokenizer["file"], LEAF)] and findings == []
    vocabulary = {"model": {"vocab": {"digest": 7, "media": 8, "size": 9}}}
    assert declared_refs(vocabulary)[0] == []  # not a document of ours: nothing followed
    chunk = {"schema": "corpus.chunk.v2", "records": make_ref(DIGEST, JSON, 1)}
    chunk["excluded"] = {"digest": 7, "media": 8, "size": 9}
    chunk["extra"] = make_ref(DIGEST, JSON, 1)
    refs, findings = declared_refs(chunk)
    assert [path for path, _, _ in refs] == [".records"]
    assert findings == [
        "corpus.chunk.v2 field .excluded is not a well-formed ref",
        "corpus.chunk.v2 names a ref at .extra, a field its kind does not declare",
    ]
