"""Exact Jaccards of row pairs from their shingle-fingerprint sets, with a window of sets in
memory: the sets are made in ascending windows of rows, spilled to a temporary file as they are
made, and read back one at a time by index (the held-out search's verification)."""

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from corpus_assets.core.dedup.jaccard import jaccard_sorted, sorted_unique


def pair_jaccards(
    a: np.ndarray,
    b: np.ndarray,
    fingerprints: Callable[[np.ndarray], list[np.ndarray]],
    spill: Path | None = None,
) -> tuple[np.ndarray, int]:
    """The exact Jaccard of each pair of rows, and how many records were fingerprinted. The
    sets are spilled as they are made (:class:`SpilledPrints`) and read back a pair at a time,
    in held-out row order so each held-out set is read once: memory holds a window of sets,
    not every record's (110 MB of them at 1.1 GB of raw text, and the heap they fragmented)."""
    if not len(a):
        return np.empty(0, dtype=np.float64), 0
    involved = sorted_unique(np.concatenate([a, b]))
    at_a, at_b = np.searchsorted(involved, a), np.searchsorted(involved, b)
    out = np.empty(len(a), dtype=np.float64)
    with SpilledPrints(fingerprints, involved, spill) as prints:
        last, held = -1, np.empty(0, dtype="<u8")
        for i in np.lexsort((at_b, at_a)).tolist():
            x = int(at_a[i])
            if x != last:
                last, held = x, prints.get(x)
            out[i] = jaccard_sorted(held, prints.get(int(at_b[i])))
    return out, len(involved)


class SpilledPrints:
    """Fingerprint sets of ascending rows, made ``WINDOW`` rows at a time and written to a
    temporary file, then read back one set at a time by its index."""

    WINDOW = 1024

    def __init__(
        self,
        fingerprints: Callable[[np.ndarray], list[np.ndarray]],
        rows: np.ndarray,
        folder: Path | None,
    ) -> None:
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
        self.file = tempfile.TemporaryFile(dir=folder)  # noqa: SIM115 (closed by __exit__)
        sizes = np.zeros(len(rows), dtype=np.int64)
        for lo in range(0, len(rows), self.WINDOW):
            for n, found in enumerate(fingerprints(rows[lo : lo + self.WINDOW]), start=lo):
                data = np.ascontiguousarray(found, dtype="<u8")
                sizes[n] = len(data)
                self.file.write(data.tobytes())
        self.file.flush()
        self.offsets = np.concatenate([[0], np.cumsum(sizes)])

    def get(self, index: int) -> np.ndarray:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        data = os.pread(self.file.fileno(), (end - start) * 8, start * 8)
        return np.frombuffer(data, dtype="<u8")

    def __enter__(self) -> "SpilledPrints":
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()
