"""The CAS in an S3-API object store: a real moto server process on loopback, boto3 against it.

moto (server mode) implements ``If-None-Match: *`` on ``PutObject`` and ``CompleteMultipartUpload``
(412 PreconditionFailed when the key exists), so the conditional writes run for real here; it does
not check ``x-amz-checksum-sha256`` against the body, which AWS S3 does.
"""

import hashlib
import io
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from corpus_assets.core.consumption.hf_loader import _hf_dataset_of_pack
from corpus_assets.core.consumption.loader_plan import LoaderPlan
from corpus_assets.core.runtime.config import ConfigError, parse_config
from corpus_assets.core.runtime.workspace import open_home
from corpus_assets.core.storage.cas import (
    CasError,
    ContentStore,
    CorruptObjectError,
    MissingObjectError,
)
from corpus_assets.core.storage.cas_s3 import S3ContentStore
from corpus_assets.core.storage.digests import sha256_digest
from corpus_assets.demo import write_demo
from corpus_assets_tests.cli_process import output_field, run
from corpus_assets_tests.core.storage.test_shards import identity, make_blocks, write

boto3 = pytest.importorskip(
    "boto3", reason="boto3 is not installed (pip install 'corpus-assets[s3]')"
)

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzzSECRET"  # an AWS-style secret: '/' and '+' in it
MOTO_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(pid: int) -> None:
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
            time.sleep(0.05)


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    """``moto_server`` on a free loopback port, stopped by its pid after the module."""
    port = _free_port()
    server = Path(sys.executable).with_name("moto_server")
    process = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError as error:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start ({error})") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(process.pid)


@pytest.fixture
def bucket(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; the environment points boto3 at moto (``AWS_ENDPOINT_URL``)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    for name, value in MOTO_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "CORPUS_CAS_URL"):
        monkeypatch.delenv(name, raising=False)
    name = f"cas-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=name)
    return name


def _objects(root: Path) -> list[Path]:
    return sorted(p for p in (root / "sha256").rglob("*") if p.is_file())


def test_roundtrip_layout_and_an_empty_cache_reads_back(bucket: str, tmp_path: Path) -> None:
    store = S3ContentStore(tmp_path / "a", f"s3://{bucket}/corp/v1/")
    data = b"hello object store\n" * 1000
    digest = store.put_bytes(data)
    streamed, size = store.put_stream(io.BytesIO(b"streamed bytes"))
    adopted_file = tmp_path / "adopt.bin"
    adopted_file.write_bytes(b"adopted")
    adopted, _ = store.adopt_file(adopted_file)
    assert (store.stats.created, store.stats.reused, size) == (3, 0, 14)
    assert not adopted_file.exists()

    hexd = digest.split(":")[1]
    key = f"corp/v1/sha256/{hexd[:2]}/{hexd[2:4]}/{hexd}"
    assert boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read() == data
    assert store.local_path(digest).read_bytes() == data  # written through to the cache
    assert store.uri(digest) == ContentStore(tmp_path).uri(digest)  # manifests are unchanged

    store.put_bytes(data)  # present: reused, nothing uploaded
    assert (store.stats.created, store.stats.reused) == (3, 1)

    fresh = S3ContentStore(tmp_path / "b", f"s3://{bucket}/corp/v1")
    assert _objects(fresh.root) == []
    assert fresh.contains(digest) and fresh.size(digest) == len(data)
    assert not fresh.contains(sha256_digest(b"never stored"))
    assert _objects(fresh.root) == []  # contains/size ask the store, they do not download
    assert sorted(fresh.iter_digests()) == sorted([digest, streamed, adopted])
    assert fresh.get_bytes(digest) == data
    with fresh.open(streamed) as reader:
        assert reader.read() == b"streamed bytes"
    assert fresh.path(adopted).read_bytes() == b"adopted"  # path() is the read-through
    assert len(_objects(fresh.root)) == 3
    copy = pickle.loads(pickle.dumps(fresh))  # shipped to a worker: it opens its own client
    assert copy.get_bytes(digest) == data and copy._s3 is not fresh._s3
    missing = sha256_digest(b"never stored")
    assert not fresh.path(missing).exists()
    with pytest.raises(MissingObjectError, match=missing):
        fresh.size(missing)
    with pytest.raises(MissingObjectError, match=missing):
        fresh.get_bytes(missing)


class _LateHead(S3ContentStore):
    """Sees the store as it was before another writer's upload landed (the race window): its
    put goes straight to the conditional write."""

    def contains(self, digest: str) -> bool:
        return False


@pytest.mark.parametrize("multipart", [False, True])
def test_conditional_write_loses_to_an_earlier_writer_and_counts_reused(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, multipart: bool
) -> None:
    if multipart:  # 11 MiB in three parts, visible only at the conditional complete
        monkeypatch.setattr(S3ContentStore, "multipart_bytes", 5 << 20)
        monkeypatch.setattr(S3ContentStore, "part_bytes", 5 << 20)
    data = os.urandom(11 << 20)
    first = S3ContentStore(tmp_path / "first", f"s3://{bucket}")
    digest = first.put_bytes(data)
    assert first.stats.created == 1
    late = _LateHead(tmp_path / "late", f"s3://{bucket}")
    assert late.put_bytes(data) == digest
    assert (late.stats.created, late.stats.reused) == (0, 1)  # the 412: someone else wrote it
    assert late.local_path(digest).read_bytes() == data
    s3 = boto3.client("s3")
    if multipart:
        assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")  # the loser aborted
    assert S3ContentStore(tmp_path / "empty", f"s3://{bucket}").get_bytes(digest) == data


PUT_SCRIPT = """
import sys, time
from pathlib import Path
from corpus_assets.core.storage.cas_s3 import S3ContentStore
store = S3ContentStore(Path(sys.argv[1]), sys.argv[2])
data = bytes(range(256)) * (1 << 14)
while time.time() < float(sys.argv[3]):
    time.sleep(0.005)
print(store.put_bytes(data), store.stats.created, store.stats.reused)
"""


def test_concurrent_puts_of_the_same_bytes_from_other_processes(
    bucket: str, tmp_path: Path
) -> None:
    start = time.time() + 3.0
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                PUT_SCRIPT,
                str(tmp_path / f"p{n}"),
                f"s3://{bucket}/x",
                str(start),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    digests, created, reused = zip(*(out.split() for out, _ in outs), strict=True)
    data = bytes(range(256)) * (1 << 14)
    assert set(digests) == {sha256_digest(data)}
    assert sum(map(int, created)) >= 1 and sum(map(int, created)) + sum(map(int, reused)) == 3
    store = S3ContentStore(tmp_path / "reader", f"s3://{bucket}/x")
    assert store.get_bytes(sha256_digest(data)) == data
    assert list(store.iter_digests()) == [sha256_digest(data)]


def test_a_corrupt_remote_object_is_named_and_never_cached(bucket: str, tmp_path: Path) -> None:
    writer = S3ContentStore(tmp_path / "w", f"s3://{bucket}/p")
    digest = writer.put_bytes(b"the true bytes")
    key = writer.key(digest)
    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=b"other bytes!!")

    reader = S3ContentStore(tmp_path / "r", f"s3://{bucket}/p")
    with pytest.raises(CorruptObjectError) as caught:
        reader.get_bytes(digest)
    assert caught.value.digest == digest and digest in str(caught.value)
    assert caught.value.actual == sha256_digest(b"other bytes!!")
    with pytest.raises(CorruptObjectError, match=digest):
        reader.verify(digest)
    with pytest.raises(CorruptObjectError, match=digest):
        reader.path(digest)
    assert _objects(reader.root) == []  # nothing corrupt in the cache
    assert not any((reader.root / "tmp").iterdir())  # and no temp file left behind
    assert writer.get_bytes(digest) == b"the true bytes"  # the writer's cached copy is intact


def test_a_local_cas_does_not_silently_become_a_cache(bucket: str, tmp_path: Path) -> None:
    ContentStore(tmp_path / "cas").put_bytes(b"only here")
    with pytest.raises(CasError, match="holds objects of a local CAS"):
        S3ContentStore(tmp_path / "cas", f"s3://{bucket}")
    S3ContentStore(tmp_path / "cache", f"s3://{bucket}/a")
    with pytest.raises(CasError, match=f"is the CAS cache of s3://{bucket}/a"):
        S3ContentStore(tmp_path / "cache", f"s3://{bucket}/b")


def test_config_and_environment_select_the_store(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = {"version": 1, "purpose": "p", "sources": [{"id": "a", "kind": "objects", "path": "."}]}
    for bad in ("s3:/b", "gs://bucket/x", "s3://B/x", "s3://"):
        with pytest.raises(ConfigError, match="cas_url"):
            parse_config({**raw, "storage": {"cas_url": bad}}, "corpus.yaml")
    parsed = parse_config({**raw, "storage": {"cas_url": f"s3://{bucket}/p"}}, "corpus.yaml")
    assert parsed.storage.cas_url == f"s3://{bucket}/p"

    with open_home(tmp_path / "h1") as opened:
        assert type(opened.cas) is ContentStore  # unset: the local store, unchanged
    monkeypatch.setenv("CORPUS_CAS_URL", f"s3://{bucket}/env")
    with open_home(tmp_path / "h2", cas_url=f"s3://{bucket}/config") as opened:
        assert isinstance(opened.cas, S3ContentStore) and opened.cas.url == f"s3://{bucket}/env"


def _demo_home(home: Path, storage: str = "") -> None:
    config = write_demo(home / ".corpus")
    config.write_text(config.read_text() + storage)


@pytest.mark.postgres
def test_training_loaders_read_the_object_store_with_an_empty_cache(
    bucket: str, tmp_path: Path
) -> None:
    """The HF and torch loaders reopen the store in their workers: with the CAS in S3 they read
    it (through their own cache), not just whatever a local directory happens to hold."""
    url = f"s3://{bucket}/loaders"
    _index, ref = write(S3ContentStore(tmp_path / "writer", url), make_blocks(40), [25, 15])
    reader_store = S3ContentStore(tmp_path / "reader", url)  # nothing cached yet
    rows = list(_hf_dataset_of_pack(reader_store, ref["digest"]))
    assert len(rows) == 40
    plan = LoaderPlan(reader_store.root, identity(ref["digest"]), cas_url=reader_store.url)
    plan = pickle.loads(pickle.dumps(plan))  # as a DataLoader worker gets it
    with plan.open_reader() as blocks:
        assert blocks.index.blocks == 40


@pytest.mark.heavy  # the demo built twice, on S3 and PostgreSQL
def test_demo_on_s3_and_postgresql_matches_local_and_reads_back_from_s3_alone(
    bucket: str, tmp_path: Path, postgres_url: str, moto_endpoint: str
) -> None:
    """The CLI build (Dagster job) with the CAS in S3 and the catalog in PostgreSQL has the
    local build's snapshotId; with the local cache wiped, verify and a training read work.
    Both URLs carry a secret (``s3://KEY:SECRET@``, ``postgresql://user:SECRET@``): no output
    stream and no file but the config the user wrote it in ever holds it."""
    _demo_home(tmp_path / "local")
    local = run(tmp_path / "local", "build", "--partition", "p1")
    assert local.returncode == 0, local.stderr

    home = tmp_path / "s3"
    _demo_home(home, f"storage: {{cas_url: 's3://testing:{SECRET}@{bucket}/corpus'}}\n")
    catalog_url = postgres_url.replace("://postgres@", f"://postgres:{SECRET}@")
    env = {"CORPUS_CATALOG_URL": catalog_url, "AWS_ENDPOINT_URL": moto_endpoint}
    env.update(MOTO_CREDENTIALS)
    on_s3 = run(home, "build", "--partition", "p1", extra_env=env)
    assert on_s3.returncode == 0, on_s3.stderr
    sid = output_field(on_s3.stdout, "snapshotId")
    assert sid == output_field(local.stdout, "snapshotId")
    shown = [on_s3]
    for step in (("approve", sid, "--by", "alice"), ("activate", sid), ("status", "--json")):
        done = run(home, *step, extra_env=env)
        assert done.returncode == 0, done.stderr
        shown.append(done)
    assert "postgres:***@" in json.loads(shown[-1].stdout)["catalog"]

    cache = home / ".corpus" / "cas"
    stored = set(S3ContentStore(tmp_path / "lister", f"s3://{bucket}/corpus").iter_digests())
    cached = {"sha256:" + p.name for p in _objects(cache)}
    assert cached and cached <= stored  # every cached object is in the store
    shutil.rmtree(cache)

    verified = run(home, "verify", sid, extra_env=env)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith(f"OK {sid}: ")
    read = run(home, "read", sid, "--run-id", "r", "--purpose", "demo-pretraining", extra_env=env)
    assert read.returncode == 0, read.stderr
    report = json.loads(read.stdout)
    assert report["snapshotId"] == sid and report["blocks"] > 0
    refilled = {"sha256:" + p.name for p in _objects(cache)}
    assert refilled and refilled <= stored
    for path in _objects(cache):  # what came back is what the names say
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name
    for done in [*shown, verified, read]:
        assert SECRET not in done.stdout + done.stderr, done.args
    config = home / ".corpus" / "corpus.yaml"
    for path in home.rglob("*"):  # the data home, the Dagster home and its run logs
        if path.is_file() and path != config:
            assert SECRET.encode() not in path.read_bytes(), path


def test_a_bucket_that_does_not_exist_is_named_with_how_to_create_it(
    bucket: str, tmp_path: Path
) -> None:
    """The CAS never creates its bucket (who owns it, its region and policies are the operator's
    choice): the first request says so instead of a bare NoSuchBucket."""
    missing = f"{bucket}-absent"
    store = S3ContentStore(tmp_path, f"s3://{missing}/corp")
    with pytest.raises(CasError) as raised:
        store.put_bytes(b"first object")
    message = str(raised.value)
    assert f"bucket {missing!r} does not exist" in message
    assert f"aws s3 mb s3://{missing}" in message
    assert (
        list((tmp_path / "sha256").rglob("*.*")) == []
    )  # nothing cached for an upload that failed
