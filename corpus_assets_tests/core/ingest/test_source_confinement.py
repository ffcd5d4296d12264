"""A source listing never leaves its folder nor reads the data home,
and an object deleted between the freeze's listing and its copy is never silently dropped.

The attacks go through the real CLI (``corpus-assets build`` processes, a real failpoint pause);
the listing's finer rules (links inside the folder, loops, a linked root, a home inside the
folder, the discovery fingerprint, changelog segments) are checked on the one listing function.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from corpus_assets.core.ingest.changelog import ChangelogError, list_segments
from corpus_assets.core.ingest.freeze_spec import FreezeSpec
from corpus_assets.core.ingest.sources import SourceError, fingerprint, list_objects
from corpus_assets.core.publication.signing import key_paths
from corpus_assets.core.runtime.config import ObjectsSource, load_config
from corpus_assets.core.runtime.workspace import open_workspace

CLI = str(Path(sys.executable).parent / "corpus-assets")
WAIT = 120.0


def _rows(prefix: str, count: int) -> str:
    return "".join(
        json.dumps({"id": f"{prefix}-{i}", "text": f"{prefix} record number {i} " * 4}) + "\n"
        for i in range(count)
    )


def _setup(tmp_path: Path, files: dict[str, int]) -> tuple[Path, Path, Path]:
    """(config, source folder, data home) with one ``docs`` objects source of ``files``."""
    source, home = tmp_path / "src", tmp_path / "home"
    source.mkdir()
    for name, count in files.items():
        (source / name).write_text(_rows(name.split(".")[0], count))
    config = tmp_path / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: confinement-test\nstorage: {{home: {home}}}\n"
        f"sources:\n  - {{id: docs, kind: objects, path: {source}}}\n"
    )
    return config, source, home


def _env(tmp_path: Path, config: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    env.update(CORPUS_CONFIG=str(config), DAGSTER_HOME=str(tmp_path / "dagster"))
    return {**env, **(extra or {})}


def _build(tmp_path: Path, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, "build", "--partition", "p1"],
        env=_env(tmp_path, config),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _stored_anywhere(home: Path, needle: bytes) -> list[Path]:
    """Files under the home's CAS (and its downloads) holding ``needle``."""
    return [
        path
        for folder in (home / "cas", home / "downloads")
        if folder.is_dir()
        for path in folder.rglob("*")
        if path.is_file() and needle in path.read_bytes()
    ]


def test_a_link_to_the_private_signing_key_is_refused_and_never_stored(tmp_path: Path) -> None:
    """The attack: ``zz-key.jsonl`` links to the home's private key. The build refuses it in one
    line naming the link and its target; the key's bytes are nowhere in the CAS."""
    config, source, home = _setup(tmp_path, {"a.jsonl": 20})
    private, _public = key_paths(home)
    private.parent.mkdir(parents=True)
    pem = Ed25519PrivateKey.generate().private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )
    private.write_bytes(pem)  # a real key, as the first build would have made it
    (source / "zz-key.jsonl").symlink_to(private)
    ran = _build(tmp_path, config)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    lines = [line for line in ran.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("corpus-assets: error:"), ran.stderr
    assert "zz-key.jsonl" in lines[0] and str(private) in lines[0], lines[0]
    assert _stored_anywhere(home, pem.splitlines()[1]) == []


def test_a_link_out_of_the_folder_is_refused_and_a_link_inside_is_followed(
    tmp_path: Path,
) -> None:
    """``rsync --safe-links``: a file link whose target resolves outside the folder is refused
    (the discovery fingerprint too: one listing); one inside it is listed under its own name.
    A link to a folder is never descended, so a loop cannot hang the listing."""
    config, source, _home = _setup(tmp_path, {"a.jsonl": 2, "b.jsonl": 2})
    (source / "sub").mkdir()
    (source / "sub" / "c.jsonl").write_text(_rows("c", 2))
    (source / "alias.jsonl").symlink_to(source / "sub" / "c.jsonl")
    (source / "loop").symlink_to(source)  # a folder link back to the root
    (source / "sub" / "up").symlink_to("..")
    (source / "dangling.jsonl").symlink_to(source / "nowhere.jsonl")
    loaded = load_config(config)
    (docs,) = loaded.config.sources
    assert isinstance(docs, ObjectsSource)
    names = [o.name for o in list_objects(loaded, docs)]
    assert names == ["a.jsonl", "alias.jsonl", "b.jsonl", "sub/c.jsonl"]
    fingerprint(loaded)  # lists without error
    outside = tmp_path / "elsewhere.jsonl"
    outside.write_text(_rows("x", 1))
    (source / "sub" / "escape.jsonl").symlink_to("../../elsewhere.jsonl")
    for listing in (lambda: list_objects(loaded, docs), lambda: fingerprint(loaded)):
        with pytest.raises(SourceError) as refused:
            listing()
        message = str(refused.value)
        assert "\n" not in message
        assert "sub/escape.jsonl" in message and str(outside) in message, message


def test_the_data_home_is_never_listed_even_inside_the_source_folder(tmp_path: Path) -> None:
    """A folder holding the data home (a source at ``.``): nothing under the home is listed, and a
    link into the home is refused; a source folder that is itself a link resolves once."""
    config, source, _home = _setup(tmp_path, {"a.jsonl": 2})
    home = source / "store"
    (home / "exports").mkdir(parents=True)
    (home / "exports" / "train.jsonl").write_text(_rows("exported", 2))
    linked = tmp_path / "linked-src"
    linked.symlink_to(source)
    config.write_text(
        f"version: 1\npurpose: confinement-test\nstorage: {{home: {home}}}\n"
        f"sources:\n  - {{id: docs, kind: objects, path: {linked}}}\n"
    )
    loaded = load_config(config)
    (docs,) = loaded.config.sources
    assert isinstance(docs, ObjectsSource)
    (listed,) = list_objects(loaded, docs)
    assert listed.name == "a.jsonl" and listed.location == str(source / "a.jsonl")
    (source / "b.jsonl").symlink_to(home / "exports" / "train.jsonl")
    with pytest.raises(SourceError, match=r"b\.jsonl.*data home"):
        list_objects(loaded, docs)
    (source / "b.jsonl").unlink()
    private, _public = key_paths(home)
    private.parent.mkdir()
    private.write_text('{"id": "k", "text": "not a source"}\n')
    index = source / "index.txt"  # an index may name files by URL: none in the home's store
    index.write_text(f"a.jsonl\n{private.as_uri()}\n")
    config.write_text(
        f"version: 1\npurpose: confinement-test\nstorage: {{home: {home}}}\n"
        f"sources:\n  - {{id: docs, kind: objects, index: {index}}}\n"
    )
    loaded = load_config(config)
    (docs,) = loaded.config.sources
    assert isinstance(docs, ObjectsSource)
    with pytest.raises(SourceError, match=r"signing\.key\.pem.*inside the data home"):
        list_objects(loaded, docs)


def test_a_source_folder_in_the_home_store_is_refused_one_beside_it_is_listed(
    tmp_path: Path,
) -> None:
    """The demo keeps its sources in the home (``demo-sources``): that folder is listed; the
    home itself or its store (keys, CAS) never is."""
    home = tmp_path / "home"
    for part in ("demo-sources", "keys", "cas"):
        (home / part).mkdir(parents=True)
        (home / part / "a.jsonl").write_text(_rows(part, 1))
    for path, refused in (("demo-sources", False), ("keys", True), ("cas", True), (".", True)):
        config = tmp_path / f"{path.strip('.') or 'home'}.yaml"
        config.write_text(
            f"version: 1\npurpose: confinement-test\nstorage: {{home: {home}}}\n"
            f"sources:\n  - {{id: docs, kind: objects, path: {home / path}}}\n"
        )
        loaded = load_config(config)
        (docs,) = loaded.config.sources
        assert isinstance(docs, ObjectsSource)
        if refused:
            with pytest.raises(SourceError, match="data home"):
                list_objects(loaded, docs)
        else:
            assert [o.name for o in list_objects(loaded, docs)] == ["a.jsonl"]


def test_a_changelog_segment_link_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "cdc"
    folder.mkdir()
    (folder / "000.jsonl").write_text("")
    (tmp_path / "secret.jsonl").write_text("{}\n")
    (folder / "001.jsonl").symlink_to(tmp_path / "secret.jsonl")
    with pytest.raises(ChangelogError, match=r"001\.jsonl"):
        list_segments(folder)


def _paused_build(tmp_path: Path, config: Path) -> tuple[subprocess.Popen[str], Path]:
    """``corpus-assets build`` held after the freeze listed ``docs``; the file releasing it."""
    points = tmp_path / "points"
    points.mkdir()
    env = {"CORPUS_FAILPOINTS": "pin/docs/listed=pause@1", "CORPUS_FAILPOINT_DIR": str(points)}
    process = subprocess.Popen(
        [CLI, "build", "--partition", "p1"],
        env=_env(tmp_path, config, env),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + WAIT
    while not (points / "pin_docs_listed.paused").exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the build never paused: {process.communicate()}")
        time.sleep(0.05)
    return process, points / "pin_docs_listed.go"


def test_an_object_deleted_between_listing_and_copy_fails_the_freeze_and_a_rerun_works(
    tmp_path: Path,
) -> None:
    """Today its records vanished and the snapshot validated. The freeze fails naming the object,
    nothing is frozen, and the rerun freezes the folder as it now is (every record kept)."""
    config, source, _home = _setup(tmp_path, {"a.jsonl": 30, "b.jsonl": 120, "c.jsonl": 30})
    process, go = _paused_build(tmp_path, config)
    (source / "b.jsonl").unlink()
    go.touch()
    _out, err = process.communicate(timeout=600)
    assert process.returncode == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("corpus-assets: error:"), err
    assert "b.jsonl" in lines[0] and "deleted" in lines[0] and "rerun" in lines[0], lines[0]
    with open_workspace(config) as ws:
        assert ws.catalog.freeze_digest("p1") is None  # nothing frozen
    rerun = _build(tmp_path, config)
    assert rerun.returncode == 0, rerun.stderr
    with open_workspace(config) as ws:
        spec = FreezeSpec.load(ws.cas, ws.catalog.freeze_digest("p1"))
    (docs,) = spec.sources
    assert [o.name for o in docs.objects] == ["a.jsonl", "c.jsonl"]
    assert docs.deferred == []


def test_a_link_swapped_in_after_the_listing_is_refused_at_the_copy(tmp_path: Path) -> None:
    """The listing saw a plain file; before its copy it becomes a link to a file outside the
    folder with the same size and mtime (so only where it resolves tells them apart). The
    copy re-lists it by the folder rule and the build refuses it, naming the link."""
    config, source, home = _setup(tmp_path, {"a.jsonl": 5, "b.jsonl": 5})
    listed = source / "b.jsonl"
    secret = tmp_path / "secret.jsonl"
    body = listed.read_bytes()
    secret.write_bytes(body.replace(b"b record", b"S3CR3T!!"))
    assert len(secret.read_bytes()) == len(body)
    process, go = _paused_build(tmp_path, config)
    status = listed.stat()
    listed.unlink()
    listed.symlink_to(secret)
    os.utime(secret, ns=(status.st_atime_ns, status.st_mtime_ns))
    go.touch()
    _out, err = process.communicate(timeout=600)
    assert process.returncode == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "b.jsonl is a symlink to" in lines[0], err
    assert str(secret) in lines[0] and "outside the source folder" in lines[0], lines[0]
    assert _stored_anywhere(home, b"S3CR3T!!") == []
