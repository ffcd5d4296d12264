"""The trust root: the public keys a reader accepts, pinned in a file outside the data home.

A signature proves only that a key signed; which keys count must not be decided by the store the
signature vouches for, or whoever can write ``<home>/keys`` can re-sign anything. So readers
(``verify``, ``read``, exports, the loaders) accept exactly the keys of the trust file:

- where: ``$CORPUS_TRUST_FILE``, else ``trust.file`` in ``corpus.yaml`` (relative to its folder),
  else ``$XDG_CONFIG_HOME/corpus-assets/trust.json`` (``~/.config/...``). A trust file inside the
  data home is refused. ``trust.keys`` in ``corpus.yaml`` narrows the accepted set to those ids.
- what enters it: a key pair the builder creates (``signing``) - its public half is recorded in
  the same step, so ``make demo`` needs no extra step -, the key named by ``CORPUS_SIGNING_KEY``
  (the operator named it), and ``corpus-assets trust add|rotate``. A key pair found in a home is
  never trusted for being there: a replaced pair is an ``unknown key``.
- key ids are computed from the public key material on every load, never read from the file.
- entries are only ever added: a rotated-out key keeps verifying the snapshots it signed.

The catalog pins each alias to key ids too (``alias_keys``): its first verified snapshot's key,
then only what ``trust add|rotate`` records. A key the trust file accepts but the alias never
pinned - a config pointed at another trust file, a ``CORPUS_SIGNING_KEY`` swapped - is refused.
"""

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from cryptography.hazmat.primitives.serialization import load_pem_public_key
from pydantic import BaseModel, ConfigDict, ValidationError
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from corpus_assets.core.publication.sslib import SSlibKey
from corpus_assets.core.runtime.config import ConfigError, config_path, load_config
from corpus_assets.core.storage.catalog import Catalog, alias_keys, snapshots
from corpus_assets.core.storage.fsio import atomic_write

TRUST_ENV = "CORPUS_TRUST_FILE"
TRUST_FORMAT = "corpus-assets.trust/1"


class TrustRootError(RuntimeError):
    """The trust file is misplaced, unreadable or holds a key that is not what it claims."""


class TrustedKey(BaseModel):
    """One accepted public key; ``keyid`` is checked against ``public_pem`` on every load."""

    model_config = ConfigDict(extra="forbid")

    keyid: str
    public_pem: str
    origin: str
    added_at: float


class TrustDocument(BaseModel):
    """The trust file's content."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["corpus-assets.trust/1"] = TRUST_FORMAT
    keys: list[TrustedKey] = []


def default_trust_file() -> Path:
    """``$XDG_CONFIG_HOME/corpus-assets/trust.json``, the operator's, like ssh's known_hosts."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "corpus-assets" / "trust.json"


def _configured() -> tuple[Path | None, list[str] | None]:
    """``trust.file`` (resolved) and ``trust.keys`` of the config in use, if there is one."""
    if not config_path().is_file():
        return None, None
    try:
        loaded = load_config()
    except ConfigError:
        return None, None  # the command that needs the config reports it
    trust = loaded.config.trust
    return (loaded.resolve(trust.file) if trust.file else None), trust.keys


def trust_file(home: Path) -> Path:
    """Where the trust root of ``home``'s readers is; refused inside the data home."""
    configured, _keys = _configured()
    env = os.environ.get(TRUST_ENV)
    path = Path(env).expanduser().resolve() if env else configured or default_trust_file()
    path = path.resolve()
    if path.is_relative_to(Path(home).resolve()):
        raise TrustRootError(
            f"trust file {path} is inside the data home {Path(home).resolve()}: the keys a "
            f"reader accepts must be pinned outside what they vouch for (set trust.file or "
            f"{TRUST_ENV} to a file you own elsewhere)"
        )
    return path


def keyid_of(public_pem: bytes) -> str:
    """The key id computed from the public key material (securesystemslib's)."""
    try:
        return SSlibKey.from_crypto(load_pem_public_key(public_pem)).keyid
    except (ValueError, TypeError) as error:
        raise TrustRootError(f"not a PEM Ed25519/ECDSA/RSA public key ({error})") from None


def load(path: Path) -> TrustDocument:
    """The trust file (empty if absent), every key id re-derived from its key."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return TrustDocument()
    except (OSError, UnicodeDecodeError) as error:
        raise TrustRootError(f"trust file {path}: cannot read it ({error})") from None
    try:
        document = TrustDocument.model_validate_json(text)
    except ValidationError as error:
        raise TrustRootError(
            f"trust file {path}: not a {TRUST_FORMAT} document ({error})"
        ) from None
    for entry in document.keys:
        actual = keyid_of(entry.public_pem.encode())
        if actual != entry.keyid:
            raise TrustRootError(
                f"trust file {path}: entry {entry.keyid} holds the public key of {actual}"
            )
    return document


def accepted(home: Path) -> tuple[str, dict[str, SSlibKey]]:
    """(what accepts, for messages: the trust file and any ``trust.keys``; the keys its readers
    accept by key id)."""
    path = trust_file(home)
    _file, only = _configured()
    keys = {
        entry.keyid: SSlibKey.from_crypto(load_pem_public_key(entry.public_pem.encode()))
        for entry in load(path).keys
        if only is None or entry.keyid in only
    }
    narrowed = (
        f" narrowed by trust.keys to {', '.join(only) or 'nothing'}" if only is not None else ""
    )
    return f"the trust root {path}{narrowed}", keys


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One writer of the trust file at a time (builds of several homes may share it)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def add_key(path: Path, public_pem: bytes, origin: str) -> tuple[str, bool]:
    """Record ``public_pem`` in the trust file at ``path``: (its key id, whether it is new)."""
    keyid = keyid_of(public_pem)
    with _locked(path):
        document = load(path)
        if any(entry.keyid == keyid for entry in document.keys):
            return keyid, False
        entry = TrustedKey(
            keyid=keyid, public_pem=public_pem.decode(), origin=origin, added_at=time.time()
        )
        document.keys.append(entry)
        atomic_write(path, document.model_dump_json(indent=2).encode() + b"\n")
        os.chmod(path, 0o644)
    return keyid, True


def pinned(catalog: Catalog, alias: str) -> set[str]:
    """The key ids the catalog pins ``alias`` to (empty until its first verified snapshot)."""
    with catalog.begin() as conn:
        return set(conn.scalars(select(alias_keys.c.keyid).where(alias_keys.c.alias == alias)))


def pin(catalog: Catalog, keyid: str, how: str, aliases: list[str] | None = None) -> list[str]:
    """Record ``keyid`` for ``aliases`` (default: every alias the catalog knows); those that
    did not pin it yet. Called on an alias's first verified snapshot and by ``trust add|rotate``
    only: nothing else widens what an alias's readers accept."""
    with catalog.begin() as conn:
        if aliases is None:
            known = conn.scalars(select(snapshots.c.alias).union(select(alias_keys.c.alias)))
            aliases = sorted(set(known))
        have = set(
            conn.execute(select(alias_keys.c.alias).where(alias_keys.c.keyid == keyid)).scalars()
        )
        new = [alias for alias in aliases if alias not in have]
        for alias in new:
            values = {"alias": alias, "keyid": keyid, "how": how, "at": time.time()}
            try:
                with conn.begin_nested():
                    conn.execute(insert(alias_keys).values(**values))
            except IntegrityError:  # pinned by a concurrent first verification: the same fact
                pass
    return new
