"""Snapshot signatures: a DSSE envelope over an in-toto Statement naming the snapshotId.

The builder signs what it validated (the manifest is signed after the checks); the
signature proves only that the statement comes from the trusted builder key, the set checks in
``verify`` prove the statement true. The signed subject is the snapshotId itself, which already
excludes ``signature``, so the envelope can travel inside the manifest without self-reference.

Keys are Ed25519 (deterministic: the same key and snapshotId give the same envelope bytes, so a
rebuild in the same data home stores the same manifest digest). They live in ``<home>/keys``
(0700, private key 0600), outside the CAS, created on first use; ``CORPUS_SIGNING_KEY`` may name
an existing PEM PKCS#8 private key instead, whose public half is then published in ``<home>/keys``.
Which keys a verifier accepts is not ``<home>/keys`` but the trust root (``trust_root``), outside
the home: a key pair created here, or named by ``CORPUS_SIGNING_KEY``, is recorded there when it
is first used; one found in the home (say, replaced by whoever can write it) is not.
"""

import binascii
import copy
import json
import os
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)

from corpus_assets.core.publication import trust_root
from corpus_assets.core.publication.sslib import (
    CryptoSigner,
    Envelope,
    SSlibKey,
    UnverifiedSignatureError,
    VerificationError,
)
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.digests import DigestError, canonical_json, check_digest, hex_of
from corpus_assets.core.storage.fsio import atomic_create, atomic_write

KEY_ENV = "CORPUS_SIGNING_KEY"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://corpus-assets.dev/training-dataset-snapshot/v1"
SUBJECT_NAME = "training.dataset.snapshot"
PRIVATE_NAME = "snapshot-signing.key.pem"
PUBLIC_NAME = "snapshot-signing.pub.pem"
RETIRED = "retired"  # <home>/keys/retired: private keys rotated out (still 0600)


class SignatureError(RuntimeError):
    """A snapshot signature that is missing, malformed, from an unknown key, bad, or for another
    snapshot; the message starts with the reason."""


def key_paths(home: Path) -> tuple[Path, Path]:
    """(private, public) key files of a data home: ``<home>/keys``, never inside ``<home>/cas``."""
    folder = Path(home) / "keys"
    return folder / PRIVATE_NAME, folder / PUBLIC_NAME


def public_key_of(home: Path) -> Path:
    """The public key file verifiers of this data home trust."""
    return key_paths(home)[1]


def ensure_keypair(home: Path) -> str:
    """Create the home's Ed25519 key pair on first use (or adopt ``CORPUS_SIGNING_KEY``); key id."""
    return _signer(home).public_key.keyid


def sign_snapshot(home: Path, snapshot_id: str) -> dict[str, Any]:
    """DSSE envelope (a JSON-able dict) over the in-toto Statement naming ``snapshot_id``."""
    check_digest(snapshot_id, "snapshotId")
    envelope = Envelope(canonical_json(statement(snapshot_id)), PAYLOAD_TYPE, {})
    envelope.sign(_signer(home))
    return envelope.to_dict()


def statement(snapshot_id: str) -> dict[str, Any]:
    """The in-toto Statement v1 a snapshot signature covers."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": SUBJECT_NAME, "digest": {"sha256": hex_of(snapshot_id)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {"snapshotId": snapshot_id},
    }


def verify_signature(
    envelope: Any,
    snapshot_id: str,
    public_key: Path | None = None,
    home: Path | None = None,
) -> str:
    """Check ``envelope`` is a good signature by a trusted key over ``snapshot_id``; key id.

    Trusted: the key in the ``public_key`` file if given (an independent verifier's choice),
    else every key of the trust root of ``home`` - never the home's own key files. Raises
    ``SignatureError`` (``trust_root.TrustRootError`` for a misplaced or bad trust file).
    """
    if public_key is None:
        if home is None:
            raise ValueError("verify_signature needs public_key or home")
        where, keys = trust_root.accepted(home)
        trusted = f"{where} accepts {', '.join(sorted(keys)) or 'no key'}"
    else:
        key = _load_public(public_key)
        keys, trusted = (
            {key.keyid: key},
            f"the trusted key {key.keyid} ({public_key}) did not sign it",
        )
    if not envelope:
        raise SignatureError(f"unsigned: snapshot {snapshot_id} carries no signature envelope")
    parsed = _parse_envelope(envelope, snapshot_id)
    keyid = next((k for k in parsed.signatures if k in keys), None)
    if keyid is None:
        raise SignatureError(
            f"unknown key: snapshot {snapshot_id} is signed by "
            f"{', '.join(sorted(parsed.signatures))}, {trusted}"
        )
    try:
        keys[keyid].verify_signature(parsed.signatures[keyid], parsed.pae())
    except (UnverifiedSignatureError, VerificationError) as error:
        raise SignatureError(
            f"bad signature: the signature by {keyid} on snapshot {snapshot_id} does not "
            f"verify ({error})"
        ) from None
    _check_statement(parsed.payload, snapshot_id)
    return keyid


def check_alias_key(catalog: Catalog, alias: str, snapshot_id: str, keyid: str) -> None:
    """``keyid`` (which verified ``snapshot_id``) must be one the catalog pins ``alias`` to; an
    alias's first verified snapshot pins its key (trust on first use, recorded in the catalog).
    Raises ``SignatureError``."""
    pinned = trust_root.pinned(catalog, alias)
    if not pinned:
        trust_root.pin(catalog, keyid, f"signed {snapshot_id}, the first verified", [alias])
    elif keyid not in pinned:
        raise SignatureError(
            f"unknown key: snapshot {snapshot_id} is signed by {keyid}, which the trust root "
            f"accepts but the catalog never pinned for alias {alias!r} (it pins "
            f"{', '.join(sorted(pinned))}): a key change goes through `corpus-assets trust "
            "add|rotate`"
        )


def _parse_envelope(envelope: Any, snapshot_id: str) -> Envelope:
    def malformed(why: str) -> SignatureError:
        return SignatureError(f"malformed envelope on snapshot {snapshot_id}: {why}")

    if not isinstance(envelope, dict):
        raise malformed(f"expected a JSON object, got {type(envelope).__name__}")
    missing = [k for k in ("payload", "payloadType", "signatures") if k not in envelope]
    if missing:
        raise malformed(f"missing {', '.join(missing)}")
    if envelope["payloadType"] != PAYLOAD_TYPE:
        raise malformed(f"payloadType {envelope['payloadType']!r}, expected {PAYLOAD_TYPE!r}")
    signatures = envelope["signatures"]
    if not isinstance(envelope["payload"], str):
        raise malformed("payload is not a base64 string")
    if not isinstance(signatures, list) or not signatures:
        raise malformed("signatures is not a non-empty list")
    for n, entry in enumerate(signatures):
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("keyid"), str)
            and isinstance(entry.get("sig"), str)
        ):
            raise malformed(f"signatures[{n}] needs string keyid and sig")
    try:
        # from_dict rewrites the signature dicts in place: give it a copy
        return Envelope.from_dict(copy.deepcopy(envelope))
    except (binascii.Error, ValueError, KeyError, TypeError) as error:
        raise malformed(f"{type(error).__name__}: {error}") from None


def _check_statement(payload: bytes, snapshot_id: str) -> None:
    try:
        signed = json.loads(payload)
        subjects = signed["subject"]
        kinds = (signed["_type"], signed["predicateType"])
        digests = [s["digest"]["sha256"] for s in subjects if s.get("name") == SUBJECT_NAME]
        predicate_id = signed["predicate"]["snapshotId"]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise SignatureError(
            f"malformed envelope on snapshot {snapshot_id}: payload is not an in-toto "
            f"snapshot statement ({type(error).__name__}: {error})"
        ) from None
    if kinds != (STATEMENT_TYPE, PREDICATE_TYPE):
        raise SignatureError(
            f"malformed envelope on snapshot {snapshot_id}: statement types {kinds}, expected "
            f"{(STATEMENT_TYPE, PREDICATE_TYPE)}"
        )
    try:
        expected = hex_of(snapshot_id)
    except DigestError as error:
        raise SignatureError(f"subject mismatch: {error}") from None
    if digests != [expected] or predicate_id != snapshot_id:
        named = ", ".join(f"sha256:{d}" for d in digests) or "nothing"
        raise SignatureError(
            f"subject mismatch: the signed statement names {named} (predicate {predicate_id}), "
            f"not snapshot {snapshot_id}"
        )


def _signer(home: Path) -> CryptoSigner:
    private, public = key_paths(home)
    configured = os.environ.get(KEY_ENV)
    if configured:
        private = Path(configured)
        if not private.is_file():
            raise FileNotFoundError(f"{KEY_ENV}={configured}: no such private key file")
        origin: str | None = f"{KEY_ENV}={configured}"  # the operator named it: trusted
    else:
        _refuse_inside_cas(home, private)
        origin = f"created in {Path(home).resolve() / 'keys'}" if _create(private) else None
    _refuse_inside_cas(home, private)
    key = load_pem_private_key(private.read_bytes(), None)
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError(f"signing key {private} is not an Ed25519 private key")
    signer = CryptoSigner(key)
    pem = _publish_public(public, key)
    if origin is not None:
        trust_root.add_key(trust_root.trust_file(home), pem, origin)
    return signer


def _create(private: Path) -> bool:
    """A new Ed25519 private key at ``private`` (0600, folder 0700) unless one is there; True if
    this call made it."""
    if private.exists():
        return False
    private.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(private.parent, 0o700)  # a folder made by someone else may be wider
    pem = Ed25519PrivateKey.generate().private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )
    # put-if-absent, never replace: two first builds racing must end on one key
    created = atomic_create(private, [pem])
    os.chmod(private, 0o600)
    return created


def rotate_key(home: Path) -> tuple[str, str]:
    """Retire the home's private key (kept, 0600, under ``keys/retired``) and create a new one,
    recorded in the trust root; (old key id, new key id). The old public key stays trusted, so
    the snapshots it signed keep verifying."""
    if os.environ.get(KEY_ENV):
        raise SignatureError(
            f"the signing key is {KEY_ENV}={os.environ[KEY_ENV]}: rotate that file yourself and "
            "record its public key with `corpus-assets trust add`"
        )
    old = ensure_keypair(home)
    private, _public = key_paths(home)
    retired = private.parent / RETIRED
    retired.mkdir(mode=0o700, exist_ok=True)
    os.replace(private, retired / f"{old}.key.pem")
    return old, ensure_keypair(home)


def _publish_public(path: Path, key: Ed25519PrivateKey) -> bytes:
    pem = key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    if path.is_file() and path.read_bytes() == pem:
        return pem
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write(path, pem)
    os.chmod(path, 0o644)
    return pem


def _load_public(path: Path) -> SSlibKey:
    try:
        crypto_key = load_pem_public_key(Path(path).read_bytes())
    except FileNotFoundError:
        raise SignatureError(f"unknown key: no trusted public key at {path}") from None
    except ValueError as error:
        raise SignatureError(f"unknown key: {path} is not a PEM public key ({error})") from None
    try:
        return SSlibKey.from_crypto(crypto_key)
    except ValueError as error:
        raise SignatureError(f"unknown key: {path}: {error}") from None


def _refuse_inside_cas(home: Path, path: Path) -> None:
    cas = (Path(home) / "cas").resolve()
    if path.resolve().is_relative_to(cas):
        raise SignatureError(f"signing key {path} is inside the CAS {cas}: keys live outside it")
