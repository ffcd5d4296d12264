"""The transform image: a digest of the code and lock file that built a snapshot, not a tag.

A tag (``corpus-assets/0.1.0``) can be reused for different code; the digest cannot. It covers
every Python file of the package and ``uv.lock`` (when the package runs from a checkout), by
relative path and content, so a manifest names exactly the transform that produced it and a
replay with other code is detected.
"""

import hashlib
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from corpus_assets.core.storage.digests import json_digest

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
NAME = "corpus-assets"


def package_version() -> str:
    try:
        return version(NAME)
    except PackageNotFoundError:  # running from a plain source tree
        return "0+unknown"


def image_digest(package_root: Path) -> str:
    """sha256 over (relative path, sha256) of the package's .py files and the adjacent uv.lock."""
    files = sorted(package_root.rglob("*.py"))
    lock = package_root.parent / "uv.lock"
    entries = [
        [
            path.relative_to(package_root.parent).as_posix(),
            hashlib.sha256(path.read_bytes()).hexdigest(),
        ]
        for path in [*files, *([lock] if lock.is_file() else [])]
    ]
    return json_digest(entries)


@cache
def transform_image(package_root: Path = PACKAGE_ROOT) -> str:
    """``corpus-assets/<version>@sha256:<hex>``, the form of the seed's ``transformImage``."""
    return f"{NAME}/{package_version()}@{image_digest(package_root)}"
