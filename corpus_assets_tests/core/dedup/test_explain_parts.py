"""``explain`` answers the same whether the dedup clusters table is stored whole (sorted by
record id) or as one part per canonical chunk (each sorted by record id, their concatenation in
chunk order): the record is found in whichever part holds it, a record id on two rows gives the
row first by object and line, and its cluster and leakage group come in record id order."""

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from corpus_assets.core.dedup.explain import explain
from corpus_assets.core.runtime.layer_index import LayerIndex
from corpus_assets.core.runtime.snapshot_manifest import (
    CLUSTER_PARTS_SCHEMA,
    ChunkPart,
    ChunkParts,
)
from corpus_assets.core.storage.artifacts import Ref, put_json, put_table
from corpus_assets.core.storage.cas import ContentStore

# (record_id, object, line, verdict, representative_id, is_representative, match_id, leakage)
ROWS = [
    ("r1", "a", 0, "keep", "r1", True, "", "L1"),
    ("r3", "a", 1, "exact", "r1", False, "r1", "L1"),
    ("r5", "a", 2, "keep", "r5", True, "r2", "L2"),
    ("r2", "b", 0, "keep", "r2", True, "", "L2"),
    ("r3", "b", 2, "excluded", "", False, "", "L3"),
    ("r4", "b", 1, "near", "r2", False, "r2", "L2"),
]
NAMES = [
    "record_id",
    "object",
    "line",
    "verdict",
    "representative_id",
    "is_representative",
    "match_id",
    "leakage_id",
]


def _clusters(rows: list[tuple]) -> pa.Table:
    columns = {name: [row[i] for row in rows] for i, name in enumerate(NAMES)}
    n = len(rows)
    table = pa.table(
        {
            **columns,
            "source_id": ["src"] * n,
            "group_id": [f"g{row[7]}" for row in rows],
            "dedup_key": [f"k{row[0]}" for row in rows],
            "match_jaccard": [0.9 if row[6] else 0.0 for row in rows],
            "excluded": [row[3] == "excluded" for row in rows],
        }
    )
    return table.sort_by([(key, "ascending") for key in ("record_id", "object", "line")])


def _index(cas: ContentStore, layer: str, outputs: dict[str, Any]) -> Ref:
    index = LayerIndex(layer=layer, code="test", policy=None, inputs=[], outputs=outputs, counts={})
    return put_json(cas, index.document())


def _manifest(cas: ContentStore, clusters: Ref) -> SimpleNamespace:
    """What ``explain`` reads of a manifest: the two layers' indexes and the snapshot id."""
    whole = _clusters(ROWS)
    splits = pa.table({"record_id": pc.unique(whole["record_id"])})
    splits = splits.append_column("split", pa.array(["train"] * splits.num_rows))
    layers = {
        "dedup_clusters": _index(cas, "dedup_clusters", {"clusters": clusters}),
        "splits": _index(cas, "splits", {"splits": put_table(cas, splits)}),
    }
    return SimpleNamespace(layers=layers, snapshot_id="sha256:test")


def _parts(cas: ContentStore) -> Ref:
    """One part per object (canonical chunk), each sorted by record id."""
    parts = []
    for chunk in ("a", "b"):
        table = _clusters([row for row in ROWS if row[1] == chunk])
        ref = put_table(cas, table)
        parts.append(ChunkPart(chunk=chunk, records=chunk, count=table.num_rows, **ref))
    document = ChunkParts(schema=CLUSTER_PARTS_SCHEMA, code="test", count=len(ROWS), parts=parts)
    return put_json(cas, document.document())


@pytest.fixture
def stores(tmp_path: Path) -> tuple[ContentStore, SimpleNamespace, SimpleNamespace]:
    cas = ContentStore(tmp_path / "cas")
    whole = _manifest(cas, put_table(cas, _clusters(ROWS)))
    return cas, whole, _manifest(cas, _parts(cas))


@pytest.mark.parametrize("record_id", ["r1", "r2", "r3", "r4", "r5"])
def test_parts_answer_as_the_whole_table(stores: tuple, record_id: str) -> None:
    cas, whole, parted = stores
    assert explain(cas, parted, record_id) == explain(cas, whole, record_id)


def test_parts_are_searched_in_turn_and_answers_are_in_record_order(stores: tuple) -> None:
    cas, _whole, parted = stores
    answer = explain(cas, parted, "r4")  # in the second part
    assert answer["record"]["object"] == "b" and answer["record"]["line"] == 1
    assert [r["record_id"] for r in answer["cluster"]] == ["r2", "r4"]
    group = answer["leakage_group"]
    assert group["id"] == "L2"
    assert [r["record_id"] for r in group["records"]] == ["r2", "r4", "r5"]  # not a's r5 first
    assert {r["split"] for r in group["records"]} == {"train"}


def test_a_record_id_on_two_parts_gives_its_first_row_by_object_and_line(stores: tuple) -> None:
    cas, _whole, parted = stores
    row = explain(cas, parted, "r3")["record"]
    assert (row["object"], row["line"], row["verdict"]) == ("a", 1, "exact")


def test_a_record_no_part_holds_is_named(stores: tuple) -> None:
    cas, _whole, parted = stores
    with pytest.raises(KeyError, match="'r9' is not in snapshot sha256:test"):
        explain(cas, parted, "r9")
