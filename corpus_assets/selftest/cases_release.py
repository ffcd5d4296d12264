"""Faults on what a build stored: the manifest edited after signing, the members table
truncated. The stored bytes are tampered with in place, as an attacker or a bad disk would;
``verify`` and ``read`` (CLI processes) must name the damage and refuse it, and the signed
originals must still be there, intact."""

import json

from sqlalchemy import update

from corpus_assets.core.runtime.snapshot_manifest import read_manifest
from corpus_assets.core.storage.catalog import snapshots
from corpus_assets.selftest.case import NO_LOSS, Outcome, fault
from corpus_assets.selftest.evidence import intact, workspace
from corpus_assets.selftest.lab import PARTITION, Home, Lab, Ran


def _refusals(home: Home, sid: str) -> tuple[Ran, Ran]:
    """``verify`` and a training ``read`` of ``sid``, after the tampering."""
    verify = home.cli("verify", sid)
    read = home.cli("read", sid, "--run-id", "selftest-read", "--purpose", "selftest")
    return verify, read


def _observed(verify: Ran, read: Ran) -> str:
    return (
        f"verify exit {verify.code}: {verify.first_failure()}; "
        f"read exit {read.code}: {read.error_line()}"
    )


@fault(
    "001.manifest-edited",
    "001",
    "the manifest edited after signing (re-stored, catalog repointed)",
    "verify names the edit (payload no longer hashes to the snapshotId); read refuses it; "
    "the signed manifest is intact",
    catalog=False,
)
def manifest_edited(lab: Lab) -> Outcome:
    home, built = lab.copy_of_reference("manifest-edited")
    home.publish(built.snapshot_id)  # so only the tampering can stop a read
    with workspace(home) as ws:
        signed = ws.catalog.layer_output(PARTITION, "manifest")
        manifest = json.loads(ws.cas.get_bytes(signed))
        manifest["purpose"] = "edited-after-signing"
        edited = ws.cas.put_bytes(json.dumps(manifest).encode())
        with ws.catalog.begin() as conn:
            conn.execute(
                update(snapshots)
                .where(snapshots.c.snapshot_id == built.snapshot_id)
                .values(manifest_digest=edited)
            )
        verify, read = _refusals(home, built.snapshot_id)
        kept = intact(ws, signed)
    return Outcome(
        observed=_observed(verify, read),
        matched=verify.code == 1 and "payload hashes to" in verify.err and read.code != 0,
        lost=NO_LOSS if kept else f"signed manifest {signed} damaged",
        digests_equal=None,  # no build of its own: it damages the reference's copy
    )


@fault(
    "001.members-truncated",
    "001",
    "the members table truncated in the store (100 bytes cut)",
    "verify names the members table as corrupt; read refuses the snapshot",
    catalog=False,
)
def members_truncated(lab: Lab) -> Outcome:
    home, built = lab.copy_of_reference("members-truncated")
    home.publish(built.snapshot_id)
    with workspace(home) as ws:
        manifest = read_manifest(ws.cas, ws.catalog.layer_output(PARTITION, "manifest"))
        members = manifest.members.part_refs(ws.cas)[0]["digest"]  # its first part
        path = ws.cas.path(members)
        path.chmod(0o644)
        path.write_bytes(path.read_bytes()[:-100])
    verify, read = _refusals(home, built.snapshot_id)
    named = f"manifest.members.parts[0] {members} is corrupt" in verify.err
    return Outcome(
        observed=_observed(verify, read),
        matched=verify.code == 1 and named and read.code != 0,
        lost=NO_LOSS,  # the damage is the fault itself; nothing else was touched
        digests_equal=None,  # no build of its own: it damages the reference's copy
    )
