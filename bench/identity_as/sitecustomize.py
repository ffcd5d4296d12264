"""Measure new code against a parent built by other code: give the new tree the old identity.

A child reuses its parent's work (band index, verified pairs, held-out state, packed blocks)
only under the same code identity, so a layer rebuilt by an edited tree starts from scratch and
its figure says nothing about the edit. With this folder first on ``PYTHONPATH`` and
``CORPUS_IDENTITY_AS`` naming another checkout (the one that built the parent), every code
identity and the transform image are computed over that checkout's files instead of this
one's: the edited code runs, but finds the parent's state as the old code would. Benchmarks
only (``bench/race.py --identity-as DIR``); the outputs it writes are keyed as the old code's, so
use it on a scratch data home and compare digests, never publish from it.
"""

import hashlib
import os
from pathlib import Path

AS = os.environ.get("CORPUS_IDENTITY_AS")

if AS:
    from corpus_assets.core.runtime import code_identity, transform

    _own = transform.PACKAGE_ROOT.parent
    _other = Path(AS).resolve()

    def _file_digest(path: Path) -> str:
        """The digest of the other checkout's file at the same relative path, when it has one."""
        try:
            twin = _other / Path(path).resolve().relative_to(_own)
        except ValueError:
            twin = Path(path)
        return hashlib.sha256((twin if twin.is_file() else Path(path)).read_bytes()).hexdigest()

    _image = transform.image_digest

    def _image_digest(package_root: Path) -> str:
        return _image(_other / Path(package_root).resolve().relative_to(_own))

    code_identity._file_digest = _file_digest
    transform.image_digest = _image_digest
