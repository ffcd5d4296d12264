"""canonical_records end to end: typed kinds, stages and reason codes, accounting, workers."""

import json
import resource
import unicodedata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from corpus_assets.core.governance import alias_gate, benchmarks
from corpus_assets.core.pipeline import BUILDERS, DIRECT_BUILDERS
from corpus_assets.core.records.canonicalize import Excluded, Stages, canonicalize
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.records.normalize import dedup_key
from corpus_assets.core.records.quality import QualityPolicy
from corpus_assets.core.runtime.config import ObjectsSource
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets_tests.conftest import use_demo_copy
from corpus_assets_tests.paths import CORPORA

CORPORA = CORPORA


def _canonical(ws: Workspace, key: str = "p1") -> tuple[dict, pa.Table]:
    BUILDERS["raw_snapshot"](ws, key)
    result = BUILDERS["canonical_records"](ws, key)
    index = json.loads(ws.cas.get_bytes(result.digest))
    return index, CanonicalIndex.load(ws.cas, result.digest).table()


def _built_canonical(ws: Workspace, key: str = "p1") -> tuple[dict, pa.Table]:
    """``_canonical``'s answer from a partition already built."""
    digest = ws.catalog.layer_output(key, "canonical_records")
    return json.loads(ws.cas.get_bytes(digest)), CanonicalIndex.load(ws.cas, digest).table()


def _exclusions(ws: Workspace, index: dict) -> list[dict]:
    rows = []
    for chunk in index["outputs"]["chunks"]:
        descriptor = json.loads(ws.cas.get_bytes(chunk["output"]["digest"]))
        table = pq.read_table(pa.BufferReader(ws.cas.get_bytes(descriptor["excluded"]["digest"])))
        rows += table.to_pylist()
    return rows


@pytest.mark.parametrize("built_demo", ["sqlite"], indirect=True)
def test_demo_kinds_stages_and_accounting(built_workspace: Workspace) -> None:
    ws = built_workspace
    index, records = _built_canonical(ws)
    chats = {r["record_id"]: r for r in records.to_pylist() if r["source_id"] == "chats"}
    assert {r["kind"] for r in chats.values()} == {"messages"}
    tool = json.loads(chats["chats/c001"]["payload"])["messages"]
    assert [t["role"] for t in tool] == ["user", "assistant", "tool", "assistant"]
    assert tool[1]["tool_calls"] == [{"id": "t1", "name": "weather"}]
    assert tool[2]["tool_call_id"] == "t1"
    assert "[EMAIL]" in chats["chats/c000"]["text"]
    assert "ada.lovelace@example.org" not in records.column("text").to_pylist()[0]
    assert not any("example.org" in r["payload"] for r in chats.values())
    assert json.loads(chats["chats/c000"]["pii"]) == {"email": 1}

    accounting = index["outputs"]["accounting"]
    for source, account in accounting.items():
        assert account["rows_in"] == (
            account["kept"] + account.get("quarantined", 0) + account.get("rejected", 0)
        ), source
    assert accounting["chats"]["quarantined:schema.unknown"] == 1
    assert accounting["chats"]["pii:email"] == 1
    assert index["counts"]["unexplained"] == 0
    assert index["counts"]["quarantined.parse.invalid_json"] == 1
    reasons = {r["reason"] for r in _exclusions(ws, index)}
    assert reasons == {"parse.blank_line", "parse.invalid_json", "schema.unknown"}


def test_benchmark_item_embedded_in_a_document_is_excluded(demo_home: Path) -> None:
    question = (
        "Which river flows through the quiet harbor past the velvet meadow where the patient "
        "lantern keeper counts each ember of the orbit every careful evening?"
    )
    essays = demo_home / "demo-sources" / "essays" / "essays-00001.jsonl"
    long_text = " ".join(["Filler words about many unrelated things."] * 300)
    with essays.open("a") as handle:
        handle.write(
            json.dumps({"id": "leak", "text": long_text + " " + question + " " + long_text}) + "\n"
        )
    with open_workspace() as ws:
        item = benchmarks.BenchmarkItem(
            "quiz/7", ws.cas.put_bytes(question.encode()), dedup_key(question)
        )
        alias_gate.read_alias_gate(ws.catalog, "demo")
        benchmarks.add_benchmark_items(ws.catalog, "quiz", [item])
        index, records = _canonical(ws)
        excluded = [r for r in _exclusions(ws, index) if r["reason"] == "contamination.benchmark"]
    assert "essays/leak" not in records.column("record_id").to_pylist()
    assert len(excluded) == 1 and excluded[0]["detail"].startswith("item quiz/7 containment 100")
    assert question not in excluded[0]["detail"]


def test_one_and_two_workers_give_identical_bytes(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    digests = []
    for workers in (1, 2):
        use_demo_copy(demo_home, tmp_path / f"w{workers}", workers, monkeypatch)
        with open_workspace() as ws:
            result = BUILDERS["raw_snapshot"](ws, "p1")
            canonical = BUILDERS["canonical_records"](ws, "p1")
            digests.append((result.digest, canonical.digest))
    assert digests[0] == digests[1]


def test_an_unchanged_partition_starts_no_worker_process(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With two workers, a second partition over the same objects reuses every chunk in the
    driver: no spawn pool (seconds of imports per worker) for work that is already done."""
    use_demo_copy(demo_home, tmp_path / "w2", 2, monkeypatch)
    with open_workspace() as ws:
        for partition in ("p1", "p2"):
            BUILDERS["raw_snapshot"](ws, partition)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            # chunk reuse, not the layer memo
            result = DIRECT_BUILDERS["canonical_records"](ws, partition)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            workers_cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            if partition == "p1":  # the pool ran: its workers' CPU is counted when they exit
                assert result.run_stats["chunks_built"] > 0 and workers_cpu > 0.1
    assert result.run_stats == {"chunks_reused": 4, "chunks_built": 0}
    assert workers_cpu == 0.0


needs_corpora = pytest.mark.skipif(not CORPORA.is_dir(), reason="../shared/corpora is absent")


def _real(tmp_path: Path, name: str, extra: str) -> Workspace:
    config = tmp_path / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: real\nstorage: {{home: {tmp_path / 'home'}}}\n"
        f"sources:\n  - {{id: {name}, kind: objects, path: {CORPORA / name}{extra}}}\n"
    )
    return open_workspace(config)


def _originals(name: str) -> dict[str, dict]:
    rows = {}
    for path in sorted((CORPORA / name).glob("*.jsonl.zst")):
        for line in zstandard.decompress(path.read_bytes()).splitlines():
            row = json.loads(line)
            rows[row["id"]] = row
    return rows


@needs_corpora
def test_real_chat_dialogs_become_messages_with_turns_intact(tmp_path: Path) -> None:
    with _real(
        tmp_path, "chat-dialogs", ", adapter: chat-messages.v1, messages_field: meta.messages"
    ) as ws:
        index, records = _canonical(ws)
    originals = _originals("chat-dialogs")
    assert index["outputs"]["accounting"]["chat-dialogs"]["rows_in"] == len(originals)
    assert index["counts"]["unexplained"] == 0
    for row in records.slice(0, 500).to_pylist():
        source = originals[row["record_id"].split("/", 1)[1]]["meta"]["messages"]
        turns = json.loads(row["payload"])["messages"]
        assert [t["role"] for t in turns] == [t["role"] for t in source]
        assert row["kind"] == "messages"


@needs_corpora
def test_real_fortunes_lose_ansi_and_overstrike(tmp_path: Path) -> None:
    with _real(tmp_path, "fortunes", "") as ws:
        index, records = _canonical(ws)
    texts = records.column("text").to_pylist()
    assert not any("\x1b[" in t or "\b" in t for t in texts)
    originals = _originals("fortunes")
    assert any("\x1b[" in r["text"] for r in originals.values())  # the corpus really has them
    assert any("\b" in r["text"] for r in originals.values())
    account = index["outputs"]["accounting"]["fortunes"]
    assert account["rows_in"] == len(originals) and index["counts"]["unexplained"] == 0


@needs_corpora
def test_real_python_stdlib_keeps_indentation_byte_for_byte(tmp_path: Path) -> None:
    with _real(tmp_path, "python-stdlib", ", content: code") as ws:
        index, records = _canonical(ws)
    originals = _originals("python-stdlib")
    assert index["outputs"]["accounting"]["python-stdlib"]["rows_in"] == len(originals)
    identical = 0
    for row in records.to_pylist():
        original = originals[row["record_id"].split("/", 1)[1]]["text"].replace("\r\n", "\n")
        ours, theirs = row["text"].split("\n"), original.split("\n")
        assert len(ours) == len(theirs), row["record_id"]
        for a, b in zip(ours, theirs, strict=True):  # indentation survives, even where PII went
            assert a[: len(a) - len(a.lstrip())] == b[: len(b) - len(b.lstrip())], row["record_id"]
        redacted = json.loads(row["pii"])
        # any other byte change must be a PII placeholder or Unicode NFC, nothing else
        assert row["text"] in (original, unicodedata.normalize("NFC", original)) or redacted
        identical += row["text"] == original
    assert identical > 0.75 * len(originals)


def _one(adapter: str, row: dict, **fields: str) -> dict:
    source = ObjectsSource(id="s", kind="objects", path=".", adapter=adapter, **fields)
    return canonicalize(source, "o.jsonl", 1, row, Stages("p", QualityPolicy(), None))


def test_preference_is_one_record_with_its_three_parts() -> None:
    record = _one("preference.v1", {"id": 1, "prompt": "2+2?", "chosen": "4", "rejected": "5"})
    assert record["kind"] == "preference"
    assert json.loads(record["payload"]) == {"prompt": "2+2?", "chosen": "4", "rejected": "5"}
    with pytest.raises(Excluded, match=r"schema.preference.identical"):
        _one("preference.v1", {"prompt": "q", "chosen": "same", "rejected": "same"})


def test_unpaired_tool_results_and_unknown_roles_are_schema_errors() -> None:
    orphan = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "tool", "tool_call_id": "x", "content": "42"},
        ]
    }
    with pytest.raises(Excluded, match=r"schema.messages.tool"):
        _one("chat-messages.v1", orphan)
    with pytest.raises(Excluded, match=r"schema.messages.role"):
        _one("chat-messages.v1", {"messages": [{"role": "narrator", "content": "x"}]})
    with pytest.raises(Excluded, match=r"schema.unknown"):
        _one("chat-messages.v1", {"text": "no messages here"})


def test_purpose_outside_a_sources_licence_is_a_governance_rejection() -> None:
    with pytest.raises(Excluded, match=r"governance.purpose"):
        _one("jsonl-text.v1", {"text": "x"}, purposes=["research"])


@pytest.mark.parametrize("built_demo", ["sqlite"], indirect=True)
def test_lineage_offsets_point_at_the_source_line(built_workspace: Workspace) -> None:
    ws = built_workspace
    _index, records = _built_canonical(ws)
    rows = records.select(["record_id", "object", "line", "byte_offset"]).to_pylist()
    objects = {r["object"] for r in rows}
    raw = {
        d: zstandard.ZstdDecompressor().decompressobj().decompress(ws.cas.get_bytes(d))
        if ws.cas.get_bytes(d)[:4] == b"\x28\xb5\x2f\xfd"
        else ws.cas.get_bytes(d)
        for d in objects
    }
    for row in rows:
        data = raw[row["object"]]
        assert data[: row["byte_offset"]].count(b"\n") == row["line"] - 1
        local_id = row["record_id"].split("/", 1)[1]
        line = data[row["byte_offset"] :].split(b"\n", 1)[0]
        assert json.loads(line)["id"] == local_id
