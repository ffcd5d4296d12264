"""The same build on a real Ray cluster gives the same bytes as the local engine.

The cluster is two ``ray start`` processes (a head and a second node, loopback, one CPU each),
started in their own process groups and stopped by those group ids at the end. Ray workers open
the data home by path: here it is this machine's disk, shared by every node. The build on Ray
keeps its CAS in an S3 server (moto's server process on loopback) and its catalog in PostgreSQL,
the scale-out deployment; the local build uses the embedded defaults (local CAS, SQLite).
"""

import contextlib
import operator
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.config import ConfigError, parse_config
from corpus_assets.core.runtime.layer_index import LayerResult
from corpus_assets.core.runtime.runners import RayRunner, RayUnavailable, WorkerSetup
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.cas_s3 import S3ContentStore
from corpus_assets.core.storage.catalog import chunk_tasks
from corpus_assets.core.training_view.splits.heldout_tasks import GROUP_ENV
from corpus_assets_tests.core.records.test_pieces import LARGE_FILE_PIECES, one_large_file
from corpus_assets_tests.core.storage.test_s3_cas import bucket, moto_endpoint  # noqa: F401 - fixtures

# Read when ray is imported: under ``uv run`` Ray would start workers with ``uv run`` in a copy of
# the cwd (no .tools there); they use the cluster's Python, where corpus_assets is installed.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'corpus-assets[ray]')")

LAYERS_ON_RUNNER = ("raw_snapshot", "canonical_records", "dedup_signatures", "tokens")


_PORTS_GIVEN: set[int] = set()


def _free_port() -> int:
    """A loopback port free now and never handed out before in this process: the kernel may give
    a just-closed port again, and Ray refuses two components on one port (a CI failure)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port


def _ray_start(args: list[str], env: dict[str, str]) -> int:
    """Run ``ray start`` in a new session; its daemons stay in that process group (returned)."""
    ray_cli = Path(sys.executable).with_name("ray")
    ports = [
        f"--{name}={_free_port()}" for name in ("metrics-export-port", "runtime-env-agent-port")
    ]
    ports += [f"--dashboard-agent-{name}-port={_free_port()}" for name in ("listen", "grpc")]
    command = [str(ray_cli), "start", "--node-ip-address=127.0.0.1", "--num-cpus=1", *ports, *args]
    process = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = process.communicate(timeout=120)
    if process.returncode != 0:
        _stop(process.pid)
        raise RuntimeError(f"ray start failed:\n{out.decode(errors='replace')[-3000:]}")
    return process.pid


def _stop(group: int) -> None:
    """Stop one ``ray start``'s daemons by their process group id: TERM, then KILL."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


@contextlib.contextmanager
def _cluster(nodes: int, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A head plus ``nodes - 1`` more nodes on loopback, stopped (by group id) after, with the
    driver disconnected first: its GCS address and its Ray Client address (``ray://``)."""
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths have a limit
    env = {**os.environ, "RAY_TMPDIR": temp, "RAY_USAGE_STATS_ENABLED": "0"}
    monkeypatch.setenv("RAY_TMPDIR", temp)
    address = f"127.0.0.1:{_free_port()}"
    head = ["--head", f"--port={address.split(':')[1]}", "--include-dashboard=false"]
    client = f"ray://127.0.0.1:{_free_port()}"
    head += [f"--ray-client-server-port={client.rsplit(':')[-1]}", f"--temp-dir={temp}"]
    groups = []
    try:
        groups.append(_ray_start(head, env))
        for _ in range(nodes - 1):
            groups.append(_ray_start([f"--address={address}"], env))
        yield address, client
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for group in reversed(groups):
            _stop(group)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture
def ray_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A head plus one worker node on loopback."""
    with _cluster(2, monkeypatch) as (address, _):
        yield address


@pytest.fixture
def ray_head(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A lone head node (one CPU) on loopback: its GCS and Ray Client addresses."""
    with _cluster(1, monkeypatch) as addresses:
        yield addresses


def build_with_runner_pids(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, LayerResult], set[int]]:
    """Build partition p1 of ``home/corpus.yaml``; the results and the pids that ran its runner
    chunk tasks (read off the task table's owners)."""
    monkeypatch.setenv("CORPUS_HOME", str(home))
    monkeypatch.setenv("CORPUS_CONFIG", str(home / "corpus.yaml"))
    with open_workspace() as ws:
        results = build_all(ws, "p1")
        with ws.catalog.begin() as conn:
            owners = conn.execute(
                select(chunk_tasks.c.owner).where(chunk_tasks.c.layer.in_(LAYERS_ON_RUNNER))
            ).scalars()
            pids = {int(owner.split(":")[1]) for owner in owners}
    return results, pids


def _build(
    demo_home: Path, home: Path, execution: str, monkeypatch: pytest.MonkeyPatch, storage: str = ""
) -> tuple[str, dict[str, str], set[int], dict[str, int], dict[str, Any]]:
    """A whole build of a copy of the demo with ``execution`` (and ``storage``): its snapshotId,
    every layer's index digest but the (signed) manifest's, the pids that ran its chunk
    tasks, the dedup layer's run_stats and what the splits layer's held-out search did."""
    shutil.copytree(demo_home / "demo-sources", home / "demo-sources")
    config = (demo_home / "corpus.yaml").read_text() + f"execution: {execution}\n{storage}"
    (home / "corpus.yaml").write_text(config)
    results, pids = build_with_runner_pids(home, monkeypatch)
    layers = {layer: r.digest for layer, r in results.items() if layer != "manifest"}
    dedup = results["dedup_clusters"].run_stats
    search = results["splits"].details["heldout_search"]
    return results["manifest"].digests["snapshotId"], layers, pids, dedup, search


@pytest.mark.heavy  # a Ray cluster, S3 and PostgreSQL
@pytest.mark.postgres
def test_local_and_ray_builds_give_the_same_snapshot(
    bucket: str,  # noqa: F811 - first: sets the AWS environment the Ray nodes inherit
    postgres_url: str,
    demo_home: Path,
    tmp_path: Path,
    ray_cluster: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CORPUS_DEDUP_PARTITIONS", "2")  # two reduce tasks per near-dedup class
    monkeypatch.setenv(GROUP_ENV, "1")  # a held-out search task per canonical chunk
    monkeypatch.setenv("CORPUS_GATHER_ROWS", "100")  # the clusters join in several tasks
    local = _build(demo_home, tmp_path / "local", "{engine: local}", monkeypatch)

    monkeypatch.setenv("CORPUS_CATALOG_URL", postgres_url)
    url = f"s3://{bucket}/demo"
    ray_execution = f"{{engine: ray, address: '{ray_cluster}'}}"
    storage = f"storage: {{cas_url: '{url}'}}\n"
    on_ray = _build(demo_home, tmp_path / "ray", ray_execution, monkeypatch, storage)
    assert local[2] == {os.getpid()}  # the local engine with one worker runs in this process
    assert on_ray[2] and os.getpid() not in on_ray[2]  # every chunk task ran in a Ray worker
    assert on_ray[:2] == local[:2]
    # near-dedup: one worker bands and verifies in this process; on Ray every class's band
    # keys are partitioned and each partition paired and verified by a task on the cluster
    assert "band_reduce_tasks" not in local[3]
    assert on_ray[3]["band_reduce_tasks"] == 2 * 2, on_ray[3]  # two classes, two partitions
    assert on_ray[3]["band_reduce_elsewhere"] == on_ray[3]["band_reduce_tasks"]
    assert on_ray[3]["pair_verify_elsewhere"] == on_ray[3]["pair_verify_tasks"] == 2 * 2
    assert on_ray[3]["pairs_verified"] == local[3]["pairs_verified"] > 0
    # the clusters table: joined by DuckDB here locally, by gather tasks on Ray's workers
    assert "clusters_gather_tasks" not in local[3]
    gathered = on_ray[3]["clusters_gather_tasks"]
    assert on_ray[3]["clusters_gather_elsewhere"] == gathered > 1, on_ray[3]
    # the held-out search: in this process locally, a task per chunk in Ray workers on Ray
    assert "tasks" not in local[4]
    assert on_ray[4]["tasks"] >= 2 and on_ray[4]["task_processes"] >= 1, on_ray[4]
    assert on_ray[4]["pairs"] == local[4]["pairs"] > 0

    # every object of the build, the Ray workers' included, is in the store: an empty cache
    # reads each back, verified
    store = S3ContentStore(tmp_path / "empty-cache", url)
    stored = set(store.iter_digests())
    cache = tmp_path / "ray" / "cas" / "sha256"
    assert {"sha256:" + p.name for p in cache.rglob("*") if p.is_file()} <= stored
    for digest in sorted(stored):
        store.verify(digest)

    # every task asks a node for execution.worker_memory_mb: a bound no node offers is named
    # by the probe instead of a task queued forever
    runner = RayRunner(ray_cluster, startup_timeout_s=4, memory_mb=1 << 22)  # 4 TiB
    with pytest.raises(RayUnavailable, match=r"worker_memory_mb=4194304 MB"):
        runner.map(abs, [-1], NO_SETUP)
    assert RayRunner(ray_cluster, startup_timeout_s=60, memory_mb=256).map(
        abs, [-1, 2], NO_SETUP
    ) == [1, 2]


@pytest.mark.heavy  # a Ray node and 300,000 documents
def test_one_large_file_in_pieces_on_ray_as_in_process(
    ray_head: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file larger than a piece: its canonical task on a Ray worker cuts it where this
    process does, and each piece's tasks (signatures, tokens) run on Ray too; the same layers
    byte for byte and the same snapshot id, validated."""
    built = {}
    for engine, execution in (
        ("local", "{workers: 1}"),
        ("ray", f"{{engine: ray, address: '{ray_head[0]}'}}"),
    ):
        home = tmp_path / engine
        one_large_file(home, execution)
        results, pids = build_with_runner_pids(home, monkeypatch)
        with open_workspace() as ws:
            _, canonical = CanonicalIndex.read(ws, "p1")
            assert [c.count for c in canonical.chunks()] == LARGE_FILE_PIECES
            sid = results["manifest"].digests["snapshotId"]
            assert validate_snapshot(ws, sid).ok
        built[engine] = ({k: r.digest for k, r in results.items() if k != "manifest"}, sid, pids)
    assert built["local"][2] == {os.getpid()}
    assert built["ray"][2] and os.getpid() not in built["ray"][2]  # every chunk task on Ray
    assert built["ray"][:2] == built["local"][:2]


@pytest.mark.parametrize(
    "execution",
    ["{engine: ray}", "{engine: local, address: auto}", "{engine: ray, address: 'http://x'}"],
)
def test_ray_needs_an_address_and_local_takes_none(execution: str) -> None:
    import yaml

    raw = {"version": 1, "purpose": "p", "sources": [{"id": "a", "kind": "objects", "path": "."}]}
    raw["execution"] = yaml.safe_load(execution)
    with pytest.raises(ConfigError, match="execution"):
        parse_config(raw, "corpus.yaml")


# Jobs the bound tests send: importable by reference in any worker (no test module needed there).
NO_SETUP = WorkerSetup(operator.is_, "unused")  # setup(config_path, environ): a no-op


@pytest.mark.slow  # 40-75 s, mostly a Ray head's start-up; the two-node build runs in CI
def test_ray_waits_are_bounded(ray_head: tuple[str, str], tmp_path: Path) -> None:
    """A job that never finishes, or workers that can never start, fail the map within their
    bounds with an error that says what to check; both used to hang the build forever."""
    address, client = ray_head
    # A healthy cluster runs jobs in job order (the probe passes), also through Ray Client (the
    # ray://head:10001 form a Dagster run pod uses on Kubernetes).
    assert RayRunner(client, startup_timeout_s=60).map(abs, [-3, 2, -1], NO_SETUP) == [3, 2, 1]
    ray.shutdown()
    assert RayRunner(address, startup_timeout_s=60).map(abs, [-3, 2, -1], NO_SETUP) == [3, 2, 1]

    # A job that never finishes fails the map once nothing has finished for task_timeout_s.
    started = time.monotonic()
    with pytest.raises(RayUnavailable, match=r"task_timeout_s=2s \(1 of 2 still pending"):
        RayRunner(address, task_timeout_s=2).map(time.sleep, [0, 600], NO_SETUP)
    assert 2 <= time.monotonic() - started < 15

    # A failed job fails the map as soon as it is seen, and the job still running is cancelled.
    started = time.monotonic()
    with pytest.raises(TypeError):
        RayRunner(address, task_timeout_s=60).map(time.sleep, ["x", 600], NO_SETUP)
    assert time.monotonic() - started < 15
    ray.shutdown()

    # A worker Python that cannot start (an executable that exits at once, as a broken env or a
    # failing `uv run` worker command does). Last: the raylet keeps retrying that start.
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\nexit 1\n")
    broken.chmod(0o755)
    ray.init(address=address, log_to_driver=False, runtime_env={"py_executable": str(broken)})
    started = time.monotonic()
    with pytest.raises(RayUnavailable) as failure:
        RayRunner(address, startup_timeout_s=4).map(abs, [-1, -2], NO_SETUP)
    assert time.monotonic() - started < 15
    message = str(failure.value)
    for needed in (address, "startup_timeout_s=4s", "workers cannot start", str(broken)):
        assert needed in message
    assert "RAY_ENABLE_UV_RUN_RUNTIME_ENV=0" in message


def test_an_address_nobody_listens_on_fails_at_once() -> None:
    if ray.is_initialized():
        ray.shutdown()
    address = f"127.0.0.1:{_free_port()}"
    started = time.monotonic()
    with pytest.raises(RayUnavailable, match=f"{address}: no Ray cluster answers there"):
        RayRunner(address).map(abs, [1], NO_SETUP)
    assert time.monotonic() - started < 5


def test_ports_handed_to_ray_are_never_repeated() -> None:
    """A thousand ports, all distinct: the kernel alone repeats some (birthday odds over its
    ephemeral range), and one repeat made ``ray start`` refuse to run."""
    ports = [_free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)
