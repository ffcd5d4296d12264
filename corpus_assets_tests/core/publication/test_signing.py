"""Snapshot signatures: DSSE over an in-toto Statement, refused with the reason named."""

import base64
import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)
from securesystemslib.dsse import Envelope
from securesystemslib.signer import CryptoSigner

from corpus_assets.core.publication.signing import (
    KEY_ENV,
    PAYLOAD_TYPE,
    SignatureError,
    ensure_keypair,
    key_paths,
    public_key_of,
    sign_snapshot,
    statement,
    verify_signature,
)
from corpus_assets.core.publication.trust_root import load, trust_file
from corpus_assets.core.storage.digests import canonical_json

SID = "sha256:" + "5a" * 32
OTHER = "sha256:" + "c3" * 32


@pytest.fixture(autouse=True)
def _no_configured_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


def test_round_trip_names_the_key_and_the_statement(tmp_path: Path) -> None:
    home = tmp_path / "home"
    envelope = sign_snapshot(home, SID)
    keyid = ensure_keypair(home)
    assert verify_signature(envelope, SID, home=home) == keyid
    assert verify_signature(envelope, SID, public_key=public_key_of(home)) == keyid
    assert envelope["payloadType"] == PAYLOAD_TYPE
    assert [s["keyid"] for s in envelope["signatures"]] == [keyid]
    signed = json.loads(base64.b64decode(envelope["payload"]))
    assert signed == statement(SID)
    assert signed["subject"] == [
        {"name": "training.dataset.snapshot", "digest": {"sha256": SID.split(":")[1]}}
    ]
    json.dumps(envelope)  # JSON-able as it is


def test_same_key_and_snapshot_give_the_same_envelope_bytes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = canonical_json(sign_snapshot(home, SID))
    assert canonical_json(sign_snapshot(home, SID)) == first
    assert canonical_json(sign_snapshot(home, OTHER)) != first


def test_private_key_is_0600_outside_the_cas_and_created_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    keyid = ensure_keypair(home)
    private, public = key_paths(home)
    assert private.is_file() and public == public_key_of(home) and public.is_file()
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(private.parent).st_mode) == 0o700
    assert not private.resolve().is_relative_to((home / "cas").resolve())
    assert not public.resolve().is_relative_to((home / "cas").resolve())
    before = private.read_bytes()
    assert ensure_keypair(home) == keyid
    assert private.read_bytes() == before
    assert [p.name for p in private.parent.iterdir() if p.name.startswith(".")] == []


def test_a_flipped_signature_byte_is_a_bad_signature(tmp_path: Path) -> None:
    envelope = sign_snapshot(tmp_path, SID)
    raw = bytearray(base64.b64decode(envelope["signatures"][0]["sig"]))
    for position in (0, len(raw) // 2, len(raw) - 1):
        flipped = bytearray(raw)
        flipped[position] ^= 0x01
        envelope["signatures"][0]["sig"] = base64.b64encode(bytes(flipped)).decode()
        with pytest.raises(SignatureError, match=r"^bad signature"):
            verify_signature(envelope, SID, home=tmp_path)


def test_a_tampered_payload_is_a_bad_signature(tmp_path: Path) -> None:
    envelope = sign_snapshot(tmp_path, SID)
    envelope["payload"] = base64.b64encode(canonical_json(statement(OTHER))).decode()
    with pytest.raises(SignatureError, match=r"^bad signature"):
        verify_signature(envelope, OTHER, home=tmp_path)


def test_a_key_the_trust_root_never_saw_is_unknown(tmp_path: Path) -> None:
    """The home's key files do not decide: a pair put in ``<home>/keys`` by hand (not created by
    the builder, not named by CORPUS_SIGNING_KEY, not added with ``trust add``) is unknown."""
    home = tmp_path / "home"
    private, public = key_paths(home)
    private.parent.mkdir(parents=True)
    key = Ed25519PrivateKey.generate()
    private.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    envelope = sign_snapshot(home, SID)  # signs with the planted key, which stays untrusted
    with pytest.raises(SignatureError, match=r"^unknown key") as raised:
        verify_signature(envelope, SID, home=home)
    assert envelope["signatures"][0]["keyid"] in str(raised.value)
    assert str(trust_file(home)) in str(raised.value)
    assert verify_signature(envelope, SID, public_key=public) == ensure_keypair(home)
    with pytest.raises(SignatureError, match=r"^unknown key: no trusted public key"):
        verify_signature(envelope, SID, public_key=tmp_path / "nowhere.pem")


def test_a_created_key_is_recorded_in_the_trust_file_outside_the_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    keyid = ensure_keypair(home)
    path = trust_file(home)
    assert not path.is_relative_to(home.resolve())
    assert [entry.keyid for entry in load(path).keys if entry.keyid == keyid] == [keyid]
    assert verify_signature(sign_snapshot(home, SID), SID, home=home) == keyid


def test_a_loose_keys_folder_is_tightened_when_the_key_is_created(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "keys").mkdir(parents=True, mode=0o755)
    (home / "keys").chmod(0o755)
    old = os.umask(0)
    try:
        ensure_keypair(home)
    finally:
        os.umask(old)
    private, _public = key_paths(home)
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(private.parent).st_mode) == 0o700


def test_a_statement_about_another_snapshot_is_a_subject_mismatch(tmp_path: Path) -> None:
    envelope = sign_snapshot(tmp_path, OTHER)  # validly signed, but for another snapshot
    with pytest.raises(SignatureError, match=r"^subject mismatch") as raised:
        verify_signature(envelope, SID, home=tmp_path)
    assert OTHER in str(raised.value) and SID in str(raised.value)


@pytest.mark.parametrize("envelope", [None, {}])
def test_a_missing_envelope_is_unsigned(tmp_path: Path, envelope: object) -> None:
    ensure_keypair(tmp_path)
    with pytest.raises(SignatureError, match=r"^unsigned"):
        verify_signature(envelope, SID, home=tmp_path)


@pytest.mark.parametrize(
    "damage",
    [
        lambda e: "not an envelope",
        lambda e: {k: v for k, v in e.items() if k != "payload"},
        lambda e: {**e, "payloadType": "text/plain"},
        lambda e: {**e, "signatures": []},
        lambda e: {**e, "signatures": [{"keyid": e["signatures"][0]["keyid"]}]},
        lambda e: {**e, "signatures": [{**e["signatures"][0], "sig": "***"}]},
        lambda e: {**e, "payload": "%%% not base64 %%%"},
        lambda e: {**e, "signatures": e["signatures"] * 2},
    ],
    ids=[
        "not-a-dict",
        "no-payload",
        "payload-type",
        "no-signatures",
        "no-sig",
        "sig-not-base64",
        "payload-not-base64",
        "duplicate-keyid",
    ],
)
def test_a_malformed_envelope_is_named(tmp_path: Path, damage) -> None:
    envelope = sign_snapshot(tmp_path, SID)
    kept = json.dumps(envelope)
    with pytest.raises(SignatureError, match=r"^malformed envelope"):
        verify_signature(damage(envelope), SID, home=tmp_path)
    assert json.dumps(envelope) == kept  # verification never rewrites its input


def test_a_signed_payload_that_is_no_statement_is_malformed(tmp_path: Path) -> None:
    sign_snapshot(tmp_path, SID)
    key = load_pem_private_key(key_paths(tmp_path)[0].read_bytes(), None)
    envelope = Envelope(b"[1, 2, 3]", PAYLOAD_TYPE, {})
    envelope.sign(CryptoSigner(key))
    with pytest.raises(SignatureError, match=r"^malformed envelope.*in-toto"):
        verify_signature(envelope.to_dict(), SID, home=tmp_path)


def test_configured_private_key_is_used_and_its_public_half_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pem = Ed25519PrivateKey.generate().private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )
    configured = tmp_path / "vault" / "builder.pem"
    configured.parent.mkdir()
    configured.write_bytes(pem)
    monkeypatch.setenv(KEY_ENV, str(configured))
    home = tmp_path / "home"
    keyid = ensure_keypair(home)
    envelope = sign_snapshot(home, SID)
    assert not key_paths(home)[0].exists()  # no second private key was made
    assert verify_signature(envelope, SID, home=home) == keyid
    monkeypatch.setenv(KEY_ENV, str(tmp_path / "vault" / "missing.pem"))
    with pytest.raises(FileNotFoundError, match=r"missing.pem"):
        ensure_keypair(home)


def test_a_key_inside_the_cas_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inside = tmp_path / "cas" / "key.pem"
    inside.parent.mkdir()
    inside.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        )
    )
    monkeypatch.setenv(KEY_ENV, str(inside))
    with pytest.raises(SignatureError, match="inside the CAS"):
        ensure_keypair(tmp_path)
