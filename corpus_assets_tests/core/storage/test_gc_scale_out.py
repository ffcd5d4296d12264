"""gc in the scale-out deployment: the CAS in an S3-API store (a moto server process on loopback)
and one PostgreSQL catalog shared by nodes with separate data homes.

The CAS lock spans the nodes (the catalog's advisory lock; a data home's flock alone does not),
nested holders in one process share a session (no deadlock behind a waiting gc), gc lists and
deletes in the bucket, leaves keys that are not CAS objects alone, and a node's cache drops what
gc removed on its next lock, so a put there uploads again.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import psycopg2
import pytest

from corpus_assets.core.publication.gc import Plan, plan
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_lock import cas_lock
from corpus_assets.core.storage.cas_s3 import GC_LOG, S3ContentStore
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.digests import sha256_digest
from corpus_assets.demo import write_demo
from corpus_assets.selftest.lab import Home, Lab, parse_built
from corpus_assets_tests.cli_process import CLI, output_field, run
from corpus_assets_tests.conftest import PG_ADMIN_DSN, PG_URL
from corpus_assets_tests.core.storage.test_s3_cas import MOTO_CREDENTIALS, bucket, moto_endpoint  # noqa: F401

pytestmark = pytest.mark.postgres

HOLDER = """
import sys
from pathlib import Path
from corpus_assets.core.publication.gc import Plan, plan
from corpus_assets.core.storage.cas_lock import cas_lock
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.cas import ContentStore
home, url, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
with cas_lock(home, ContentStore(home / "cas"), url, exclusive=mode == "gc"):
    print("held", flush=True)
    sys.stdin.readline()
    if mode == "nested":
        with cas_lock(home, ContentStore(home / "cas"), url, exclusive=False):
            print("nested", flush=True)
"""


def _hold(home: Path, url: str, mode: str) -> subprocess.Popen[str]:
    """A process holding the CAS lock (``gc``: exclusive, else shared) until told on stdin."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(home), url, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n", holder.stderr
    return holder


def _start(home: Path, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CORPUS_", "DAGSTER_"))}
    clean.update(CORPUS_HOME=str(home / ".corpus"), DAGSTER_HOME=str(home / ".dagster"), **env)
    return subprocess.Popen(
        [CLI, *args], cwd=home, env=clean, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _node(root: Path) -> Path:
    write_demo(root / ".corpus")
    return root


@pytest.mark.parametrize("holder", ["gc", "writer"])
def test_the_cas_lock_spans_nodes_sharing_the_catalog(
    tmp_path: Path, postgres_url: str, holder: str
) -> None:
    """Two data homes (two nodes), one PostgreSQL catalog: while one node holds the lock, the
    other's conflicting command waits for it and says so, then completes."""
    env = {"CORPUS_CATALOG_URL": postgres_url}
    items = tmp_path / "bench.jsonl"
    items.write_text('{"id": "q1", "text": "an item text that only this benchmark has"}\n')
    node_b = _node(tmp_path / "b")
    assert run(node_b, "benchmark", "list", extra_env=env).returncode == 0  # creates the schema
    held = _hold(tmp_path / "a" / ".corpus", postgres_url, "gc" if holder == "gc" else "shared")
    if holder == "gc":
        waiter = _start(node_b, "benchmark", "add", "quiz", str(items), env=env)
        said = "waiting for gc"
    else:
        waiter = _start(node_b, "gc", "--dry-run", "--json", env=env)
        said = "gc is waiting for running builds"
    try:
        _wait_until_it_waits(postgres_url, waiter)  # for the other node
    finally:
        held.communicate("\n", timeout=30)
    _out, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0, err
    assert said in err


def _wait_until_it_waits(url: str, process: subprocess.Popen, timeout: float = 120) -> None:
    """Until a request for the catalog's advisory lock is queued, ``process`` still running:
    the process waits for the lock, where a fixed pause only guessed it would have by then."""
    deadline = time.monotonic() + timeout
    while _advisory_waiters(url) == 0:
        assert process.poll() is None, process.communicate()  # it went ahead without the lock
        assert time.monotonic() < deadline, "it never asked for the lock"
        time.sleep(0.05)
    assert process.poll() is None, process.communicate()


def _advisory_waiters(url: str) -> int:
    """Ungranted advisory-lock requests in the catalog's database."""
    conn = psycopg2.connect(PG_ADMIN_DSN)
    try:
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE d.datname = %s AND l.locktype = 'advisory' AND NOT l.granted",
                (url.rsplit("/", 1)[1],),
            )
            return cursor.fetchone()[0]
    finally:
        conn.close()


def test_a_nested_holder_does_not_queue_behind_a_waiting_gc(
    tmp_path: Path, postgres_url: str
) -> None:
    """A CLI build holds the lock and runs its Dagster steps in its own process, each taking it
    again: with gc waiting in between, a second session's request would queue behind gc, which
    waits for the first session: a deadlock. One process shares one session."""
    holder = _hold(tmp_path / "a", postgres_url, "nested")
    gc = _hold_later(tmp_path / "b", postgres_url)
    deadline = time.monotonic() + 30
    while _advisory_waiters(postgres_url) == 0:
        assert time.monotonic() < deadline, "gc never asked for the lock"
        time.sleep(0.05)
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.write("\n")
    holder.stdin.flush()
    try:
        out, err = holder.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        holder.kill()
        gc.kill()
        pytest.fail("the nested holder queued behind the waiting gc")
    assert holder.returncode == 0 and out == "nested\n", err
    assert gc.stdout is not None and gc.stdout.readline() == "held\n"
    gc.communicate("\n", timeout=30)


def _hold_later(home: Path, url: str) -> subprocess.Popen[str]:
    """A gc-mode holder that is still waiting for the lock when this returns."""
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(home), url, "gc"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _bucket_keys(name: str) -> dict[str, int]:
    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=name)
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def test_listing_sizes_and_batched_deletes(bucket: str, tmp_path: Path) -> None:  # noqa: F811
    """The listing gives every key under the prefix with its size (no HEAD), marks what is not
    an object at its place, and ``remove`` deletes in batches, cached copies first."""
    store = S3ContentStore(tmp_path / "cache", f"s3://{bucket}/p")
    store.delete_batch = 2
    digests = sorted(store.put_bytes(f"object {n}".encode() * n) for n in range(1, 6))
    misplaced = "p/sha256/00/00/" + digests[0].split(":")[1]
    s3 = boto3.client("s3")
    for key in (misplaced, "p/README", "p/sha256/ab/cd/not-hex", "other/x"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"not mine")
    listed = list(store.listing())
    assert [d for d, _, _ in listed if d] == digests
    assert {k: n for d, k, n in listed if d} == {
        store.key(d): len(store.get_bytes(d)) for d in digests
    }
    assert sorted(k for d, k, _ in listed if d is None) == sorted(
        [misplaced, "p/README", "p/sha256/ab/cd/not-hex"]
    )
    store.remove(digests[:5])
    assert all(not store.local_path(d).exists() for d in digests)
    assert set(_bucket_keys(bucket)) == {misplaced, "p/README", "p/sha256/ab/cd/not-hex", "other/x"}


def _gc(home: Path, env: dict[str, str], *args: str) -> dict:
    ran = run(home, "gc", "--json", *args, extra_env=env)
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def _plan_heads(cache: Path, url: str, catalog_url: str) -> tuple[Plan, int]:
    """gc's plan from a fresh cache, and how many HeadObject requests it sent."""
    store, heads = S3ContentStore(cache, url), []
    store._client().meta.events.register("before-call.s3.HeadObject", lambda **_: heads.append(1))
    catalog = Catalog(catalog_url)
    try:
        return plan(store, catalog, "demo", None), len(heads)
    finally:
        catalog.dispose()


def test_gc_on_s3_removes_only_the_garbage_and_every_node_forgets_it(
    bucket: str,  # noqa: F811
    tmp_path: Path,
    postgres_url: str,
    moto_endpoint: str,  # noqa: F811
) -> None:
    url = f"s3://{bucket}/corpus"
    node_a = _node(tmp_path / "a")
    config = node_a / ".corpus" / "corpus.yaml"
    config.write_text(config.read_text() + f"storage: {{cas_url: '{url}'}}\n")
    env = {"CORPUS_CATALOG_URL": postgres_url, "AWS_ENDPOINT_URL": moto_endpoint}
    env.update(MOTO_CREDENTIALS)
    built = run(node_a, "build", "--partition", "p1", extra_env=env)
    assert built.returncode == 0, built.stderr
    sid = output_field(built.stdout, "snapshotId")

    before = {o["digest"] for o in _gc(node_a, env, "--dry-run")["objects"]}
    heads_before = _plan_heads(tmp_path / "lister-1", url, postgres_url)[1]
    node_b = S3ContentStore(tmp_path / "b" / "cas", url)  # another node: its cache has the junk
    junk = {node_b.put_bytes(f"orphan {n}".encode()): f"orphan {n}".encode() for n in range(30)}
    planned, heads = _plan_heads(tmp_path / "lister-2", url, postgres_url)
    assert {d for d, _ in planned.garbage} == before | set(junk)
    assert heads == heads_before  # sizes come from the listing: no HEAD per object
    s3 = boto3.client("s3")
    foreign = {"corpus/notes.txt", "corpus/sha256/00/00/" + "a" * 64}
    for key in foreign:
        s3.put_object(Bucket=bucket, Key=key, Body=b"someone else's")
    everything = _bucket_keys(bucket)

    dry = _gc(node_a, env, "--dry-run")
    listed = {o["digest"]: o["bytes"] for o in dry["objects"]}
    assert set(listed) == before | set(junk)
    assert all(listed[d] == len(data) for d, data in junk.items())
    assert {f["key"] for f in dry["foreign"]["shown"]} == foreign == set(everything) & foreign
    assert _bucket_keys(bucket) == everything  # a dry run deletes nothing

    removed = {o["digest"] for o in _gc(node_a, env)["objects"]}
    assert removed == set(listed)
    gone = {node_b.key(d) for d in removed}
    after = _bucket_keys(bucket)
    log = f"corpus/{GC_LOG}000000000001"
    assert set(after) == (set(everything) - gone) | {log}
    assert foreign <= set(after)  # not CAS objects: left alone
    logged = s3.get_object(Bucket=bucket, Key=log)["Body"].read().decode().split()
    assert sorted(logged) == sorted(removed)
    assert _gc(node_a, env, "--dry-run")["objects"] == []

    shutil.rmtree(node_a / ".corpus" / "cas")  # the retained snapshot reads back from S3 alone
    verified = run(node_a, "verify", sid, extra_env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # node B still caches the junk; its next writer drops it, so a put uploads it again
    assert all(node_b.local_path(d).is_file() for d in junk)
    writer = S3ContentStore(node_b.root, url)
    with cas_lock(tmp_path / "b", writer, postgres_url, exclusive=False):
        assert not any(writer.local_path(d).exists() for d in junk)
        digest, data = next(iter(junk.items()))
        assert writer.put_bytes(data) == digest
    assert writer.key(digest) in _bucket_keys(bucket)
    assert (node_b.root / "gc-log-seen").read_text() == "000000000001\n"


def test_local_gc_leaves_a_file_that_is_not_an_object_alone(tmp_path: Path) -> None:
    """The local store's listing: a stray file in the object tree is reported, never removed."""
    store = ContentStore(tmp_path / "cas")
    digest = store.put_bytes(b"an object")
    stray = store.local_path(digest).parent / "notes.txt"
    stray.write_text("mine")
    misplaced = tmp_path / "cas" / "sha256" / "00" / "00" / sha256_digest(b"x").split(":")[1]
    misplaced.parent.mkdir(parents=True)
    misplaced.write_bytes(b"x")
    listed = list(store.listing())
    assert (digest, str(store.local_path(digest)), 9) in listed
    assert sorted(w for d, w, _ in listed if d is None) == sorted([str(stray), str(misplaced)])


@pytest.fixture(scope="module")
def pg_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    lab = Lab(tmp_path_factory.mktemp("gc-nodes"), catalog=f"{PG_URL}/postgres")
    yield lab
    lab.close()


def _on_store(home: Home, sources: Path, url: str) -> None:
    home.configure([{"id": "docs", "kind": "objects", "path": str(sources)}])
    home.config.write_text(
        home.config.read_text().replace('{"home"', f'{{"cas_url": "{url}", "home"')
    )


@pytest.mark.heavy  # a real build held in a process while gc waits
def test_gc_on_another_node_waits_for_a_real_build(
    pg_lab: Lab,
    tmp_path: Path,
    bucket: str,  # noqa: F811
) -> None:
    """A CLI build on node A (its steps take the lock again in its process) paused mid-layer;
    gc on node B, another data home on the same catalog and store, waits; the build then runs
    its later steps while gc still waits, completes, and its snapshot is retained and verifies."""
    node_a = pg_lab.standard_home("node-a")
    node_b = Home(tmp_path / "node-b", node_a.catalog_url)
    shutil.copytree(node_a.dir / "dagster", node_b.dir / "dagster")
    for node in (node_a, node_b):
        _on_store(node, pg_lab.standard_sources, f"s3://{bucket}/nodes")
    folder = tmp_path / "points"
    folder.mkdir()
    env = {"CORPUS_FAILPOINTS": "task/*=pause@3", "CORPUS_FAILPOINT_DIR": str(folder)}
    build = node_a.start("build", env=env)
    gc = None
    try:
        deadline = time.monotonic() + 180
        while not (folder / "task_ANY.paused").exists():
            assert build.poll() is None and time.monotonic() < deadline, build.communicate()
            time.sleep(0.02)
        gc = node_b.start("gc", "--json")
        _wait_until_it_waits(node_a.catalog_url, gc)  # for node A's build
        (folder / "task_ANY.go").touch()
        out, err = build.communicate(timeout=300)
        assert build.returncode == 0, err
        gc_out, gc_err = gc.communicate(timeout=120)
    finally:
        for started in (build, gc):  # each in its own process group (Home.start)
            if started is not None and started.poll() is None:
                os.killpg(started.pid, signal.SIGKILL)
                started.wait()
    assert gc.returncode == 0, gc_err
    assert "gc is waiting for running builds" in gc_err
    sid = parse_built(out).snapshot_id
    assert sid in json.loads(gc_out)["retained_snapshots"]
    shutil.rmtree(node_a.dir / "data" / "cas")  # a fresh cache: every object from the store
    ran = node_a.cli("verify", sid)
    assert ran.code == 0, ran.out + ran.err
