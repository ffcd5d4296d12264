"""Texts and shingle fingerprints of canonical records, fetched for near-dedup verification.

Verification needs the exact shingle sets of the records that share an LSH bucket, in scan
order, without holding every text or every set: texts are read one canonical chunk at a time,
fingerprints are computed once and spilled to a temporary file, and read back per record.
"""

import os
import tempfile
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from corpus_assets.core.dedup.class_rows import RankLookup
from corpus_assets.core.dedup.minhash import fingerprints
from corpus_assets.core.dedup.order import sorted_hits
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.cas_queries import streamed
from corpus_assets.core.storage.memory import release_memory
from corpus_assets.core.storage.table_lookup import rows_at


class TextLookup:
    """Texts of records by global row index, for ascending requests: each chunk file is read
    once, front to back, a page and a batch of rows at a time (its text column can be one
    large row group), and only the texts asked for become Python strings."""

    BATCH_ROWS = 256

    def __init__(self, ws: Workspace, chunks: list[ChunkRecords], verified: bool = False) -> None:
        """``verified``: the caller checked every chunk file against its digest in this run
        (the dedup layer's DuckDB reader does), so a class's pass need not hash them again."""
        self.ws = ws
        self.chunks = chunks
        self.verified = verified
        self.starts = np.cumsum([0, *(c.count for c in chunks)])
        self._reader: Any = None
        self._at = (-1, 0)  # (chunk, first row of the current batch within it)
        self._batch: pa.Array | None = None

    def _open(self, c: int) -> None:
        self._reader, self._batch = None, None
        digest = self.chunks[c].records["digest"]
        if not self.verified:
            self.ws.cas.verify(digest, self.chunks[c].what)
        self._reader = streamed(self.ws.cas.path(digest), self.BATCH_ROWS, ["text"])
        self._at, self._batch = (c, 0), pa.array([], pa.string())

    def _texts(self, c: int, local: np.ndarray) -> list[str]:
        """Texts of ascending rows of chunk ``c``; only those become Python strings."""
        chunk, first = self._at
        if chunk != c or local[0] < first:
            self._open(c)
        out: list[str] = []
        done = 0
        while done < len(local):
            chunk, first = self._at
            end = first + len(self._batch)
            if local[done] >= end:
                self._batch = next(self._reader).column(0)
                self._at = (c, end)
                continue
            upto = done + int(np.searchsorted(local[done:], end))
            out += self._batch.take(pa.array(local[done:upto] - first)).to_pylist()
            done = upto
        return out

    def get(self, rows: np.ndarray) -> list[str]:
        """Texts of ascending global rows."""
        rows = np.asarray(rows, dtype=np.int64)
        chunk_of = np.searchsorted(self.starts, rows, side="right") - 1
        bounds = np.flatnonzero(np.r_[True, chunk_of[1:] != chunk_of[:-1], True]).tolist()
        out: list[str] = []
        for lo, hi in pairwise(bounds if len(rows) else []):
            c = int(chunk_of[lo])
            out += self._texts(c, rows[lo:hi] - self.starts[c])
        return out

    def release(self) -> None:
        self._reader, self._at, self._batch = None, (-1, 0), None
        release_memory(collect=True)  # once per class: its texts are all garbage now


class SpilledFingerprints:
    """Shingle fingerprints of the records near-dedup asks for, computed in one ascending pass
    over the texts (each chunk read once) and spilled to a temporary file; the scan then reads
    each record's sorted uint64 set back with one ``pread``. Memory holds one chunk of text and
    one batch of fingerprints, not every record that collided."""

    BATCH = 4096  # records fingerprinted together at most
    BATCH_CHARS = 1 << 23  # ... and about this much text (code files can be long)
    FETCH = 256  # texts asked for at a time

    def __init__(self, texts: TextLookup, spec: Any, order: RankLookup, tmp: Path) -> None:
        self.texts, self.spec, self.order, self.tmp = texts, spec, order, tmp
        self.rows = np.empty(0, dtype=np.int64)
        self.offsets = np.zeros(1, dtype=np.int64)
        self.file: Any = None

    def prefetch(self, ranks: np.ndarray) -> None:
        self.close()
        release_memory()  # banding's freed arrays, before the texts and fingerprints come in
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.file = tempfile.TemporaryFile(dir=self.tmp)  # noqa: SIM115 - closed by close()
        self.rows = np.sort(self.order[ranks])
        sizes = np.zeros(len(self.rows), dtype=np.int64)
        batch: list[str] = []
        done = chars = 0
        for start in range(0, len(self.rows), self.FETCH):
            for text in self.texts.get(self.rows[start : start + self.FETCH]):
                batch.append(text)
                chars += len(text)
                if len(batch) >= self.BATCH or chars >= self.BATCH_CHARS:
                    done = self._spill(batch, sizes, done)
                    batch, chars = [], 0
        self._spill(batch, sizes, done)
        self.texts.release()
        self.file.flush()
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])

    def _spill(self, texts: list[str], sizes: np.ndarray, done: int) -> int:
        """Fingerprint a batch of texts, append them to the file; the next record's index."""
        for f in fingerprints(texts, self.spec) if texts else []:
            sizes[done] = len(f)
            self.file.write(np.ascontiguousarray(f, "<u8").tobytes())
            done += 1
        return done

    def __call__(self, ranks: np.ndarray) -> list[np.ndarray]:
        """The records' fingerprints: prefetched ones read back, any other computed now."""
        rows = self.order[ranks]
        at, spilled = sorted_hits(self.rows, rows)
        fd = self.file.fileno() if self.file is not None else -1
        out = []
        for i, row, found in zip(at.tolist(), rows.tolist(), spilled.tolist(), strict=True):
            if not found:
                out.append(self._computed(row))
                continue
            start, end = int(self.offsets[i]), int(self.offsets[i + 1])
            out.append(np.frombuffer(os.pread(fd, (end - start) * 8, start * 8), dtype="<u8"))
        return out

    def _computed(self, row: int) -> np.ndarray:
        """One record not prefetched (a child's old pair the parent never verified)."""
        (text,) = self.texts.get(np.array([row], dtype=np.int64))
        return np.ascontiguousarray(fingerprints([text], self.spec)[0], "<u8")

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def text_digests(
    ws: Workspace, chunks: Sequence[ChunkRecords], rows: np.ndarray
) -> pa.ChunkedArray:
    """``text_digest`` of ascending global rows of ``chunks``, each chunk's column read only
    for the row groups holding one (``rows_at``); the caller checked the chunk files. The one
    reader for near-dedup's verify tasks and the held-out search."""
    starts = np.cumsum([0, *(c.count for c in chunks)])
    cut = np.searchsorted(rows, starts)
    parts = [pa.array([], pa.string())]
    for i, chunk in enumerate(chunks):
        local = rows[cut[i] : cut[i + 1]] - starts[i]
        if len(local):
            parts += rows_at(str(ws.cas.path(chunk.records["digest"])), "text_digest", local).chunks
    return pa.chunked_array(parts, pa.string())
