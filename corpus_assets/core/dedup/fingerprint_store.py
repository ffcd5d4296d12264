"""Texts and shingle fingerprints of canonical records, fetched for near-dedup verification.

Verification needs the exact shingle sets of the records that share an LSH bucket, in scan
order, without holding every text or every set: texts are read one canonical chunk at a time,
fingerprints are computed once and spilled to a temporary file, and read back per record.
"""

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from corpus_assets.core.dedup.minhash import fingerprints
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.workspace import Workspace


class TextLookup:
    """Texts of records by global row index, read chunk by chunk (the last chunk is kept, so
    ascending requests read each chunk once)."""

    def __init__(self, ws: Workspace, chunks: list[ChunkRecords]) -> None:
        self.ws = ws
        self.chunks = chunks
        self.starts = np.cumsum([0, *(c.count for c in chunks)])
        self._last: tuple[int, list[str]] = (-1, [])

    def _chunk(self, c: int) -> list[str]:
        if self._last[0] != c:
            self._last = (-1, [])  # let the previous chunk go before reading the next
            self._last = (c, self.chunks[c].texts(self.ws.cas))
        return self._last[1]

    def get(self, rows: np.ndarray) -> list[str]:
        rows = np.asarray(rows, dtype=np.int64)
        chunk_of = np.searchsorted(self.starts, rows, side="right") - 1
        out: list[str] = [""] * len(rows)
        for c in np.unique(chunk_of).tolist():
            texts = self._chunk(c)
            for k in np.flatnonzero(chunk_of == c).tolist():
                out[k] = texts[int(rows[k] - self.starts[c])]
        return out

    def release(self) -> None:
        self._last = (-1, [])


class SpilledFingerprints:
    """Shingle fingerprints of the records near-dedup asks for, computed in one ascending pass
    over the texts (each chunk read once) and spilled to a temporary file; the scan then reads
    each record's sorted uint64 set back with one ``pread``. Memory holds one chunk of text and
    one batch of fingerprints, not every record that collided."""

    BATCH = 4096

    def __init__(self, texts: TextLookup, spec: Any, order: np.ndarray, tmp: Path) -> None:
        self.texts, self.spec, self.order, self.tmp = texts, spec, order, tmp
        self.rows = np.empty(0, dtype=np.int64)
        self.offsets = np.zeros(1, dtype=np.int64)
        self.file: Any = None

    def prefetch(self, ranks: np.ndarray) -> None:
        self.close()
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.file = tempfile.TemporaryFile(dir=self.tmp)  # noqa: SIM115 - closed by close()
        self.rows = np.sort(self.order[ranks])
        sizes = []
        for start in range(0, len(self.rows), self.BATCH):
            batch = fingerprints(self.texts.get(self.rows[start : start + self.BATCH]), self.spec)
            sizes += [len(f) for f in batch]
            self.file.write(b"".join(np.ascontiguousarray(f, "<u8").tobytes() for f in batch))
        self.texts.release()
        self.file.flush()
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])

    def __call__(self, ranks: np.ndarray) -> list[np.ndarray]:
        at = np.searchsorted(self.rows, self.order[ranks])
        fd, out = self.file.fileno(), []
        for i in at.tolist():
            start, end = int(self.offsets[i]), int(self.offsets[i + 1])
            out.append(np.frombuffer(os.pread(fd, (end - start) * 8, start * 8), dtype="<u8"))
        return out

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
