"""An incremental chain and a from-scratch build of the same final sources agree.

Five changes, each built and published on one alias (so each build's parent is the one before):
an append with near-duplicates of old and new rows, a deleted object, a tombstone, an edited
object (same name, other bytes) and another append. A fresh home then builds the final sources
once, under the same tombstone. Members, dedup verdicts, splits and the mixture must be equal;
packing may differ only in layout (its padding is the packing tests' concern).
"""

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.publication.verify import load_manifest, resolve
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.selftest.corpus import write_zstd_jsonl
from corpus_assets.selftest.evidence import workspace
from corpus_assets.selftest.lab import Home, Lab

TOMBSTONED = "docs/2-17"


@pytest.fixture
def lab(selftest_lab: Lab) -> Lab:
    return selftest_lab


def _rows(folder: Path, name: str) -> list[dict[str, Any]]:
    import json

    import zstandard

    data = zstandard.ZstdDecompressor().stream_reader((folder / name).open("rb")).read()
    return [json.loads(line) for line in data.decode().splitlines()]


def _append(folder: Path, name: str, prefix: str, old: list[dict[str, Any]]) -> None:
    """New rows: fresh texts, near-duplicates of old rows (one word changed) and of each other."""
    rows = [{"id": f"{prefix}-{i}", "text": f"{prefix} fresh row {i} " * 12} for i in range(20)]
    for i, row in enumerate(old[1:41:4]):
        words = row["text"].split()
        words[len(words) // 2] = "changed"
        rows.append({"id": f"{prefix}-near-{i}", "text": " ".join(words)})
    rows += [{"id": f"{prefix}-twin-{i}", "text": rows[i]["text"] + " twin"} for i in range(3)]
    write_zstd_jsonl(folder / name, rows)


def _edit(folder: Path, name: str) -> None:
    """The same object name with other bytes: every fifth row's text changed, one row dropped."""
    rows = _rows(folder, name)[:-1]
    for row in rows[::5]:
        row["text"] = row["text"] + " edited"
    write_zstd_jsonl(folder / name, rows)


def _changes(folder: Path) -> list[tuple[str, Any]]:
    base = _rows(folder, "part-000.jsonl.zst")
    return [
        ("append", lambda: _append(folder, "part-100.jsonl.zst", "a1", base)),
        ("delete", lambda: (folder / "part-004.jsonl.zst").unlink()),
        ("tombstone", None),
        ("edit", lambda: _edit(folder, "part-001.jsonl.zst")),
        ("append", lambda: _append(folder, "part-101.jsonl.zst", "a2", base)),
    ]


def _tombstone(home: Home) -> None:
    home.must("tombstone", "add", "--record", TOMBSTONED, "--reason", "equivalence test")


def _tables(home: Home, sid: str) -> dict[str, list[dict[str, Any]]]:
    """The compared tables of ``sid``, each as sorted rows."""
    wanted = {
        "dedup_clusters": "clusters",
        "splits": "splits",
        "mixed_samples": "samples",
    }
    with workspace(home) as ws:
        snapshot = resolve(ws.catalog, sid)
        tables = {"members": read_members(ws.cas, load_manifest(ws.cas, snapshot).members)}
        for layer, output in wanted.items():
            index = load_index(
                ws.cas, ws.catalog.layer_output(snapshot.partition_key, layer), layer
            )
            table = PartedTable.read(ws.cas, index.output(output), output)  # whole or parts
            tables[layer] = table.table(VerifiedFiles(ws.cas), output)
        return {
            name: sorted(table.to_pylist(), key=lambda r: sorted(r.items()))
            for name, table in tables.items()
        }


def test_an_incremental_chain_equals_a_build_from_scratch(lab: Lab, tmp_path: Path) -> None:
    folder = tmp_path / "sources"
    shutil.copytree(lab.standard_sources, folder)
    chain = lab.home("chain")
    chain.configure([{"id": "docs", "kind": "objects", "path": str(folder)}])
    published = [chain.build().snapshot_id]
    chain.publish(published[0])
    edited = _edited_ids(folder, "part-001.jsonl.zst")
    for name, change in _changes(folder):
        _tombstone(chain) if change is None else change()
        built = chain.build()
        assert built.state == "VALIDATED", (name, built)
        chain.publish(built.snapshot_id)
        published.append(built.snapshot_id)
    scratch = lab.home("scratch")
    scratch.configure([{"id": "docs", "kind": "objects", "path": str(folder)}])
    _tombstone(scratch)
    incremental, full = _tables(chain, published[-1]), _tables(scratch, scratch.build().snapshot_id)
    for tables in (incremental, full):  # the tombstone holds in both
        assert TOMBSTONED not in {row["record_id"] for row in tables["members"]}
    assert incremental["dedup_clusters"] == full["dedup_clusters"]
    before_edit = _splits(_tables(chain, published[3])["splits"])
    for name in ("members", "splits"):
        chained, fresh = _splits(incremental[name]), _splits(full[name])
        moved = {record for record in chained if chained[record] != fresh[record]}
        assert moved <= edited, _difference(name, incremental[name], full[name])
        assert all(chained[record] == before_edit[record] for record in moved)  # inherited
        assert _without_split(incremental[name]) == _without_split(full[name]), name
    _same_mixture_rule(incremental, full)


def _edited_ids(folder: Path, name: str) -> set[str]:
    """The record ids ``_edit`` changes the text of (it keeps the rest)."""
    return {f"docs/{row['id']}" for row in _rows(folder, name)[:-1][::5]}


def _splits(rows: list[dict[str, Any]]) -> dict[str, str]:
    return {row["record_id"]: row["split"] for row in rows}


def _without_split(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "split"} for row in rows]


def _same_mixture_rule(chained: dict[str, Any], fresh: dict[str, Any]) -> None:
    """Same sample count per source and every sample a train member of its own snapshot: the
    mixture is the same rule over train sets that differ only by the inherited splits."""
    for tables in (chained, fresh):
        train = {r["record_id"] for r in tables["members"] if r["split"] == "train"}
        assert {row["record_id"] for row in tables["mixed_samples"]} <= train
    count = Counter[str]
    assert count(r["source_id"] for r in chained["mixed_samples"]) == count(
        r["source_id"] for r in fresh["mixed_samples"]
    )


def _difference(name: str, chain: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> str:
    """Which columns differ in how many rows, with the first differing pair."""
    if len(chain) != len(fresh):
        return f"{name}: {len(chain)} rows after the chain, {len(fresh)} from scratch"
    pairs = [(a, b) for a, b in zip(chain, fresh, strict=True) if a != b]
    columns = sorted({k for a, b in pairs for k in a if a.get(k) != b.get(k)})
    return f"{name}: {len(pairs)} rows differ in {columns}; first: {pairs[0]}"
