"""gc under ``retention: {keep_generations: 1}``, through the real CLI on
SQLite and PostgreSQL: an activated snapshot older than the kept generations is marked EXPIRED in
the catalog before any of its objects is deleted (a gc killed in between leaves it EXPIRED with
its objects still there, and the rerun removes them); ``status`` and ``history`` show it, and
``rollback``, ``approve`` and ``activate`` to it are refused naming the state. What the alias
serves keeps every object and still verifies."""

import json
from pathlib import Path

import pytest
from sqlalchemy import insert

from corpus_assets.core.governance import states
from corpus_assets.core.publication.gc import GcError, Plan, expire
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog, gate, snapshots
from corpus_assets.selftest.lab import Home, Lab
from corpus_assets_tests.conftest import PG_URL

KILL_POINT = "gc/expired"


@pytest.fixture(params=["sqlite", "postgres"])
def lab(request: pytest.FixtureRequest, tmp_path: Path) -> Lab:
    made = Lab(tmp_path, PG_URL if request.param == "postgres" else None)
    yield made
    made.close(keep=True)


def _two_generations(lab: Lab) -> tuple[Home, str, str]:
    """A home whose alias activated p1 then p2, with ``keep_generations: 1``."""
    home, first = lab.copy_of_reference("expire")
    home.publish(first.snapshot_id)
    second = home.build("--partition", "p2")
    home.publish(second.snapshot_id)
    with home.config.open("a") as config:
        config.write("retention: {keep_generations: 1}\n")
    return home, first.snapshot_id, second.snapshot_id


def _states(home: Home) -> dict[str, str]:
    ran = home.must("status", "--json")
    return {s["snapshotId"]: s["state"] for s in json.loads(ran.out)["snapshots"]}


def test_gc_expires_an_old_generation_before_deleting_and_refuses_going_back(
    lab: Lab, tmp_path: Path
) -> None:
    home, old, served = _two_generations(lab)
    cas = ContentStore(home.dir / "data" / "cas")
    assert _states(home) == {old: "ACTIVE", served: "ACTIVE"}
    planned = json.loads(home.must("gc", "--dry-run", "--json").out)
    assert planned["dropped_snapshots"] == [old]
    assert _states(home)[old] == "ACTIVE"  # a dry run changes nothing
    garbage = {o["digest"] for o in planned["objects"]}
    assert garbage and all(cas.contains(d) for d in garbage)

    points = tmp_path / "points"
    points.mkdir()
    env = {"CORPUS_FAILPOINTS": f"{KILL_POINT}=kill@1", "CORPUS_FAILPOINT_DIR": str(points)}
    killed = home.start("gc", env=env)
    killed.communicate(timeout=300)
    assert killed.returncode != 0  # killed between marking and deleting
    assert _states(home) == {old: "EXPIRED", served: "ACTIVE"}
    assert all(cas.contains(d) for d in garbage)  # marked first, nothing deleted yet

    rerun = json.loads(home.must("gc", "--json").out)
    assert {o["digest"] for o in rerun["objects"]} == garbage
    assert not any(cas.contains(d) for d in garbage)
    assert _states(home) == {old: "EXPIRED", served: "ACTIVE"}
    assert json.loads(home.must("gc", "--dry-run", "--json").out)["objects"] == []

    status = home.must("status").out
    assert f"EXPIRED    {old}" in status and "removed by gc" in status
    moves = json.loads(home.must("history", "train", "--json").out)["moves"]
    expired = [m for m in moves if m["snapshot_id"] == old and m["to_state"] == "EXPIRED"]
    assert len(expired) == 1 and expired[0]["from_state"] == "ACTIVE", moves
    for command in (["rollback", old], ["approve", old, "--by", "x"], ["activate", old]):
        ran = home.cli(*command)
        assert ran.code == 1, (command, ran.out, ran.err)
        assert "EXPIRED" in ran.err and "Traceback" not in ran.err, (command, ran.err)
        assert "missing" not in ran.err, (command, ran.err)
    ran = home.cli("verify", served)
    assert ran.code == 0, ran.out + ran.err


def _register(catalog: Catalog, sid: str, state: str, at: float) -> None:
    with catalog.begin() as conn:
        conn.execute(
            insert(snapshots).values(
                snapshot_id=sid,
                partition_key=sid,
                manifest_digest="sha256:" + "0" * 64,
                alias="train",
                state=state,
                created_at=at,
                updated_at=at,
            )
        )


def test_expire_refuses_a_snapshot_rolled_back_to_after_the_plan(catalog_url: str) -> None:
    """A rollback that commits between gc's plan and its expiry wins: gc marks nothing and
    removes nothing (its transaction re-reads every alias's gate before committing)."""
    catalog = Catalog(catalog_url)
    _register(catalog, "old", states.ACTIVE, 1)
    _register(catalog, "gone", states.SUPERSEDED, 2)
    planned = Plan(retained=["new"], dropped=["gone", "old"])
    with catalog.begin() as conn:  # the rollback, committed after the plan
        conn.execute(
            insert(gate).values(
                alias="train",
                tombstone_watermark=0,
                benchmark_fence=0,
                generation=3,
                active_snapshot="old",
                updated_at=3,
            )
        )
    with pytest.raises(GcError, match="old was served or permitted"):
        expire(catalog, planned)
    assert [states.get(catalog, s).state for s in ("gone", "old")] == ["SUPERSEDED", "ACTIVE"]
    planned.dropped = ["gone"]
    expire(catalog, planned)
    assert states.get(catalog, "gone").state == states.EXPIRED
    assert states.history(catalog, "gone")[-1].actor == "gc"
    catalog.dispose()
