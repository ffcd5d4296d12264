"""Decontamination through the layers: the report in the canonical_records index, the manifest
and the Dagster metadata; a config still naming the removed ``contamination.v1`` is refused."""

import json
from pathlib import Path

import dagster as dg
import pytest

from corpus_assets.assets.metadata import layer_metadata
from corpus_assets.core.governance import alias_gate, benchmarks
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.manifest_schema import schema_errors
from corpus_assets.core.records.normalize import dedup_key
from corpus_assets.core.runtime.config import ConfigError, load_config
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_json
from corpus_assets_tests.core.records.test_canonical import _exclusions
from corpus_assets_tests.core.records.test_contamination import ANSWER, SOLUTION


def _leaks(home: Path, version: str | None) -> None:
    """A fortune quoting a 12-token answer and a chat message holding a re-spaced solution."""
    fortune = "Q: And the seeds?\nA: Nothing in particular happens -- that’s all; you just eat "
    fortune += "watermelon seeds!\n\t\t-- Overheard at a picnic"
    with (home / "demo-sources" / "essays" / "essays-00001.jsonl").open("a") as handle:
        handle.write(json.dumps({"id": "fortune", "text": fortune}) + "\n")
    code = SOLUTION.replace(", ", ",").replace(" - ", "-").replace("    ", "  ")
    messages = [
        {"role": "user", "content": "Fix my function please."},
        {"role": "assistant", "content": f"Here you go:\n```python\n{code}```"},
    ]
    with (home / "demo-sources" / "chats" / "chats-00000.jsonl").open("a") as handle:
        handle.write(json.dumps({"id": "leak", "messages": messages}) + "\n")
    if version:
        config = home / "corpus.yaml"
        text = config.read_text().replace(
            "policies:\n", f"policies:\n  contamination: {{version: {version}}}\n"
        )
        config.write_text(text)


def _register(ws: Workspace) -> None:
    alias_gate.read_alias_gate(ws.catalog, "demo")
    for name, items in (
        ("truthfulqa", [("tqa/1", ANSWER), ("tqa/2", "Why?")]),
        ("humaneval", [("he/0", SOLUTION)]),
    ):
        registered = [
            benchmarks.BenchmarkItem(i, ws.cas.put_bytes(t.encode()), dedup_key(t))
            for i, t in items
        ]
        benchmarks.add_benchmark_items(ws.catalog, name, registered)


def test_v2_report_reaches_the_index_the_manifest_and_the_metadata(demo_home: Path) -> None:
    _leaks(demo_home, None)
    with open_workspace() as ws:
        _register(ws)
        results = build_all(ws, "p1")
        canonical = json.loads(ws.cas.get_bytes(results["canonical_records"].digest))
        excluded = [
            r for r in _exclusions(ws, canonical) if r["reason"] == "contamination.benchmark"
        ]
        manifest = get_json(ws.cas, ws.catalog.layer_output("p1", "manifest"))
    report = canonical["outputs"]["contamination"]
    assert report["policy"] == "contamination.v2"
    assert report["benchmarks"] == [
        {"benchmark": "humaneval", "items": 1, "short_items": 0, "checked_whole": 0,
         "unchecked": 0, "flagged": 1},
        {"benchmark": "truthfulqa", "items": 2, "short_items": 2, "checked_whole": 1,
         "unchecked": 1, "flagged": 1},
    ]  # fmt: skip
    assert report["flagged"] == [
        {"benchmark": "humaneval", "source": "chats", "records": 1},
        {"benchmark": "truthfulqa", "source": "essays", "records": 1},
    ]
    details = sorted(r["detail"] for r in excluded)
    assert details[0].startswith("item he/0 containment 100.00% (")
    assert details[0].endswith("shared n-grams) of benchmark humaneval")
    assert details[1] == "item tqa/1 containment 100.00% (whole item) of benchmark truthfulqa"
    assert manifest["contamination"] == report
    assert schema_errors(manifest) == []

    metadata = layer_metadata(results["canonical_records"])
    table = metadata["contamination"]
    assert isinstance(table, dg.TableMetadataValue)
    columns = {c.name: c.type for c in table.schema.columns}
    assert columns == {
        "benchmark": "string",
        "items": "int",
        "short_items": "int",
        "checked_whole": "int",
        "unchecked": "int",
        "flagged": "int",
    }
    assert metadata["contamination.flagged"].value == 2.0
    assert metadata["contamination.flagged.truthfulqa"].value == 1.0


def test_a_config_selecting_v1_is_an_error_naming_the_key_and_the_file(demo_home: Path) -> None:
    _leaks(demo_home, "contamination.v1")
    with pytest.raises(ConfigError) as error:
        load_config()
    config = demo_home / "corpus.yaml"
    assert str(error.value).startswith(
        f"{config}: policies.contamination.version: contamination.v1 is no longer available"
    )
