"""An incremental chain and a from-scratch build of the same final sources agree, and each
snapshot of the chain reaches its own objects only, not its ancestors'.

Five changes, each built and published on one alias (so each build's parent is the one before):
an append with near-duplicates of old and new rows, a deleted object, a tombstone, an edited
object (same name, other bytes) and another append. A fresh home then builds the final sources
once, under the same tombstone. Members, dedup verdicts, splits and the mixture must be equal;
packing may differ only in layout (its padding is the packing tests' concern).

A child's splits and packed layers name their parent's index (their bytes depend on it), but a
snapshot's closure - what ``verify``, approval, activation and scrub re-hash, and what gc keeps -
must not run on through that name into every ancestor's tables: a daily build would re-hash and
keep every generation it ever made.
"""

import json
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.publication.verify import load_manifest, reachable, resolve
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import JSON, make_ref
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.selftest.corpus import write_zstd_jsonl
from corpus_assets.selftest.evidence import workspace
from corpus_assets.selftest.lab import Home, Lab
from corpus_assets_tests.conftest import shared_lab

TOMBSTONED = "docs/2-17"
# each layer's own tables that a later generation of the chain no longer names
RETIRED = {"splits": ("splits", "heldout_state"), "packed_blocks": ("spans",)}


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


@dataclass(frozen=True)
class Chain:
    lab: Lab
    home: Home
    folder: Path
    published: list[str]  # the snapshot ids in order: the first build, then one per change
    edited: set[str]


@pytest.fixture(scope="module")
def chain(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Chain:
    """The first build and the five changes, each built, approved and activated."""
    lab = shared_lab(request, "sqlite")
    folder = tmp_path_factory.mktemp("chain") / "sources"
    shutil.copytree(lab.standard_sources, folder)
    home = lab.home(f"chain-{folder.parent.name}")
    home.configure([{"id": "docs", "kind": "objects", "path": str(folder)}])
    published = [home.build().snapshot_id]
    home.publish(published[0])
    edited = _edited_ids(folder, "part-001.jsonl.zst")
    for name, change in _changes(folder):
        _tombstone(home) if change is None else change()
        built = home.build()
        assert built.state == "VALIDATED", (name, built)
        home.publish(built.snapshot_id)
        published.append(built.snapshot_id)
    return Chain(lab, home, folder, published, edited)


def test_an_incremental_chain_equals_a_build_from_scratch(chain: Chain) -> None:
    published = chain.published
    scratch = chain.lab.home(f"scratch-{chain.folder.parent.name}")
    scratch.configure([{"id": "docs", "kind": "objects", "path": str(chain.folder)}])
    _tombstone(scratch)
    incremental = _tables(chain.home, published[-1])
    full = _tables(scratch, scratch.build().snapshot_id)
    for tables in (incremental, full):  # the tombstone holds in both
        assert TOMBSTONED not in {row["record_id"] for row in tables["members"]}
    assert incremental["dedup_clusters"] == full["dedup_clusters"]
    before_edit = _splits(_tables(chain.home, published[3])["splits"])
    for name in ("members", "splits"):
        chained, fresh = _splits(incremental[name]), _splits(full[name])
        moved = {record for record in chained if chained[record] != fresh[record]}
        assert moved <= chain.edited, _difference(name, incremental[name], full[name])
        assert all(chained[record] == before_edit[record] for record in moved)  # inherited
        assert _without_split(incremental[name]) == _without_split(full[name]), name
    _same_mixture_rule(incremental, full)


def test_a_snapshot_reaches_none_of_its_ancestors_tables(chain: Chain) -> None:
    """The last generation's closure holds none of the first one's tables it does not use
    itself, and gc under ``keep_generations: 1`` would remove them; the last still verifies."""
    first, last = chain.published[0], chain.published[-1]
    with workspace(chain.home) as ws:
        retired = _own_tables(ws, first) - _own_tables(ws, last)
        manifest = resolve(ws.catalog, last).manifest_digest
        closure, findings = reachable(ws.cas, [make_ref(manifest, JSON, ws.cas.size(manifest))])
    assert retired and not findings
    assert retired.isdisjoint(closure), "the last snapshot reaches its ancestors' tables"
    config = chain.home.config.read_text()
    try:
        chain.home.config.write_text(config + "retention: {keep_generations: 1}\n")
        planned = json.loads(chain.home.must("gc", "--dry-run", "--json").out)
    finally:
        chain.home.config.write_text(config)
    assert retired <= {o["digest"] for o in planned["objects"]}
    chain.home.must("verify", last)  # what it names is all there


def _own_tables(ws: Workspace, snapshot_id: str) -> set[str]:
    """The ``RETIRED`` tables ``snapshot_id``'s own layer indexes name as outputs."""
    layers = load_manifest(ws.cas, resolve(ws.catalog, snapshot_id)).layers
    return {
        load_index(ws.cas, layers[layer], layer).output(name)["digest"]
        for layer, names in RETIRED.items()
        for name in names
    }


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
