"""Digests written ``sha256:<hex>`` and RFC 8785 canonical JSON, the only hashed JSON form."""

import hashlib
import json
import re
from typing import Any

import rfc8785

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


class DigestError(ValueError):
    """A string that should be a ``sha256:<hex>`` digest is not one."""


PREFIX = "sha256:"


def sha256_digest(data: bytes) -> str:
    return hasher_digest(hashlib.sha256(data))


def hasher_digest(hasher: "hashlib._Hash") -> str:
    """The ``sha256:<hex>`` form of a finished streaming hash (the one place it is spelled)."""
    return PREFIX + hasher.hexdigest()


def canonical_json(payload: Any) -> bytes:
    """RFC 8785 bytes; floats are refused so hashed payloads never depend on float formatting.

    Payloads of strings, integers within 2**53, booleans, None, lists and dicts with ASCII keys
    (every payload this project hashes) serialise identically under the standard library's
    encoder with sorted keys and no escaping of non-ASCII - and some 10x faster than the pure
    Python ``rfc8785`` walk, which remains the path for anything else. ``test_digests`` checks
    the two agree byte for byte.
    """
    if _simple(payload, "$"):
        return _FAST.encode(payload).encode("utf-8")
    return rfc8785.dumps(payload)


def canonical_foreign_json(value: Any, *, plain: bool) -> bytes:
    """RFC 8785 bytes of JSON read from outside, which may hold floats and integers past 2**53.

    ``plain`` is the caller's word (a parser learns it for free) that ``value`` has no floats and
    only ASCII member names; the fast encoder then writes the RFC 8785 bytes. Integers of any size
    are written exactly on both paths instead of being refused.
    """
    if plain:
        return _FAST.encode(value).encode("utf-8")
    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        return _exact_integers(value)


def json_digest(payload: Any) -> str:
    return sha256_digest(canonical_json(payload))


def check_digest(value: str, what: str = "digest") -> str:
    if not isinstance(value, str) or not DIGEST_RE.fullmatch(value):
        raise DigestError(f"{what} {value!r} is not of the form sha256:<64 lowercase hex>")
    return value


def hex_of(digest: str) -> str:
    return check_digest(digest).split(":", 1)[1]


_FAST = json.JSONEncoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"))
_SAFE_INT = 2**53


def _simple(value: Any, path: str) -> bool:
    """Refuse floats (naming the path); True if the fast encoder gives RFC 8785 bytes."""
    if isinstance(value, str):
        return True
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return -_SAFE_INT < value < _SAFE_INT
    if isinstance(value, float):
        raise TypeError(f"float at {path} in a hashed payload; write it as a decimal string")
    if isinstance(value, dict):
        simple = True
        for key, item in value.items():
            simple &= _simple(item, f"{path}.{key}") and isinstance(key, str) and key.isascii()
        return simple
    if isinstance(value, list | tuple):
        simple = True
        for index, item in enumerate(value):
            simple &= _simple(item, f"{path}[{index}]")
        return simple
    return False


def _exact_integers(value: Any) -> bytes:
    """RFC 8785 walk that writes integers beyond 2**53 exactly (``rfc8785`` refuses them)."""
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: kv[0].encode("utf-16-be", "surrogatepass"))
        members = (rfc8785.dumps(k) + b":" + _exact_integers(v) for k, v in items)
        return b"{" + b",".join(members) + b"}"
    if isinstance(value, list):
        return b"[" + b",".join(_exact_integers(item) for item in value) + b"]"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode("ascii")
    return rfc8785.dumps(value)
