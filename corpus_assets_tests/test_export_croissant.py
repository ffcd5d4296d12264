"""``corpus-assets export croissant``: a demo snapshot, the real CLI, checked by mlcroissant."""

import hashlib
import json
from pathlib import Path

import mlcroissant as mlc
import pyarrow as pa
import pytest

from corpus_assets.core.release.export_croissant import croissant_type, sha256_hex
from corpus_assets_tests.test_cli import _field, run

# version = snapshotId is not semver, and a snapshot has no publication date: both stay warnings.
ALLOWED_WARNINGS = ("Version doesn't follow MAJOR.MINOR.PATCH", "datePublished")


def _export(home: Path, sid: str, out: Path) -> dict:
    args = (
        "export",
        "croissant",
        sid,
        "--run-id",
        f"cro-{out.name}",
        "--purpose",
        "demo-pretraining",
    )
    exported = run(home, *args, "--out", str(out))
    assert exported.returncode == 0, exported.stderr
    return json.loads(exported.stdout)


def test_croissant_export_validates_and_reads_the_members(tmp_path: Path) -> None:
    demo = run(tmp_path, "demo")
    assert demo.returncode == 0, demo.stderr
    sid = _field(demo.stdout, "snapshotId")
    manifest = json.loads(run(tmp_path, "show", sid).stdout)
    exported = _export(tmp_path, sid, tmp_path / "a")
    path = Path(exported["croissant"])
    assert path == tmp_path / "a" / "croissant.json"

    dataset = mlc.Dataset(jsonld=path)
    issues = dataset.metadata.ctx.issues
    assert not issues.errors
    assert all(any(w in warning for w in ALLOWED_WARNINGS) for warning in issues.warnings), (
        issues.report()
    )
    assert dataset.metadata.version == sid
    members = list(dataset.records("members"))
    assert len(members) == manifest["members"]["count"] == manifest["counts"]["members"]
    assert len({m["members/record_id"] for m in members}) == len(members)  # one per member
    shards = list(dataset.records("packed_shards"))
    assert sum(s["packed_shards/blocks"] for s in shards) == manifest["counts"]["blocks"]

    document = json.loads(path.read_text())
    digests = {entry["basename"]: entry["digest"] for entry in exported["files"]}
    assert digests["members.parquet"] == manifest["members"]["digest"]
    for entry in document["distribution"]:  # sha256 is the CAS digest, and the file's bytes
        data = (path.parent / entry["contentUrl"]).read_bytes()
        assert "sha256:" + entry["sha256"] == digests[entry["name"]]
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert _export(tmp_path, sid, tmp_path / "b")["export"] == exported["export"]
    assert (tmp_path / "b" / "croissant.json").read_bytes() == path.read_bytes()


def test_croissant_refuses_what_it_cannot_describe() -> None:
    """An arrow type with no Croissant dataType, or a digest that is not sha256, is named."""
    with pytest.raises(ValueError, match="no Croissant dataType for arrow type list<item: int64>"):
        croissant_type(pa.list_(pa.int64()))
    with pytest.raises(ValueError, match="'blake3:00' is not a sha256:<hex> digest"):
        sha256_hex("blake3:00")
    assert croissant_type(pa.int32()) == "sc:Integer" and croissant_type(pa.string()) == "sc:Text"
