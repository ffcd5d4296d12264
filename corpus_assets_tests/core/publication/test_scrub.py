"""Scrub re-hashes every byte the aliases can serve and trusts no stat: bit rot beneath the
filesystem (a file whose bytes changed while its recorded stat still matches, which a build's
stat-trusted check and an activation would pass) is found, named, and fails the Dagster job
too. Approval trusts no stat either; activation re-hashes only what moved on disk."""

import pytest
from dagster import ExecuteInProcessResult
from sqlalchemy import update

from corpus_assets.assets.resources import CorpusResource
from corpus_assets.assets.scrub_job import ScrubConfig, scrub_job
from corpus_assets.core.publication.publish import PublishError, activate, approve
from corpus_assets.core.publication.scrub import scrub, servable
from corpus_assets.core.publication.verify import resolve, verify
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.catalog import verified_files
from corpus_assets.core.storage.trust import StatTrust, file_stat
from corpus_assets.selftest.evidence import workspace
from corpus_assets.selftest.lab import Home, Lab


@pytest.fixture
def lab(selftest_lab: Lab) -> Lab:
    return selftest_lab


def _rot_beneath_the_filesystem(ws: Workspace, sid: str) -> str:
    """Flip a byte of the snapshot's largest object and record the new stat as verified, as if
    the disk had changed the bytes under an unchanged inode: stat trust now passes it."""
    digests = verify(ws.cas, ws.catalog, sid).digests
    digest = max(digests, key=lambda d: ws.cas.local_path(d).stat().st_size)
    path = ws.cas.local_path(digest)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    with ws.catalog.begin() as conn:
        conn.execute(
            update(verified_files)
            .where(verified_files.c.digest == digest)
            .values(file_stat=file_stat(path))
        )
    assert StatTrust(ws.cas, ws.catalog).unchanged([digest]) == {digest}  # a build would trust it
    return digest


def test_approval_hashes_every_byte_and_activation_what_moved_on_disk(lab: Lab) -> None:
    """Approval refuses rot beneath the filesystem; activation re-hashes a file written since it
    last hashed right (its stat moved) and trusts the others, so rot beneath them after approval
    is activated - and scrub, which covers APPROVED and ACTIVE snapshots, names it."""
    home, built = lab.copy_of_reference("publish-trust")
    sid = built.snapshot_id
    with workspace(home) as ws:
        rotted = _rot_beneath_the_filesystem(ws, sid)
        with pytest.raises(PublishError, match=rotted):
            approve(ws, sid, by="reviewer")
        _rot_beneath_the_filesystem(ws, sid)  # the same byte flipped back: clean again
        approve(ws, sid, by="reviewer")
        assert scrub(ws.cas, ws.catalog).ok  # and every object's stat recorded
        written = sorted(verify(ws.cas, ws.catalog, sid).digests - {rotted})[0]
        path = ws.cas.local_path(written)
        original = path.read_bytes()
        path.chmod(0o644)
        path.write_bytes(original[:-1] + bytes([original[-1] ^ 0x01]))  # through the filesystem
        with pytest.raises(PublishError, match=written):
            activate(ws, sid, actor="test")
        path.write_bytes(original)  # right bytes, a moved stat: hashed again, and passes
        assert _rot_beneath_the_filesystem(ws, sid) == rotted
        assert activate(ws, sid, actor="test").active_snapshot == sid  # trusted, not re-read
        (served,) = scrub(ws.cas, ws.catalog).snapshots
    assert any(rotted in finding for finding in served.findings), served.findings


def test_scrub_reads_only_servable_snapshots_and_finds_rot_that_stat_trust_passes(
    lab: Lab,
) -> None:
    home, built = lab.copy_of_reference("scrub-core")
    sid = built.snapshot_id
    with workspace(home) as ws:
        assert servable(ws.catalog) == []  # VALIDATED: not yet something an alias can serve
        home.publish(sid)
        clean = scrub(ws.cas, ws.catalog)
        assert [s.snapshot_id for s in clean.snapshots] == [sid] and clean.ok
        assert clean.bytes_hashed > 0
        assert scrub(ws.cas, ws.catalog, alias="no-such-alias").snapshots == []
        digest = _rot_beneath_the_filesystem(ws, sid)
        damaged = scrub(ws.cas, ws.catalog)
    assert not damaged.ok
    (found,) = damaged.snapshots
    assert found.snapshot_id == sid and any(digest in f for f in found.findings), found.findings


def _run_scrub_job(home: Home, alias: str = "") -> ExecuteInProcessResult:
    return scrub_job.execute_in_process(
        run_config={"ops": {"scrub_servable": {"config": ScrubConfig(alias=alias).model_dump()}}},
        resources={"corpus": CorpusResource(config_path=str(home.config))},
        raise_on_error=False,
    )


def test_the_scrub_job_fails_naming_the_damaged_object(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, built = lab.copy_of_reference("scrub-job")
    home.publish(built.snapshot_id)
    monkeypatch.setenv("CORPUS_TRUST_FILE", str(home.trust_file))
    assert _run_scrub_job(home).success
    with workspace(home) as ws:
        digest = _rot_beneath_the_filesystem(ws, built.snapshot_id)
    assert _run_scrub_job(home, alias="no-such-alias").success  # narrowed: nothing to read
    ran = home.cli("scrub")  # the CLI, in its own process
    assert ran.refused_in_one_line(1, "problem(s) in served snapshots", digest), ran.err
    assert "FAIL " in ran.out and built.snapshot_id in ran.out
    result = _run_scrub_job(home)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    description = failure.step_failure_data.user_failure_data.description
    assert built.snapshot_id in description and digest in description, description


def test_the_scrub_schedule_exists_and_is_stopped_until_started() -> None:
    from corpus_assets.definitions import defs

    schedule = defs.resolve_schedule_def("scrub_servable")
    assert schedule.job_name == "scrub_job"
    assert schedule.default_status.value == "STOPPED"


def test_scrub_of_a_missing_object_names_it(lab: Lab) -> None:
    home, built = lab.copy_of_reference("scrub-missing")
    home.publish(built.snapshot_id)
    with workspace(home) as ws:
        digests = verify(ws.cas, ws.catalog, built.snapshot_id).digests
        manifest = resolve(ws.catalog, built.snapshot_id).manifest_digest
        digest = min(digests - {manifest})
        ws.cas.local_path(digest).unlink()
        report = scrub(ws.cas, ws.catalog)
    assert not report.ok and any(digest in f for f in report.snapshots[0].findings)


def test_a_copied_home_trusts_nothing_until_a_scrub_records_what_the_aliases_serve(
    lab: Lab,
) -> None:
    """A home copied or restored from a backup has new inodes and ctimes: no recorded stat
    matches, so a check would re-hash every object; a scrub records them again (OPERATIONS),
    as an activation does for what it re-hashed. Approval (which trusts no stat) records none."""
    home, built = lab.copy_of_reference("scrub-restored")
    sid = built.snapshot_id
    with workspace(home) as ws:
        home.must("approve", sid, "--by", "selftest")  # APPROVED: servable, so scrubbed
        digests = verify(ws.cas, ws.catalog, sid).digests
        assert StatTrust(ws.cas, ws.catalog).unchanged(digests) == set()
        scrub(ws.cas, ws.catalog)
        trusted = StatTrust(ws.cas, ws.catalog).unchanged(digests)
        checked = verify(ws.cas, ws.catalog, sid, trust=StatTrust(ws.cas, ws.catalog))
    assert trusted and checked.ok
    assert checked.objects_trusted == len(trusted) > 0
