"""``corpus-assets export croissant``: a demo snapshot, the real CLI, checked by mlcroissant."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus_assets.core.consumption.export_croissant import croissant_type, sha256_hex
from corpus_assets_tests.cli_process import output_field, run

# mlcroissant runs in its own process: importing it (absl logging) breaks pytest's capture of
# every later test in the same worker ("I/O operation on closed file").
READ = """
import json, sys
import mlcroissant as mlc
dataset = mlc.Dataset(jsonld=sys.argv[1])
issues = dataset.metadata.ctx.issues
print(json.dumps({
    "errors": sorted(issues.errors),
    "warnings": sorted(issues.warnings),
    "version": dataset.metadata.version,
    "members": [m["members/record_id"].decode() if isinstance(m["members/record_id"], bytes)
                else m["members/record_id"] for m in dataset.records("members")],
    "blocks": [int(s["packed_shards/blocks"]) for s in dataset.records("packed_shards")],
}))
"""


def _read_with_mlcroissant(path: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", READ, str(path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


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
    sid = output_field(demo.stdout, "snapshotId")
    manifest = json.loads(run(tmp_path, "show", sid).stdout)
    exported = _export(tmp_path, sid, tmp_path / "a")
    path = Path(exported["croissant"])
    assert path == tmp_path / "a" / "croissant.json"

    read = _read_with_mlcroissant(path)
    assert read["errors"] == []
    assert all(any(w in warning for w in ALLOWED_WARNINGS) for warning in read["warnings"]), read
    assert read["version"] == sid
    members = read["members"]
    assert len(members) == manifest["members"]["count"] == manifest["counts"]["members"]
    assert len(set(members)) == len(members)  # one per member
    assert sum(read["blocks"]) == manifest["counts"]["blocks"]

    document = json.loads(path.read_text())
    digests = {entry["basename"]: entry["digest"] for entry in exported["files"]}
    exported_members = pq.read_table(tmp_path / "a" / "members.parquet")  # the parts as one
    assert exported_members.num_rows == manifest["members"]["count"]
    assert sorted(exported_members.column("record_id").to_pylist()) == sorted(members)
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
