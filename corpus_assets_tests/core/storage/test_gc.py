"""``corpus-assets gc``: a dry run lists exactly the unreferenced objects and deletes nothing,
gc removes only those (every retained snapshot still verifies), retention keeps what a permit
names, and gc racing a real build waits for it: the build completes and verifies."""

import fcntl
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest
from sqlalchemy import insert

from corpus_assets.core.governance import deletion_index, states
from corpus_assets.core.publication.gc import retained_snapshots
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_lock import lock_path
from corpus_assets.core.storage.catalog import Catalog, alias_history, gate, permits, snapshots
from corpus_assets.selftest.lab import Lab, parse_built

POINT = "task/*"
SLUG = "task_ANY"  # failpoints.Rule.slug of POINT


@pytest.fixture
def lab(selftest_lab: Lab) -> Lab:
    return selftest_lab


def _gc(home, *args: str) -> dict:
    ran = home.cli("gc", "--json", *args)
    assert ran.code == 0, ran.err
    return json.loads(ran.out)


def test_dry_run_lists_exactly_the_garbage_and_gc_removes_only_it(lab: Lab) -> None:
    home, built = lab.copy_of_reference("gc-dry")
    cas = ContentStore(home.dir / "data" / "cas")
    before = _gc(home, "--dry-run")
    junk = {cas.put_bytes(f"orphan {n}".encode()) for n in range(3)}
    listed = {o["digest"] for o in _gc(home, "--dry-run")["objects"]}
    assert listed == {o["digest"] for o in before["objects"]} | junk
    everything = set(cas.iter_digests())
    assert listed < everything
    assert all(cas.contains(d) for d in everything)  # a dry run deletes nothing
    removed = {o["digest"] for o in _gc(home)["objects"]}
    assert removed == listed
    assert set(cas.iter_digests()) == everything - removed
    assert _gc(home, "--dry-run")["objects"] == []
    ran = home.cli("verify", built.snapshot_id)
    assert ran.code == 0, ran.out + ran.err
    catalog = Catalog(f"sqlite:///{home.dir / 'data' / 'catalog.sqlite'}")
    manifests = [s.manifest_digest for s in states.find(catalog)]
    index = deletion_index.stored_objects(cas, catalog, manifests)
    catalog.dispose()
    assert index and index <= set(cas.iter_digests())  # retained snapshots keep their index


def _snapshot(conn, sid: str, state: str, at: float) -> None:
    values = dict(partition_key=sid, manifest_digest="sha256:" + "0" * 64, alias="train")
    conn.execute(
        insert(snapshots).values(
            snapshot_id=sid, state=state, created_at=at, updated_at=at, **values
        )
    )


def test_retention_keeps_generations_active_permitted_and_unsuperseded(tmp_path: Path) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.sqlite'}")
    with catalog.begin() as conn:
        for gen in range(1, 5):
            _snapshot(conn, f"g{gen}", "ACTIVE", gen)
            conn.execute(
                insert(alias_history).values(
                    alias="train", generation=gen, snapshot_id=f"g{gen}", at=gen
                )
            )
        _snapshot(conn, "lost", "SUPERSEDED", 5)
        _snapshot(conn, "candidate", "APPROVED", 6)
        _snapshot(conn, "refused", "REJECTED", 7)
        conn.execute(
            insert(gate).values(
                alias="train",
                tombstone_watermark=0,
                benchmark_fence=0,
                generation=4,
                active_snapshot="g4",
                updated_at=8,
            )
        )
        conn.execute(
            insert(permits).values(
                permit_id="p1",
                run_id="r1",
                snapshot_id="g1",
                purpose="t",
                tombstone_watermark=0,
                benchmark_fence=0,
                at=9,
            )
        )
    everything = ["candidate", "g1", "g2", "g3", "g4", "lost", "refused"]
    assert retained_snapshots(catalog, "train", None) == (everything, [])
    kept, dropped = retained_snapshots(catalog, "train", 2)
    assert dropped == ["g2", "lost"]  # g1: a permit names it; g3, g4: the last two generations
    assert kept == ["candidate", "g1", "g3", "g4", "refused"]
    assert retained_snapshots(catalog, "other", 1) == (everything, [])


def test_gc_racing_a_build_loses_nothing(lab: Lab, tmp_path: Path) -> None:
    home = lab.standard_home("gc-race")
    folder = tmp_path / "points"
    folder.mkdir()
    env = {"CORPUS_FAILPOINTS": f"{POINT}=pause@3", "CORPUS_FAILPOINT_DIR": str(folder)}
    build = home.start("build", env=env)
    marker = folder / f"{SLUG}.paused"
    deadline = time.monotonic() + 180
    while not marker.exists():
        assert build.poll() is None and time.monotonic() < deadline, build.communicate()
        time.sleep(0.02)
    gc = home.start("gc", "--json")
    assert gc.stderr is not None
    said = _first_line_with(gc.stderr, "waiting for running builds")  # or EOF: gc exited
    assert "waiting for running builds" in said, said + gc.stderr.read()
    assert gc.poll() is None  # it waits for the build's shared lock
    (folder / f"{SLUG}.go").touch()
    out, err = build.communicate(timeout=300)
    assert build.returncode == 0, err
    gc_out, gc_err = gc.communicate(timeout=120)
    assert gc.returncode == 0, gc_err
    sid = parse_built(out).snapshot_id
    assert sid in json.loads(gc_out)["retained_snapshots"]
    ran = home.cli("verify", sid)
    assert ran.code == 0, ran.out + ran.err


def test_a_dagster_step_holds_the_cas_lock_gc_waits_for(lab: Lab, tmp_path: Path) -> None:
    """A run launched from the UI, a sensor or a schedule is not the CLI's build: each layer step
    holds the CAS lock shared while it writes, so gc cannot start while a step is paused."""
    home = lab.standard_home("gc-step")
    add = "from corpus_assets.cli.instance import dagster_instance; "
    add += "dagster_instance().add_dynamic_partitions('snapshots', ['p1'])"
    subprocess.run([sys.executable, "-c", add], env=home.env(), cwd=home.dir, check=True)
    folder = tmp_path / "points"
    folder.mkdir()
    env = {
        **home.env(),
        "CORPUS_FAILPOINTS": f"{POINT}=pause@1",
        "CORPUS_FAILPOINT_DIR": str(folder),
    }
    job = [str(Path(sys.executable).with_name("dagster")), "job", "execute"]
    tags = json.dumps({"dagster/partition": "p1"})
    run = subprocess.Popen(
        [*job, "-m", "corpus_assets.definitions", "-j", "build_snapshot", "--tags", tags],
        env=env,
        cwd=home.dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while not (folder / f"{SLUG}.paused").exists():
        assert run.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    lock = lock_path(home.dir / "data")
    assert not _gc_could_start(lock)
    (folder / f"{SLUG}.go").touch()
    assert run.wait(timeout=600) == 0
    assert _gc_could_start(lock)


@pytest.mark.parametrize("command", ["benchmark-add", "tombstone-hits"])
def test_cas_writers_outside_a_build_wait_for_gc(lab: Lab, tmp_path: Path, command: str) -> None:
    """``benchmark add`` puts item texts in the CAS before the registry names them and
    ``tombstone hits`` writes deletion indexes: while gc holds the lock neither may write, or gc
    could remove an object the catalog is about to name."""
    home = lab.standard_home(f"gc-writer-{command}")
    items = tmp_path / "bench.jsonl"
    items.write_text('{"id": "q1", "text": "an item text that only this benchmark has"}\n')
    assert home.cli("tombstone", "add", "--record", "docs/none", "--reason", "test").code == 0
    args = {
        "benchmark-add": ("benchmark", "add", "quiz", str(items)),
        "tombstone-hits": ("tombstone", "hits", "1"),
    }[command]
    lock = lock_path(home.dir / "data")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a+") as gc_holds:
        fcntl.flock(gc_holds, fcntl.LOCK_EX)
        writer = home.start(*args)
        assert writer.stderr is not None
        said = _first_line_with(writer.stderr, "waiting for gc")  # or EOF: the writer exited
        assert "waiting for gc" in said, said + writer.stderr.read()
        assert writer.poll() is None  # it waits for gc
        if command == "benchmark-add":
            listed = json.loads(home.cli("benchmark", "list").out)["benchmarks"]
            assert listed == []  # nothing registered (or put) while gc runs
    _out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0, err


def _first_line_with(stream: IO[str], text: str) -> str:
    """Read lines until one contains ``text``; what was read, ending at that line or at EOF."""
    seen = ""
    for line in iter(stream.readline, ""):
        seen += line
        if text in line:
            break
    return seen


def _gc_could_start(path: Path) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
