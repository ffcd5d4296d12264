"""The snapshotId rule, in one place for the builder and every verifier.

snapshotId = sha256 of the RFC 8785 payload with ``snapshotId`` and ``signature`` removed, so a
manifest can carry its own id (and a signature over it) without referring to itself.
"""

from typing import Any

from corpus_assets.core.storage.digests import json_digest

SELF_EXCLUDED = ("snapshotId", "signature")


def snapshot_id(manifest: dict[str, Any]) -> str:
    """The id a manifest names itself by (see the module docstring for why these fields)."""
    return json_digest({k: v for k, v in manifest.items() if k not in SELF_EXCLUDED})
