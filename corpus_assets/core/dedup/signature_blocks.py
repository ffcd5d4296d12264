"""Signature blocks for the near-dedup stage, opened where they are read.

Apart from :mod:`.signature_cache` (whose code identity keys the cached signature files), so
how the driver opens the files never invalidates the hashed signatures.
"""

from typing import Any

import numpy as np

from corpus_assets.core.dedup.minhash import SignatureSpec, stores_modes
from corpus_assets.core.dedup.signature_cache import (
    BandMajorFile,
    ChunkSignatures,
    file_rows,
    load_modes,
    load_signatures,
)
from corpus_assets.core.runtime.workspace import Workspace, pooled
from corpus_assets.core.storage.trust import StatTrust


class LazySignatures:
    """A chunk's signatures, verified and opened on first use (a ``SignatureBlock``): when
    the band tasks read them on the runner, the driver never hashes the files."""

    def __init__(self, ws: Workspace, item: ChunkSignatures, spec: SignatureSpec) -> None:
        self._open = (ws, item, spec)
        self._block: BandMajorFile | None = None

    def band(self, band: int, rows: int) -> np.ndarray:
        if self._block is None:
            self._block = load_signatures(*self._open)
        return self._block.band(band, rows)


def opened_signatures(
    ws: Workspace, items: list[ChunkSignatures], spec: SignatureSpec, on_runner: bool
) -> tuple[list[Any], np.ndarray | None]:
    """Every chunk's signature block and the records' char-mode flags (:func:`load_modes`).
    ``on_runner``: the blocks open when first used and the flags are read by a task per chunk
    (:func:`chunk_modes`), so the driver reads no signature file it does not band itself."""
    if not on_runner:
        blocks = _trusted(ws, items, spec)
        return blocks, load_modes(blocks, spec)
    lazy = [LazySignatures(ws, item, spec) for item in items]
    if not stores_modes(spec):
        return lazy, None
    flags = pooled(ws, chunk_modes, items, spec)
    return lazy, np.concatenate(flags) if flags else np.zeros(0, dtype=bool)


def _trusted(ws: Workspace, items: list[ChunkSignatures], spec: SignatureSpec) -> list[Any]:
    """Every chunk's signature file, hashed unless unchanged on disk since it last hashed
    right (``StatTrust``, as the canonical chunk files: a child's old chunks' files are not
    read again, ~0.3 CPU-s at 1.1 GB), opened and checked for shape as ``load_signatures``
    checks them."""
    what = {item.digest: f"MinHash signatures of chunk {item.chunk}" for item in items}
    StatTrust(ws.cas, ws.catalog).verify_all(what)
    blocks = []
    for item in items:
        block = BandMajorFile.open(ws.cas.path(item.digest))
        if (block.num_perm, block.records) != (file_rows(spec), item.records):
            raise ValueError(
                f"{what[item.digest]} ({item.digest}) holds {block.num_perm} x "
                f"{block.records} values, expected {file_rows(spec)} x {item.records}"
            )
        blocks.append(block)
    return blocks


def chunk_modes(
    ws: Workspace, item: ChunkSignatures, spec: SignatureSpec, done: object
) -> np.ndarray:
    """One chunk's char-mode flags, from its verified signature file (a task)."""
    return load_signatures(ws, item, spec).row(spec.num_perm).astype(bool)
