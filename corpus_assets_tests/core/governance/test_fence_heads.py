"""A new alias's fences start at the registries' heads, not at zero.

Benchmark items registered and tombstones added before an alias's first build must bind that
build exactly as they bind every later one: the freeze reads the gate row, so a row created at
fence 0 would build, record ``benchmarkFence 0`` and validate with the item as a member. Tried
through the library on SQLite and PostgreSQL, through the CLI as a new user would, and against a
registration that commits while the row is being created.
"""

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from corpus_assets.core.governance import alias_gate, benchmarks, states, tombstones
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.publication.publish import activate, approve
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.records.normalize import dedup_key
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.catalog import Catalog, benchmark_items
from corpus_assets.core.storage.catalog import gate as gate_rows
from corpus_assets.core.storage.catalog import tombstones as tombstone_rows
from corpus_assets.demo import demo_objects, write_demo
from corpus_assets_tests.cli_process import output_field, run
from corpus_assets_tests.conftest import POSTGRES_IN_SLOW_TIER

BENCHMARKED = "essays/e0124"  # a demo essay whose whole text is registered as a benchmark item
REVOKED = "essays/e0001"


def _demo_text(record_id: str) -> str:
    source, rid = record_id.split("/")
    for line in demo_objects()[f"{source}/{source}-00001.jsonl"].decode().splitlines():
        row = json.loads(line)
        if row["id"] == rid:
            return row["text"]
    raise LookupError(record_id)


def _register_benchmark(ws: Workspace) -> int:
    text = _demo_text(BENCHMARKED)
    item = benchmarks.BenchmarkItem("quiz/1", ws.cas.put_bytes(text.encode()), dedup_key(text))
    return benchmarks.add_benchmark_items(ws.catalog, "quiz", [item])


def _built(ws: Workspace, key: str) -> tuple[str, dict, list[str]]:
    """Build and validate ``key``: its snapshotId, manifest and member record ids."""
    sid = build_all(ws, key)["manifest"].digests["snapshotId"]
    report = validate_snapshot(ws, sid)
    assert report.ok, report.findings
    assert report.gate.benchmark_hits == 0 and report.gate.tombstone_hits == 0
    manifest = json.loads(ws.cas.get_bytes(states.get(ws.catalog, sid).manifest_digest))
    table = read_members(ws.cas, manifest["members"])
    return sid, manifest, table.column("record_id").to_pylist()


def test_benchmark_registered_before_the_first_build_binds_it(workspace: Workspace) -> None:
    seq = _register_benchmark(workspace)
    assert seq == 1
    _sid, manifest, members = _built(workspace, "p1")
    assert manifest["benchmarkFence"] == str(seq)
    assert BENCHMARKED not in members
    assert alias_gate.read_alias_gate(workspace.catalog, "demo").benchmark_fence == seq


def test_tombstone_added_before_the_first_build_excludes_the_record(workspace: Workspace) -> None:
    seq = tombstones.add_tombstone(workspace.catalog, "record", REVOKED, "deletion request")
    _sid, manifest, members = _built(workspace, "p1")
    assert manifest["tombstoneWatermark"] == str(seq)
    assert REVOKED not in members
    assert alias_gate.read_alias_gate(workspace.catalog, "demo").tombstone_watermark == seq


def test_registrations_after_a_build_fence_the_next_one(workspace: Workspace) -> None:
    first, manifest, members = _built(workspace, "p1")
    assert (manifest["benchmarkFence"], manifest["tombstoneWatermark"]) == ("0", "0")
    assert {BENCHMARKED, REVOKED} <= set(members)
    approve(workspace, first, by="reviewer")

    fence = _register_benchmark(workspace)
    watermark = tombstones.add_tombstone(workspace.catalog, "record", REVOKED, "erase")
    row = alias_gate.read_alias_gate(workspace.catalog, "demo")
    assert (row.benchmark_fence, row.tombstone_watermark) == (fence, watermark)
    with pytest.raises(
        alias_gate.AliasGateError, match=f"gate is at tombstone {watermark}, benchmark fence"
    ):
        activate(workspace, first, actor="test")

    _second, manifest, members = _built(workspace, "p2")
    assert (manifest["benchmarkFence"], manifest["tombstoneWatermark"]) == (
        str(fence),
        str(watermark),
    )
    assert not {BENCHMARKED, REVOKED} & set(members)


@POSTGRES_IN_SLOW_TIER
def test_cli_benchmark_before_the_first_build(tmp_path: Path, catalog_url: str) -> None:
    """As a new user: demo sources in place, ``benchmark`` the eval set, then ``build``."""
    write_demo(tmp_path / ".corpus")
    env = {"CORPUS_CATALOG_URL": catalog_url}
    bench = tmp_path / "quiz.jsonl"
    bench.write_text(json.dumps({"id": "q1", "text": _demo_text(BENCHMARKED)}) + "\n")
    registered = run(tmp_path, "benchmark", "quiz", str(bench), extra_env=env)
    assert registered.returncode == 0, registered.stderr
    assert registered.stdout == "benchmark quiz: 1 items; benchmark fence now 1\n"

    built = run(tmp_path, "build", extra_env=env)
    assert built.returncode == 0, built.stderr
    assert f"state {states.VALIDATED}" in built.stdout
    sid = output_field(built.stdout, "snapshotId")
    shown = json.loads(run(tmp_path, "show", sid, extra_env=env).stdout)
    assert shown["benchmarkFence"] == "1"
    why = run(tmp_path, "dedup", sid, BENCHMARKED, extra_env=env)
    assert why.returncode == 1 and f"{BENCHMARKED!r} is not in snapshot" in why.stderr
    status = json.loads(run(tmp_path, "status", "--json", extra_env=env).stdout)
    assert status["aliases"][0]["benchmarkFence"] == "1"


def _register(catalog: Catalog, registry: str, n: int) -> int:
    """What ``tombstone add`` or ``benchmark`` runs: revoking a record no build holds, or
    registering an item no record matches."""
    if registry == "tombstone":
        return tombstones.add_tombstone(catalog, "record", f"absent/{n}", "race")
    item = benchmarks.BenchmarkItem(f"q/{n}", "sha256:" + "8" * 64, f"sha256:{n:064}")
    return benchmarks.add_benchmark_items(catalog, "race", [item])


def _fence(row: alias_gate.AliasGate, registry: str) -> int:
    return row.tombstone_watermark if registry == "tombstone" else row.benchmark_fence


def _head(catalog: Catalog, registry: str) -> int:
    table = tombstone_rows if registry == "tombstone" else benchmark_items
    with catalog.begin() as conn:
        return conn.scalar(select(func.max(table.c.seq)))


def _threads(*works: Callable[[], None]) -> list[BaseException]:
    """Run ``works`` at once from one start line; the errors they raised."""
    start, errors = threading.Barrier(len(works)), list[BaseException]()

    def guarded(work: Callable[[], None]) -> None:
        try:
            start.wait(30)
            work()
        except BaseException as error:  # reported by the caller's assertion
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(work,)) for work in works]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return errors


@pytest.mark.parametrize("registry", ["tombstone", "benchmark"])
def test_rows_created_among_registrations_end_at_the_head(catalog_url: str, registry: str) -> None:
    """Aliases created while registrations commit: each row either was fenced by a registration
    or read the head after it, so every alias ends at the last sequence number."""
    catalog = Catalog(catalog_url)

    def register() -> None:
        for n in range(40):
            _register(catalog, registry, n)

    def create() -> None:
        for n in range(40):
            alias_gate.read_alias_gate(catalog, f"alias-{n}")

    errors = _threads(register, create)
    assert not errors, errors
    head = _head(catalog, registry)
    fences = {
        f"alias-{n}": _fence(alias_gate.read_alias_gate(catalog, f"alias-{n}"), registry)
        for n in range(40)
    }
    behind = {alias: fence for alias, fence in fences.items() if fence != head}
    assert head == 40 and not behind, f"aliases left behind head {head}: {behind}"
    catalog.dispose()


@pytest.mark.parametrize("registry", ["tombstone", "benchmark"])
def test_a_row_created_while_a_registration_waits_is_behind_it(
    postgres_url: str, registry: str
) -> None:
    """A registration that has listed the aliases and waits to fence one (an activation holds
    its row) must not miss an alias created meanwhile: the new row waits for it and starts at
    its sequence number. (On SQLite writers are serial, so this interleaving cannot happen.)"""
    catalog = Catalog(postgres_url)
    alias_gate.read_alias_gate(catalog, "busy")
    done: dict[str, object] = {}
    with catalog.engine.connect() as holder, holder.begin():
        holder.execute(select(gate_rows).where(gate_rows.c.alias == "busy").with_for_update())
        registering = threading.Thread(
            target=lambda: done.update(seq=_register(catalog, registry, 1))
        )
        registering.start()
        _wait_for_lock_waiters(catalog, 1)
        creating = threading.Thread(
            target=lambda: done.update(row=alias_gate.read_alias_gate(catalog, "new"))
        )
        creating.start()
        creating.join(2)
        assert creating.is_alive(), "the new row did not wait for the registration"
    registering.join(30)
    creating.join(30)
    assert done["seq"] == 1
    assert _fence(done["row"], registry) == 1  # type: ignore[arg-type]
    assert _fence(alias_gate.read_alias_gate(catalog, "busy"), registry) == 1
    catalog.dispose()


def _wait_for_lock_waiters(catalog: Catalog, count: int) -> None:
    """Until ``count`` sessions of this database wait on a lock (60 s at most: a loaded
    machine may take long to start a thread's transaction; a passing test never waits it)."""
    deadline = time.monotonic() + 60
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    while time.monotonic() < deadline:
        with catalog.begin() as conn:
            if conn.scalar(query) >= count:
                return
        time.sleep(0.02)
    raise AssertionError("the registration never waited on the held gate row")
