"""Chunk caches and layer indexes are keyed on the code a stage runs, not on hand-bumped names.

An edit to ``records/pii.py`` must re-run canonical chunks (and change every layer whose code
imports it) while pinned objects - ingest never imports pii - are reused.
"""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from corpus_assets.assets.layer_assets import CODE_VERSIONS, canonical_records, raw_snapshot
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.records import canonical_records as records_layer
from corpus_assets.core.runtime.code_identity import CodeIdentityError, code_identity, stage_code
from corpus_assets.core.runtime.layer_index import read_layer_index
from corpus_assets.core.runtime.transform import PACKAGE_ROOT
from corpus_assets.core.runtime.workspace import open_workspace

CORE = "corpus_assets.core"
CHANGED_BY_PII = [  # every stage whose code imports records/pii.py
    f"{CORE}.records.canonical_records",
    f"{CORE}.publication.manifest",
]
UNCHANGED_BY_PII = [  # ingest never imports records; the rest read canonical records through
    # records.index, which holds the record contract but no row stage
    f"{CORE}.dedup.signature_cache",
    f"{CORE}.dedup.dedup_clusters",
    f"{CORE}.training_view.packing.build",
    f"{CORE}.ingest.pinning",
    f"{CORE}.ingest.freeze",
    f"{CORE}.dedup.minhash",
    f"{CORE}.training_view.splits.build",
    f"{CORE}.training_view.mixing.build",
]

PII_LINE = '_KIND = {"[EMAIL]": "email", '
PII_EDIT = '_KIND = {"[EMAIL]": "email_address", '

BUILD = textwrap.dedent(
    """
    import json, sys
    import corpus_assets
    from corpus_assets.core.pipeline import build_all
    from corpus_assets.core.runtime.workspace import open_workspace
    assert corpus_assets.__file__.startswith(sys.argv[2]), corpus_assets.__file__
    with open_workspace() as ws:
        results = build_all(ws, sys.argv[1])
    print(json.dumps({
        layer: {"digest": r.digest, "counts": r.counts, "run_stats": r.run_stats}
        for layer, r in results.items()
    }))
    """
)


def _copy_tree(root: Path, *, edit_pii: bool) -> Path:
    """The package (and uv.lock) under ``root``; with ``edit_pii`` one line of pii.py changed."""
    shutil.copytree(
        PACKAGE_ROOT, root / "corpus_assets", ignore=shutil.ignore_patterns("__pycache__")
    )
    lock = PACKAGE_ROOT.parent / "uv.lock"
    if lock.is_file():
        shutil.copy2(lock, root / "uv.lock")
    if edit_pii:
        pii = root / "corpus_assets" / "core" / "records" / "pii.py"
        source = pii.read_text()
        assert source.count(PII_LINE) == 1
        pii.write_text(source.replace(PII_LINE, PII_EDIT))
    return root / "corpus_assets"


def _build_with(tree: Path, partition_key: str) -> dict:
    """build_all of one partition in a subprocess running the package at ``tree``."""
    root = tree.parent
    done = subprocess.run(
        [sys.executable, "-c", BUILD, partition_key, str(tree)],
        cwd=root,
        env={**_environ(), "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _pin_tasks(home: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(home / "catalog.sqlite") as db:
        return db.execute(
            "SELECT chunk_key, code_version FROM chunk_tasks WHERE layer = 'raw_snapshot' "
            "ORDER BY chunk_key, code_version"
        ).fetchall()


def test_editing_pii_reruns_canonical_chunks_and_reuses_pinned_objects(
    demo_home: Path, tmp_path: Path
) -> None:
    with open_workspace() as ws:
        first = build_all(ws, "p1")
    chunks = first["canonical_records"].counts["chunks"]
    pinned = _pin_tasks(demo_home)
    assert chunks > 0 and pinned

    same = _build_with(_copy_tree(tmp_path / "same", edit_pii=False), "p2")
    # the same code in another path is the same transform image: every layer is the memo's
    assert same["canonical_records"]["run_stats"] == {"layer_reused": 1}
    for layer in ("raw_snapshot", "canonical_records", "dedup_clusters", "packed_blocks"):
        assert same[layer]["digest"] == first[layer].digest, layer  # another path, same code

    edited = _build_with(_copy_tree(tmp_path / "edited", edit_pii=True), "p3")
    canonical = edited["canonical_records"]
    assert canonical["run_stats"] == {"chunks_reused": 0, "chunks_built": chunks}, canonical
    assert "pii.email_address" in canonical["counts"], canonical["counts"]  # the new code ran
    assert _pin_tasks(demo_home) == pinned  # every object pinned by the first build is reused
    assert edited["raw_snapshot"]["digest"] == first["raw_snapshot"].digest
    for layer in ("canonical_records", "dedup_clusters", "packed_blocks"):
        assert edited[layer]["digest"] != first[layer].digest, layer


def test_identical_trees_have_identical_identities_wherever_they_live(tmp_path: Path) -> None:
    here = _copy_tree(tmp_path / "a" / "deeper", edit_pii=False)
    there = _copy_tree(tmp_path / "b", edit_pii=False)
    for module in CHANGED_BY_PII + UNCHANGED_BY_PII:
        identity = code_identity(module, here)
        assert identity.startswith("sha256:") and len(identity) == 71
        assert code_identity(module, there) == identity, module
    records = f"{CORE}.records.canonical_records"
    assert code_identity(records, here) != code_identity(f"{CORE}.ingest.pinning")
    name = stage_code("canonical_records.v2", records, there)
    assert name == f"canonical_records.v2@{code_identity(records, here)}"
    assert records_layer.CODE.startswith("canonical_records.v2@sha256:")  # this tree, at import


def test_editing_pii_changes_exactly_the_stages_importing_it(tmp_path: Path) -> None:
    before = _copy_tree(tmp_path / "before", edit_pii=False)
    after = _copy_tree(tmp_path / "after", edit_pii=True)
    for module in CHANGED_BY_PII:
        assert code_identity(module, before) != code_identity(module, after), module
    for module in UNCHANGED_BY_PII:
        assert code_identity(module, before) == code_identity(module, after), module


def _toy(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "toy"


TOY = {
    "toy/__init__.py": "",
    "toy/stage/__init__.py": "",
    "toy/stage/run.py": "from . import rows\nfrom .helpers import clean\n",
    "toy/stage/rows.py": "def f():\n    import toy.late\n",  # an import inside a function
    "toy/stage/helpers.py": "from toy.util import *\nclean = 1\n",
    "toy/util.py": "X = 1\n",
    "toy/late.py": "Y = 1\n",
    "toy/unused.py": "Z = 1\n",
}


@pytest.mark.parametrize(
    ("edited", "changes"),
    [
        ("toy/late.py", True),
        ("toy/util.py", True),
        ("toy/stage/__init__.py", True),
        ("toy/unused.py", False),
        ("uv.lock", True),
    ],
)
def test_the_closure_follows_relative_star_and_late_imports(
    tmp_path: Path, edited: str, changes: bool
) -> None:
    files = {**TOY, "uv.lock": "lock v1\n"}
    before = _toy(tmp_path / "before", files)
    after = _toy(tmp_path / "after", {**files, edited: files[edited] + "# edited\n"})
    same = code_identity("toy.stage.run", before) == code_identity("toy.stage.run", after)
    assert same is not changes


def test_a_module_file_comes_before_a_package_of_the_same_name(tmp_path: Path) -> None:
    """``toy/late.py`` and ``toy/late/__init__.py`` both there: the closure holds the file."""
    files = {**TOY, "toy/late/__init__.py": "W = 1\n"}
    before = code_identity("toy.stage.run", _toy(tmp_path / "before", files))
    package_edited = {**files, "toy/late/__init__.py": "W = 2\n"}
    assert code_identity("toy.stage.run", _toy(tmp_path / "package", package_edited)) == before
    file_edited = {**files, "toy/late.py": "Y = 2\n"}
    assert code_identity("toy.stage.run", _toy(tmp_path / "file", file_edited)) != before


def test_a_module_outside_the_package_or_missing_is_named(tmp_path: Path) -> None:
    toy = _toy(tmp_path, {**TOY, "toy/stage/rows.py": "import toy.gone\n"})
    with pytest.raises(CodeIdentityError, match=r"'toy\.gone' has no source"):
        code_identity("toy.stage.run", toy)
    with pytest.raises(CodeIdentityError, match="not a module of the 'toy' package"):
        code_identity("other.module", toy)


def test_dagster_code_version_is_the_layer_code_its_index_names(demo_home: Path) -> None:
    assert canonical_records.code_versions_by_key == {canonical_records.key: records_layer.CODE}
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("snapshots", ["p1"])
    result = dg.materialize(
        [raw_snapshot, canonical_records],
        partition_key="p1",
        instance=instance,
        resources={"corpus": CorpusResource()},
    )
    tags = {
        e.asset_key.path[-1]: e.materialization.tags or {}
        for e in result.get_asset_materialization_events()
    }
    with open_workspace() as ws:
        for layer in ("raw_snapshot", "canonical_records"):
            _, index = read_layer_index(ws, "p1", layer)
            assert index.code == CODE_VERSIONS[layer] == tags[layer]["dagster/code_version"]


def _counting_parses(monkeypatch: pytest.MonkeyPatch, cache: Path | str) -> list[str]:
    """A fresh process's view: the parse cache at ``cache``, each parsed module recorded."""
    from corpus_assets.core.runtime import code_identity as identity

    monkeypatch.setenv("CORPUS_CODE_CACHE", str(cache))
    identity._parse_cache.cache_clear()
    monkeypatch.setattr(identity, "_PARSED", {})
    parsed: list[str] = []
    parse = identity._parse_imports

    def counting(*args: object) -> object:
        parsed.append(str(args[0]))
        return parse(*args)

    monkeypatch.setattr(identity, "_parse_imports", counting)
    return parsed


def test_a_process_parses_no_file_an_earlier_process_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every CLI command computes stage identities at import (~0.3-0.9 CPU-s of parsing): the
    on-disk cache keyed by file digest spares every process after the first."""
    toy, cache = _toy(tmp_path / "tree", TOY), tmp_path / "cache" / "parses.json"
    first = _counting_parses(monkeypatch, cache)
    identity = code_identity("toy.stage.run", toy)
    assert len(first) == 7 and cache.is_file()  # every file of the closure, once
    code_identity.cache_clear()
    again = _counting_parses(monkeypatch, cache)
    assert code_identity("toy.stage.run", toy) == identity
    assert again == []
    edited = _toy(tmp_path / "edited", {**TOY, "toy/util.py": "X = 2\n"})
    assert code_identity("toy.stage.run", edited) != identity
    assert again == ["toy.util"]  # the one file whose bytes no process had parsed


def test_the_cache_keeps_statements_and_the_tree_decides_what_is_a_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``from toy import b`` imports the module ``toy/b.py`` only where that file exists: a
    cached parse of the same bytes must not carry one tree's answer into another tree."""
    files = {**TOY, "toy/stage/rows.py": "from toy import late\n", "toy/__init__.py": "late = 1"}
    without = {k: v for k, v in files.items() if k != "toy/late.py"}
    _counting_parses(monkeypatch, tmp_path / "parses.json")
    plain = code_identity("toy.stage.run", _toy(tmp_path / "a", without))
    with_module = code_identity("toy.stage.run", _toy(tmp_path / "b", files))
    assert plain != with_module  # toy/late.py is in the second closure only
    edit = _toy(tmp_path / "c", {**files, "toy/late.py": "Y = 2\n"})
    assert code_identity("toy.stage.run", edit) != with_module


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"schema": "other"}', b"[1, 2]"])
def test_an_unreadable_cache_is_a_cold_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes
) -> None:
    cache = tmp_path / "parses.json"
    cache.write_bytes(content)
    toy = _toy(tmp_path / "tree", TOY)
    parsed = _counting_parses(monkeypatch, cache)
    identity = code_identity("toy.stage.run", toy)
    assert len(parsed) == 7
    assert json.loads(cache.read_bytes())["schema"] == "corpus.import-parses.v1"
    code_identity.cache_clear()
    _counting_parses(monkeypatch, "off")
    assert code_identity("toy.stage.run", _toy(tmp_path / "other", TOY)) == identity


def test_the_cache_stays_bounded_keeping_what_the_process_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every edit adds entries; past the limit only the entries this process read survive."""
    from corpus_assets.core.runtime.code_identity import ParseCache

    cache = tmp_path / "parses.json"
    old = {f"toy.gone{n}|0|{n:064x}": [[], []] for n in range(10)}
    cache.write_text(json.dumps({"schema": ParseCache.SCHEMA, "entries": old}))
    monkeypatch.setattr(ParseCache, "LIMIT", 12)
    _counting_parses(monkeypatch, cache)
    code_identity("toy.stage.run", _toy(tmp_path / "tree", TOY))
    kept = json.loads(cache.read_text())["entries"]
    assert len(kept) == 7 and not set(kept) & set(old)
