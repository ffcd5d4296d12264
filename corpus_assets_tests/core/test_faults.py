"""Fault injection: each fault is caught with a named reason, never published."""

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import update

from corpus_assets.core.governance import states
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.identity import snapshot_id
from corpus_assets.core.publication.manifest import BuildConflict
from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.publication.signing import sign_snapshot
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.publication.verify import Report, verify
from corpus_assets.core.runtime import transform
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.transform import PACKAGE_ROOT, image_digest, transform_image
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import Ref, get_json, put_json, put_table
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.storage.catalog import LayerConflict, snapshots
from corpus_assets.core.storage.digests import canonical_json


def test_duplicate_record_ids_are_excluded_by_name_at_build(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps({"id": "x", "text": "one text"}) + "\n")
    (folder / "b.jsonl").write_text(json.dumps({"id": "x", "text": "another text"}) + "\n")
    config = tmp_path / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: faults\nstorage: {{home: {tmp_path / 'home'}}}\n"
        "sources:\n  - {id: dup, kind: objects, path: src}\n"
    )
    with open_workspace(config) as ws:
        results = build_all(ws, "p1")
        dedup = results["dedup_clusters"].counts
        assert (dedup["duplicate_ids"], dedup["id_conflicts"]) == (0, 1)  # another text
        assert results["manifest"].counts["members"] == 1
        clusters = json.loads(ws.cas.get_bytes(ws.catalog.layer_output("p1", "dedup_clusters")))
        parted = PartedTable.read(ws.cas, clusters["outputs"]["clusters"], "clusters")
        table = parted.table(VerifiedFiles(ws.cas), "clusters")
        reasons = [e for e in table.column("excluded").to_pylist() if e]
        assert len(reasons) == 1
        assert reasons[0].startswith("id.conflict: another text than the first at sha256:")
        assert validate_snapshot(ws, results["manifest"].digests["snapshotId"]).ok


def test_same_record_id_in_two_splits_is_refused(workspace: Workspace) -> None:
    """A forged (re-signed) manifest whose members table holds one id in two splits."""
    build_all(workspace, "p1")
    manifest = json.loads(workspace.cas.get_bytes(workspace.catalog.layer_output("p1", "manifest")))
    members = read_members(workspace.cas, manifest["members"])
    row = members.slice(0, 1).to_pylist()[0]
    twin = {**row, "split": "test" if row["split"] != "test" else "train"}
    forged = pa.concat_tables([members, pa.Table.from_pylist([twin], schema=members.schema)])
    ref = put_table(workspace.cas, forged)
    manifest["members"] = {
        **manifest["members"],
        **ref,
        "uri": workspace.cas.uri(ref["digest"]),
        "count": forged.num_rows,
    }
    manifest.pop("signature")
    manifest["snapshotId"] = sid = snapshot_id(manifest)
    manifest["signature"] = sign_snapshot(workspace.home, sid)
    stored = workspace.cas.put_bytes(canonical_json(manifest))
    states.register(workspace.catalog, sid, "p1", stored, "demo")
    report = validate_snapshot(workspace, sid)
    splits = ", ".join(sorted({row["split"], twin["split"]}))
    assert report.findings[0] == (
        f"record_id {row['record_id']!r} appears 2 times in members in splits {splits}"
    ), report.findings


def _resigned_report(workspace: Workspace, manifest: dict, members: Ref) -> Report:
    """``manifest`` naming ``members`` instead, re-signed, registered and checked."""
    manifest["members"] = {
        **manifest["members"],
        **members,
        "uri": workspace.cas.uri(members["digest"]),
    }
    manifest.pop("signature")
    manifest["snapshotId"] = sid = snapshot_id(manifest)
    manifest["signature"] = sign_snapshot(workspace.home, sid)
    states.register(
        workspace.catalog, sid, "p1", workspace.cas.put_bytes(canonical_json(manifest)), "demo"
    )
    return validate_snapshot(workspace, sid)


def test_a_member_without_its_canonical_row_is_named(workspace: Workspace) -> None:
    """A member whose (record id, object, line) is no canonical row has no lineage: named by
    its record id, counted in the metric."""
    build_all(workspace, "p1")
    manifest = json.loads(workspace.cas.get_bytes(workspace.catalog.layer_output("p1", "manifest")))
    members = read_members(workspace.cas, manifest["members"])
    line = members.column("line").to_pylist()
    moved = members.set_column(
        members.schema.get_field_index("line"), "line", pa.array([line[0] + 10**6, *line[1:]])
    )
    report = _resigned_report(workspace, manifest, put_table(workspace.cas, moved))
    rid = members.column("record_id")[0].as_py()
    assert f"member {rid!r} has no lineage to a pinned object row" in report.findings
    assert report.gate.orphan_ids == 1


def test_truncated_members_table_is_named(workspace: Workspace) -> None:
    """A truncated part of the members table, and a truncated parts document, are named."""
    results = build_all(workspace, "p1")
    sid = results["manifest"].digests["snapshotId"]
    members = results["manifest"].digests["members"]
    part = get_json(workspace.cas, members)["parts"][0]["digest"]
    for digest, where in ((part, "manifest.members.parts[0]"), (members, "manifest.members")):
        path = workspace.cas.path(digest)
        stored = path.read_bytes()
        path.write_bytes(stored[:-100])
        report = verify(workspace.cas, workspace.catalog, sid)
        assert any(
            f.startswith(f"CAS object at {where} {digest}") and f"{digest} is corrupt" in f
            for f in report.findings
        ), report.findings
        path.write_bytes(stored)


def test_manifest_edited_after_signing_is_named(workspace: Workspace) -> None:
    sid = build_all(workspace, "p1")["manifest"].digests["snapshotId"]
    manifest_digest = workspace.catalog.layer_output("p1", "manifest")
    manifest = json.loads(workspace.cas.get_bytes(manifest_digest))
    manifest["purpose"] = "something-else"  # edited, re-stored, catalog repointed
    edited = workspace.cas.put_bytes(json.dumps(manifest).encode())
    with workspace.catalog.begin() as conn:
        conn.execute(update(snapshots).values(manifest_digest=edited))
    report = verify(workspace.cas, workspace.catalog, sid)
    assert any("payload hashes to" in f for f in report.findings), report.findings

    # an editor who also recomputes the snapshotId still cannot make the signature cover it
    manifest["snapshotId"] = forged = snapshot_id(manifest)
    again = workspace.cas.put_bytes(json.dumps(manifest).encode())
    with workspace.catalog.begin() as conn:
        conn.execute(update(snapshots).values(manifest_digest=again, snapshot_id=forged))
    report = verify(workspace.cas, workspace.catalog, forged)
    assert any(f.startswith("manifest signature: subject mismatch") for f in report.findings), (
        report.findings
    )


def test_same_tag_with_another_digest_is_named(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = build_all(workspace, "p1")["manifest"].digests["snapshotId"]
    other = tmp_path / "other" / "corpus_assets"
    shutil.copytree(PACKAGE_ROOT, other, ignore=shutil.ignore_patterns("__pycache__"))
    with open(other / "core" / "dedup" / "layer.py", "a") as handle:
        handle.write("\n# a one-line change, same version tag\n")
    tag = transform_image().partition("@")[0]
    retagged = f"{tag}@{image_digest(other)}"
    assert retagged != transform_image()
    monkeypatch.setattr(transform, "transform_image", lambda: retagged)  # this code, edited
    report = validate_snapshot(workspace, sid)
    assert any("(same tag, another digest)" in f for f in report.findings), report.findings


def test_same_build_giving_other_content_stops_with_a_diagnosis(workspace: Workspace) -> None:
    first = build_all(workspace, "p1")["manifest"]
    manifest = json.loads(workspace.cas.get_bytes(first.digest))
    manifest["counts"] = {**manifest["counts"], "tokens": 1}  # "the earlier run" differed
    manifest["snapshotId"] = earlier = snapshot_id(manifest)
    stored = workspace.cas.put_bytes(canonical_json(manifest))
    states.register(workspace.catalog, earlier, "p0", stored, "demo", build_id=manifest["buildId"])
    with pytest.raises(BuildConflict, match=r"different content in counts; nothing was"):
        build_all(workspace, "p1")


def test_a_layer_pointer_is_never_overwritten_by_the_same_spec(workspace: Workspace) -> None:
    build_all(workspace, "p1")
    spec = "sha256:" + "5" * 64
    workspace.catalog.set_layer_output("p9", "splits", "sha256:" + "1" * 64, spec)
    with pytest.raises(LayerConflict, match="nondeterministic output, not overwritten"):
        workspace.catalog.set_layer_output("p9", "splits", "sha256:" + "2" * 64, spec)
    assert workspace.catalog.layer_output("p9", "splits") == "sha256:" + "1" * 64
    workspace.catalog.set_layer_output("p9", "splits", "sha256:" + "2" * 64, spec + "~partial")
    assert workspace.catalog.layer_output("p9", "splits") == "sha256:" + "2" * 64


def test_a_member_without_its_canonical_row_in_a_part_is_named_after_its_parts_passed(
    workspace: Workspace,
) -> None:
    """The members as parts, every part's lineage recorded as holding by a passing check: a
    re-signed manifest naming a part whose first row moved to a line no canonical row has is
    named as the whole check names it (the forged part is another digest, so it is read)."""
    digest = build_all(workspace, "p1")["manifest"].digest
    assert validate_snapshot(workspace, digest).ok
    manifest = json.loads(workspace.cas.get_bytes(digest))
    parts = get_json(workspace.cas, manifest["members"], "members parts")
    first = next(n for n, part in enumerate(parts["parts"]) if part["count"])
    table = pq.read_table(workspace.cas.path(parts["parts"][first]["digest"]))
    line = table.column("line").to_pylist()
    moved = table.set_column(
        table.schema.get_field_index("line"), "line", pa.array([line[0] + 10**6, *line[1:]])
    )
    parts["parts"][first] |= put_table(workspace.cas, moved)
    report = _resigned_report(workspace, manifest, put_json(workspace.cas, parts))
    rid = table.column("record_id")[0].as_py()
    assert f"member {rid!r} has no lineage to a pinned object row" in report.findings
    assert report.gate.orphan_ids == 1
    assert report.parts_checked == {"lineage_complete": 1}
