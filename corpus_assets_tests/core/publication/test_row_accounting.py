"""No row vanishes: a repeated record id is counted, never silently lost,
and a snapshot whose per-source counts do not add up fails its gate."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from corpus_assets.core.governance import states
from corpus_assets.core.publication import rules
from corpus_assets.core.publication.evidence import Evidence
from corpus_assets.core.publication.identity import snapshot_id
from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.publication.rules import RuleReport
from corpus_assets.core.publication.signing import sign_snapshot
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.publication.verify import resolve, stored_manifest
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.snapshot_manifest import Manifest
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_json, put_json, put_table
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.storage.digests import canonical_json

CLI = str(Path(sys.executable).parent / "corpus-assets")
WORDS = "river mountain window garden lantern harbor meadow orbit pebble quartz velvet ember"


def _text(n: int) -> str:
    """A distinct prose text per n (no two near each other)."""
    words = WORDS.split()
    return " ".join(f"{words[(n * 7 + k * 5) % len(words)]}{n}x{k}" for k in range(12)) + "."


def _rows(ids: list[str], start: int) -> str:
    return "".join(
        json.dumps({"id": i, "text": _text(start + n)}) + "\n" for n, i in enumerate(ids)
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """One CLI build of a source whose second object repeats two ids of the first: ``a7`` with
    a different, longer text (the conflict), ``a3`` with the same text (an exact repeat).
    Yields (directory, build stdout, snapshotId)."""
    root = tmp_path_factory.mktemp("rows")
    source = root / "src"
    source.mkdir()
    (source / "a.jsonl").write_text(_rows([f"a{n}" for n in range(10)], 0))
    longer = _text(7) + " " + _text(99)  # longer: today's total order keeps it, so nothing fails
    second = _rows([f"b{n}" for n in range(5)], 20)
    second += json.dumps({"id": "a7", "text": longer}) + "\n"
    second += json.dumps({"id": "a3", "text": _text(3)}) + "\n"
    (source / "b.jsonl").write_text(second)
    config = root / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: rows-test\nstorage: {{home: {root / 'home'}}}\n"
        "sources:\n  - {id: docs, kind: objects, path: src}\n"
    )
    done = _cli(root, "build", "--partition", "p1")
    assert done.returncode == 0, done.stderr
    sid = next(
        line.split()[1] for line in done.stdout.splitlines() if line.startswith("snapshotId")
    )
    yield root, done.stdout, sid


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    env.update(CORPUS_CONFIG=str(root / "corpus.yaml"), DAGSTER_HOME=str(root / "dagster"))
    return subprocess.run(
        [CLI, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def _open(root: Path) -> Workspace:
    return open_workspace(root / "corpus.yaml")


def test_a_repeated_id_with_other_text_is_quarantined_as_an_id_conflict(
    built: tuple[Path, str, str],
) -> None:
    """Both rows of a repeated id are accounted for: the second one in (source, object, line)
    order is quarantined as ``id.conflict`` when its text differs, an exact repeat is a counted
    duplicate id; the counts add up and the build says so."""
    root, stdout, sid = built
    shown = json.loads(_cli(root, "show", sid).stdout)
    counts = shown["counts"]
    assert counts["records"] == 17  # 10 + 7 canonical rows, every one kept by canonicalisation
    accounted = (
        counts["members"]
        + counts["duplicates_removed"]
        + counts.get("id_conflicts", 0)
        + counts.get("duplicate_ids", 0)
    )
    assert counts["records"] == accounted, counts
    assert (counts.get("id_conflicts"), counts.get("duplicate_ids")) == (1, 1), counts
    assert "1 record quarantined as id.conflict" in stdout, stdout
    with _open(root) as ws:
        dedup = json.loads(ws.cas.get_bytes(ws.catalog.layer_output("p1", "dedup_clusters")))
        parted = PartedTable.read(ws.cas, dedup["outputs"]["clusters"], "clusters")
        clusters = parted.table(VerifiedFiles(ws.cas), "clusters").to_pylist()
        a7 = {
            r["verdict"]: (r["line"], r["excluded"])
            for r in clusters
            if r["record_id"] == "docs/a7"
        }
        assert a7["keep"][0] == 8  # a.jsonl line 8: the first in (source, object, line) order stays
        line, reason = a7["excluded"]  # b.jsonl line 6, though its text is the longer one
        assert line == 6 and reason.startswith(
            "id.conflict: another text than the first at sha256:"
        )
        a3 = [r["excluded"] for r in clusters if r["record_id"] == "docs/a3" and r["excluded"]]
        assert len(a3) == 1 and a3[0].startswith("duplicate record_id (first at sha256:"), a3
        assert states.get(ws.catalog, sid).state == states.VALIDATED


def test_counts_that_do_not_add_up_fail_the_gate(built: tuple[Path, str, str]) -> None:
    """A members table with one row dropped, re-signed consistently (count and signature right):
    the accounting rule reads every layer's table and names the source whose rows vanished."""
    root, _stdout, sid = built
    with _open(root) as ws:
        manifest = stored_manifest(ws.cas, resolve(ws.catalog, sid))
        members = read_members(ws.cas, manifest["members"])
        forged = members.slice(1)
        ref = put_table(ws.cas, forged)
        manifest["members"] = {**manifest["members"], **ref, "count": forged.num_rows}
        manifest["counts"] = {**manifest["counts"], "members": forged.num_rows}
        manifest.pop("signature")
        manifest["snapshotId"] = forged_sid = snapshot_id(manifest)
        manifest["signature"] = sign_snapshot(ws.home, forged_sid)
        stored = ws.cas.put_bytes(canonical_json(manifest))
        states.register(ws.catalog, forged_sid, "p1", stored, "train")
        with Evidence.load(ws.cas, ws.catalog, Manifest.read(manifest)) as evidence:
            report = RuleReport()
            findings = rules.counts_add_up(evidence, report)
        assert report.accounting_mismatches == 2
        assert findings == [
            "source 'docs': 17 canonical records != 16 accounted for (14 members, 0 duplicates "
            "removed, 1 duplicate ids, 1 id conflicts, 0 tombstoned, 0 split-quarantined)",
            "source 'docs': dedup kept 15 records != 14 members + 0 split-quarantined",
        ], findings
        report = validate_snapshot(ws, forged_sid)
        assert any(
            f.startswith("source 'docs': 17 canonical records != 16") for f in report.findings
        )
        assert states.get(ws.catalog, forged_sid).state == states.REJECTED


def test_a_canonical_row_dropped_with_its_index_rewritten_is_named(
    built: tuple[Path, str, str],
) -> None:
    """A canonical records table with one row dropped, its chunk descriptor, the canonical index
    and the manifest's layer ref rewritten to point at it (the chunk's own account left as it
    was): the chunk's account and the source's identity both name it."""
    root, _stdout, sid = built
    with _open(root) as ws:
        manifest = stored_manifest(ws.cas, resolve(ws.catalog, sid))
        index = get_json(ws.cas, manifest["layers"]["canonical_records"], "canonical index")
        entry = index["outputs"]["chunks"][0]
        descriptor = get_json(ws.cas, entry["output"], "chunk")
        (piece,) = descriptor["pieces"]
        records = pq.read_table(ws.cas.path(piece["records"]["digest"]))
        piece["records"] = put_table(ws.cas, records.slice(1))
        entry["output"] = put_json(ws.cas, descriptor)
        manifest["layers"]["canonical_records"] = put_json(ws.cas, index)
        with Evidence.load(ws.cas, ws.catalog, Manifest.read(manifest)) as evidence:
            findings = rules.counts_add_up(evidence, RuleReport())
    chunk = entry["chunk"]
    assert findings == [
        "source 'docs': 16 canonical records != 17 accounted for (15 members, 0 duplicates "
        "removed, 1 duplicate ids, 1 id conflicts, 0 tombstoned, 0 split-quarantined)",
        f"chunk {chunk}: 10 rows in, account 10 kept + 0 excluded, tables hold 9 records + "
        "0 exclusions",
        "manifest counts.records is 17, the tables hold 16",
    ], findings
