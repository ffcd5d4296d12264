"""Signatures are checked on read, against a trust root outside the home.

The attacker here can write the data home (the CAS, the catalog, ``<home>/keys``) but not the
operator's trust file: it re-signs a snapshot's manifest with a key of its own, strips the
signature, or replaces the home's key pair and re-signs, and repoints the catalog at the
re-stored manifest (the snapshotId excludes the signature, so it does not change). ``read`` and
``verify`` (CLI processes) must refuse each, and the signed manifest must still be intact.
"""

import json
import os
import stat
import subprocess
from collections.abc import Callable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from sqlalchemy import update

from corpus_assets.core.governance import states
from corpus_assets.core.publication import trust_root
from corpus_assets.core.publication.signing import PAYLOAD_TYPE, key_paths, statement
from corpus_assets.core.publication.sslib import CryptoSigner, Envelope
from corpus_assets.core.storage.catalog import snapshots
from corpus_assets.core.storage.digests import canonical_json
from corpus_assets.selftest.case import NO_LOSS, Outcome, fault
from corpus_assets.selftest.evidence import intact, workspace
from corpus_assets.selftest.lab import Home, Lab, Ran

READ = ("--run-id", "attack-read", "--purpose", "selftest")


def attacker_envelope(key: Ed25519PrivateKey, snapshot_id: str) -> dict[str, Any]:
    """A well-formed DSSE envelope over the right statement, by a key nobody trusted."""
    envelope = Envelope(canonical_json(statement(snapshot_id)), PAYLOAD_TYPE, {})
    envelope.sign(CryptoSigner(key))
    return envelope.to_dict()


def repoint(home: Home, snapshot_id: str, edit: Callable[[dict[str, Any]], None]) -> str:
    """Re-store the snapshot's manifest edited by ``edit`` and point the catalog at it; the
    digest of the signed original (left in place)."""
    with workspace(home) as ws:
        signed = states.get(ws.catalog, snapshot_id).manifest_digest
        manifest = json.loads(ws.cas.get_bytes(signed))
        edit(manifest)
        stored = ws.cas.put_bytes(canonical_json(manifest))
        with ws.catalog.begin() as conn:
            conn.execute(
                update(snapshots)
                .where(snapshots.c.snapshot_id == snapshot_id)
                .values(manifest_digest=stored)
            )
    return signed


def resign_with_new_key(home: Home, snapshot_id: str) -> str:
    """The manifest re-signed by a fresh key the attacker holds; the signed original's digest."""
    key = Ed25519PrivateKey.generate()
    return repoint(
        home, snapshot_id, lambda m: m.update(signature=attacker_envelope(key, m["snapshotId"]))
    )


def strip_signature(home: Home, snapshot_id: str) -> str:
    """The manifest with its signature removed; the signed original's digest."""
    return repoint(home, snapshot_id, lambda m: m.pop("signature"))


def replace_home_keys(home: Home, snapshot_id: str) -> str:
    """``<home>/keys`` replaced by a new pair, and the manifest re-signed with it."""
    key = Ed25519PrivateKey.generate()
    private, public = key_paths(home.dir / "data")
    private.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    public.write_bytes(
        key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    return repoint(
        home, snapshot_id, lambda m: m.update(signature=attacker_envelope(key, m["snapshotId"]))
    )


def redirect_trust(home: Home, snapshot_id: str) -> str:
    """``corpus.yaml`` (which an attacker of the home can edit when it lives there) pointed at a
    trust file of the attacker's own holding its key, and the manifest re-signed with that key."""
    key = Ed25519PrivateKey.generate()
    pem = key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    forged = home.dir / "attacker-trust.json"
    trust_root.add_key(forged, pem, "the attacker's")
    home.config.write_text(
        home.config.read_text() + f"trust: {{file: {json.dumps(str(forged))}}}\n"
    )
    return repoint(
        home, snapshot_id, lambda m: m.update(signature=attacker_envelope(key, m["snapshotId"]))
    )


def without_trust_env(home: Home, *args: str) -> Ran:
    """A CLI process of ``home`` whose trust root comes from its config, not the environment."""
    env = {k: v for k, v in home.env().items() if k != trust_root.TRUST_ENV}
    done = subprocess.run(
        home.command(*args), env=env, cwd=home.dir, capture_output=True, text=True, timeout=600
    )
    return Ran(args, done.returncode, done.stdout, done.stderr)


def _attacked(lab: Lab, name: str, attack: Callable[[Home, str], str]) -> tuple[Ran, Ran, str]:
    """(verify, read, lost) after ``attack`` on a published copy of the reference."""
    home, built = lab.copy_of_reference(name)
    home.publish(built.snapshot_id)  # so only the attack can stop a read
    signed = attack(home, built.snapshot_id)
    verify = home.cli("verify", built.snapshot_id)
    read = home.cli("read", built.snapshot_id, *READ)
    with workspace(home) as ws:
        lost = NO_LOSS if intact(ws, signed) else f"signed manifest {signed} damaged"
    return verify, read, lost


def _signature_attack(
    lab: Lab, name: str, attack: Callable[[Home, str], str], reason: str
) -> Outcome:
    """``verify`` names ``reason`` and ``read`` refuses in one line naming it; the signed
    manifest is intact. No build of its own: it attacks a copy of the reference."""
    verify, read, lost = _attacked(lab, name, attack)
    return Outcome(
        observed=_observed(verify, read),
        matched=verify.code == 1 and reason in verify.err and read.refused_in_one_line(1, reason),
        lost=lost,
        digests_equal=None,
    )


def _observed(verify: Ran, read: Ran) -> str:
    return (
        f"verify exit {verify.code}: {verify.first_failure()}; "
        f"read exit {read.code}: {read.error_line()}"
    )


@fault(
    "attack.1-read-resigned",
    "031",
    "the manifest re-signed with another key (re-stored, catalog repointed)",
    "read refuses it in one line (manifest signature: unknown key); verify names it; the signed "
    "manifest is intact",
    catalog=False,
)
def read_resigned(lab: Lab) -> Outcome:
    return _signature_attack(lab, "attack-resigned", resign_with_new_key, "unknown key")


@fault(
    "attack.1-read-unsigned",
    "031",
    "the manifest's signature removed (re-stored, catalog repointed)",
    "read refuses it in one line (manifest signature: unsigned); verify names it",
    catalog=False,
)
def read_unsigned(lab: Lab) -> Outcome:
    return _signature_attack(lab, "attack-unsigned", strip_signature, "unsigned")


@fault(
    "attack.2-keys-replaced",
    "031",
    "the home's key pair replaced by a new one and the manifest re-signed with it",
    "verify and read refuse it (unknown key: the trust root outside the home never saw it)",
    catalog=False,
)
def keys_replaced(lab: Lab) -> Outcome:
    return _signature_attack(lab, "attack-keys-replaced", replace_home_keys, "unknown key")


@fault(
    "attack.2-trust-redirected",
    "031",
    "corpus.yaml in the home pointed at the attacker's trust file, the manifest re-signed with "
    "the attacker's key",
    "verify and read refuse it: the catalog pins the alias to its first snapshot's key, and only "
    "`corpus-assets trust add|rotate` adds one",
    catalog=False,
)
def trust_redirected(lab: Lab) -> Outcome:
    home, built = lab.copy_of_reference("attack-trust-redirected")
    home.publish(built.snapshot_id)
    signed = redirect_trust(home, built.snapshot_id)
    verify = without_trust_env(home, "verify", built.snapshot_id)
    read = without_trust_env(home, "read", built.snapshot_id, *READ)
    with workspace(home) as ws:
        lost = NO_LOSS if intact(ws, signed) else f"signed manifest {signed} damaged"
    pinned = "never pinned for alias"
    return Outcome(
        observed=_observed(verify, read),
        matched=verify.code == 1 and pinned in verify.err and read.refused_in_one_line(1, pinned),
        lost=lost,
        digests_equal=None,
    )


@fault(
    "attack.2-private-key-mode",
    "031",
    "a key rotated under umask 000 into a keys folder left world-readable (0755)",
    "the new private key is 0600 and the keys folder 0700; the old snapshot still verifies",
    catalog=False,
)
def private_key_mode(lab: Lab) -> Outcome:
    home, built = lab.copy_of_reference("attack-key-mode")
    folder = key_paths(home.dir / "data")[0].parent
    folder.chmod(0o755)
    old = os.umask(0)
    try:
        rotated = home.cli("trust", "rotate")
    finally:
        os.umask(old)
    private = key_paths(home.dir / "data")[0]
    modes = {
        "key": stat.S_IMODE(private.stat().st_mode),
        "folder": stat.S_IMODE(folder.stat().st_mode),
    }
    verify = home.cli("verify", built.snapshot_id)
    return Outcome(
        observed=f"rotate exit {rotated.code} ({rotated.error_line()}): key {modes['key']:o}, "
        f"folder {modes['folder']:o}; verify of the old snapshot exit {verify.code}",
        matched=rotated.code == 0 and modes == {"key": 0o600, "folder": 0o700},
        lost=NO_LOSS if verify.code == 0 else f"old snapshot no longer verifies: {verify.err}",
        digests_equal=verify.code == 0,
    )
