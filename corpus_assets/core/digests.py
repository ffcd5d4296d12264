"""Digests written ``sha256:<hex>`` and RFC 8785 canonical JSON, the only hashed JSON form."""

import hashlib
import re
from typing import Any

import rfc8785

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


class DigestError(ValueError):
    """A string that should be a ``sha256:<hex>`` digest is not one."""


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(payload: Any) -> bytes:
    """RFC 8785 bytes; floats are refused so hashed payloads never depend on float formatting."""
    _refuse_floats(payload, "$")
    return rfc8785.dumps(payload)


def json_digest(payload: Any) -> str:
    return sha256_digest(canonical_json(payload))


def check_digest(value: str, what: str = "digest") -> str:
    if not isinstance(value, str) or not DIGEST_RE.fullmatch(value):
        raise DigestError(f"{what} {value!r} is not of the form sha256:<64 lowercase hex>")
    return value


def hex_of(digest: str) -> str:
    return check_digest(digest).split(":", 1)[1]


def _refuse_floats(value: Any, path: str) -> None:
    if isinstance(value, float):
        raise TypeError(f"float at {path} in a hashed payload; write it as a decimal string")
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_floats(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _refuse_floats(item, f"{path}[{index}]")
