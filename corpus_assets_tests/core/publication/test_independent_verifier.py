"""A verifier that shares no code with the builder recomputes the snapshotId from the file alone.

The snapshotId is the digest of the canonical payload without ``snapshotId`` and the
signature, and a verifier must re-derive it with the same exclusion rule. It is handed the
stored manifest bytes of a demo build (the session's shared one) and the builder's claims as
files; the verifier below uses only json, hashlib, base64 and rfc8785, and a subprocess runs
its source with nothing else imported to prove it needs no ``corpus_assets``.
"""

import base64
import hashlib
import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets_tests.conftest import BuiltDemo

# Every test reads the shared demo build (read only) on SQLite.
pytestmark = pytest.mark.parametrize("built_demo", ["sqlite"], indirect=True)


# --- the standalone verifier: json, hashlib, base64, rfc8785 only ------------------------------
def independent_check(manifest_bytes: bytes) -> dict[str, Any]:
    """Re-derive everything a consumer can check from the manifest bytes without our code."""
    manifest = json.loads(manifest_bytes)
    payload = {k: v for k, v in manifest.items() if k not in ("snapshotId", "signature")}
    recomputed = "sha256:" + hashlib.sha256(rfc8785.dumps(payload)).hexdigest()
    envelope = manifest.get("signature") or {}
    subjects, predicate = [], None
    if envelope.get("payloadType") == "application/vnd.in-toto+json":
        statement = json.loads(base64.b64decode(envelope["payload"], validate=True))
        if statement.get("_type") == "https://in-toto.io/Statement/v1":
            subjects = [
                "sha256:" + s["digest"]["sha256"]
                for s in statement.get("subject", [])
                if s.get("name") == "training.dataset.snapshot"
            ]
            predicate = statement.get("predicate", {}).get("snapshotId")
    findings = []
    if manifest.get("snapshotId") != recomputed:
        findings.append(
            f"snapshotId {manifest.get('snapshotId')} but payload hashes to {recomputed}"
        )
    if subjects != [recomputed] or predicate != recomputed:
        findings.append(f"signed subject {subjects} / predicate {predicate} is not {recomputed}")
    return {
        "recomputed": recomputed,
        "claimed": manifest.get("snapshotId"),
        "subjects": subjects,
        "canonical": rfc8785.dumps(manifest) == manifest_bytes,
        "document_digest": "sha256:" + hashlib.sha256(manifest_bytes).hexdigest(),
        "findings": findings,
    }


# ------------------------------------------------------------------------------------------------


@pytest.fixture
def built(built_workspace: Workspace, built_demo: BuiltDemo, tmp_path: Path) -> Path:
    """A folder holding the demo snapshot's stored manifest bytes and what its builder claims
    (manifest digest, snapshotId): all the verifier is given."""
    digest = built_workspace.catalog.layer_output(built_demo.partition, "manifest")
    assert digest is not None
    folder = tmp_path / "built"
    folder.mkdir()
    (folder / "manifest.json").write_bytes(built_workspace.cas.get_bytes(digest))
    claims = {"manifest_digest": digest, "snapshotId": built_demo.snapshot_id}
    (folder / "build.json").write_text(json.dumps(claims))
    return folder


def test_standalone_recomputation_matches_the_builder(built: Path) -> None:
    data = (built / "manifest.json").read_bytes()
    builder = json.loads((built / "build.json").read_text())
    result = independent_check(data)
    assert result["findings"] == []
    assert result["recomputed"] == result["claimed"] == builder["snapshotId"]
    assert result["subjects"] == [builder["snapshotId"]]
    # the stored manifest is itself RFC 8785 bytes, and its digest is the one the catalog names
    assert result["canonical"]
    assert result["document_digest"] == builder["manifest_digest"]


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.update(purpose="other-purpose"),
        lambda m: m["counts"].update(tokens=m["counts"]["tokens"] + 1),
        lambda m: m["members"].update(count=m["members"]["count"] - 1),
        lambda m: m.update(tombstoneWatermark="1"),
        lambda m: m["sources"].reverse(),
    ],
    ids=["purpose", "tokens", "members-count", "tombstone-watermark", "source-order"],
)
def test_editing_a_field_after_signing_makes_the_recomputation_disagree(
    built: Path, tmp_path: Path, edit
) -> None:
    manifest = json.loads((built / "manifest.json").read_bytes())
    original = manifest["snapshotId"]
    edit(manifest)
    edited = tmp_path / "manifest.json"
    edited.write_bytes(rfc8785.dumps(manifest))
    result = independent_check(edited.read_bytes())
    assert result["claimed"] == original != result["recomputed"]
    assert result["subjects"] == [original]
    assert len(result["findings"]) == 2, result["findings"]


def test_relabelling_the_snapshot_id_still_disagrees_with_the_signed_subject(built: Path) -> None:
    manifest = json.loads((built / "manifest.json").read_bytes())
    signed = manifest["snapshotId"]
    manifest["purpose"] = "other-purpose"
    manifest["snapshotId"] = independent_check(rfc8785.dumps(manifest))["recomputed"]
    result = independent_check(rfc8785.dumps(manifest))
    assert result["claimed"] == result["recomputed"] != signed
    assert result["subjects"] == [signed]
    assert [f.split(" ")[0] for f in result["findings"]] == ["signed"]


def test_the_verifier_runs_with_nothing_of_corpus_assets_imported(built: Path) -> None:
    source = textwrap.dedent(inspect.getsource(independent_check))
    program = "\n".join(
        [
            "import base64, hashlib, json, sys",
            "from typing import Any",
            "import rfc8785",
            source,
            "result = independent_check(open(sys.argv[1], 'rb').read())",
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'corpus_assets')",
            "print(json.dumps({'findings': result['findings'], 'id': result['recomputed'],",
            "                  'loaded': loaded}))",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", program, str(built / "manifest.json")],
        cwd=built,
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(done.stdout)
    assert out["loaded"] == []
    assert out["findings"] == []
    assert out["id"] == json.loads((built / "build.json").read_text())["snapshotId"]
