"""MinHash signatures cached per canonical chunk, so a new snapshot only hashes new records.

A chunk's signatures are a chunk task keyed by the chunk's records-table digest, the
full signature spec and the code identity of this module (its closure holds the minhash modules,
the ``.npy`` layout and the reader of the texts): the same records under the same spec and code
are never hashed twice, whichever snapshot asks, and a crash mid-layer resumes with the chunks
already done. The output is an ``.npy`` file in the CAS holding the uint32 signatures
*band-major* - shape (num_perm, records), one row per permutation - so a band is one contiguous
byte range. From ``minhash.v3`` on one more row follows: each record's shingle mode (1 char,
0 word), which near-dedup needs for the threshold of its script class. It is verified once on
load; banding then reads one band's rows at a time with a plain file read (no memory map whose
pages would stay resident), never holding every signature.

A chunk is hashed a batch of records at a time and its file written in place (each batch's
columns at their band-major offsets), so a worker holds one batch, not the chunk's texts and
three copies of its signatures. A text equal to an earlier one of the chunk is not hashed again:
its columns are copied from the first copy's at the end (signatures are a function of the text).
"""

import hashlib
import io
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from corpus_assets.core.dedup.minhash import (
    SignatureSpec,
    signatures,
    signatures_and_modes,
    spec_payload,
    stores_modes,
)
from corpus_assets.core.records.index import ChunkRecords
from corpus_assets.core.runtime.code_identity import code_identity
from corpus_assets.core.runtime.config import NearDedupPolicy
from corpus_assets.core.runtime.workspace import Workspace, cached_then_pooled
from corpus_assets.core.storage.digests import json_digest
from corpus_assets.core.storage.tasks import ChunkOutcome, ChunkTask, preload, run_chunk

LAYER = "dedup_signatures"
_IDENTITY = code_identity(__name__)  # hashed at import, from the source this process loaded


def file_rows(spec: SignatureSpec) -> int:
    """Rows of a chunk's band-major file: the permutations, then the modes from v3 on."""
    return spec.num_perm + stores_modes(spec)


def signature_spec(policy: NearDedupPolicy) -> SignatureSpec:
    return SignatureSpec(
        version=policy.signature,
        num_perm=policy.num_perm,
        seed=policy.seed,
        shingle_words=policy.shingle_words,
        shingle_chars=policy.shingle_chars,
    )


@dataclass(frozen=True)
class ChunkSignatures:
    chunk: str
    records: int
    digest: str
    hashed: bool  # computed in this run (False: reused from the cache)


def code_version(spec: SignatureSpec) -> str:
    """``<signature version>@<code identity>``: a fix to the hashing, the file layout or the
    text reader hashes again; the records digest in the input covers what the texts are."""
    return f"{spec.version}@{_IDENTITY}"


def _task(chunk_key: str, records_digest: str, spec: SignatureSpec) -> ChunkTask:
    return ChunkTask(
        layer=LAYER,
        chunk_key=chunk_key,
        input_digest=json_digest({"records": records_digest, "spec": spec_payload(spec)}),
        code_version=code_version(spec),
    )


def band_major_npy(signature_rows: np.ndarray) -> bytes:
    """The cache file of (records, num_perm) signatures: a band-major uint32 ``.npy``."""
    sink = io.BytesIO()
    np.save(sink, np.ascontiguousarray(signature_rows.T, dtype="<u4"), allow_pickle=False)
    return sink.getvalue()


@dataclass(frozen=True)
class BandMajorFile:
    """A band-major signature ``.npy`` read one band at a time (a ``SignatureBlock``)."""

    path: Path
    records: int
    num_perm: int
    offset: int

    @classmethod
    def open(cls, path: Path) -> "BandMajorFile":
        with open(path, "rb") as f:
            fmt = np.lib.format
            version = fmt.read_magic(f)
            header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = header(f)
            offset = f.tell()
        if dtype != np.dtype("<u4") or fortran or len(shape) != 2:
            raise ValueError(f"{path}: not a band-major uint32 signature file ({shape} {dtype})")
        return cls(path, shape[1], shape[0], offset)

    def band(self, band: int, rows: int) -> np.ndarray:
        count = rows * self.records
        start = self.offset + band * count * 4
        data = np.fromfile(self.path, dtype="<u4", count=count, offset=start)
        return data.reshape(rows, self.records)

    def row(self, index: int) -> np.ndarray:
        """One whole row (a permutation's values, or the mode row of a v3 file)."""
        start = self.offset + index * self.records * 4
        return np.fromfile(self.path, dtype="<u4", count=self.records, offset=start)


BATCH_ROWS = 4096  # records hashed at a time ...
BATCH_CHARS = 1 << 24  # ... or about this much text (code files can be long)
_READ_ROWS = 256


def write_band_major(
    path: Path, parquet: pq.ParquetFile, records: int, spec: SignatureSpec
) -> None:
    """``band_major_npy(signatures(texts, spec))`` of the file's ``text`` column, at ``path``,
    a batch of records at a time; each distinct text hashed once. A v3 file has one more row,
    the records' shingle modes (:func:`file_rows`)."""
    perms = file_rows(spec)
    with open(path, "w+b") as f:
        header = {"descr": "<u4", "fortran_order": False, "shape": (perms, records)}
        np.lib.format.write_array_header_1_0(f, header)
        offset = f.tell()
        f.truncate(offset + perms * records * 4)
        first: dict[bytes, int] = {}
        copies: list[tuple[int, int]] = []  # (row, row of the text's first copy)
        start, fd = 0, f.fileno()
        for texts in _text_batches(parquet):
            fresh = []
            for i, text in enumerate(texts):
                key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16)
                row = first.setdefault(key.digest(), start + i)
                if row == start + i:
                    fresh.append(i)
                else:
                    copies.append((start + i, row))
            block = np.zeros((perms, len(texts)), dtype="<u4")
            if fresh:
                block[:, fresh] = _hashed([texts[i] for i in fresh], spec)
            for p in range(perms):
                os.pwrite(fd, block[p].tobytes(), offset + (p * records + start) * 4)
            start += len(texts)
        if start != records:
            raise ValueError(f"{path}: {start} texts read, {records} expected")
        _copy_columns(fd, offset, records, perms, copies)
        f.flush()
        os.fsync(fd)


def _hashed(texts: list[str], spec: SignatureSpec) -> np.ndarray:
    """The file's columns of the texts: (file_rows(spec), len(texts)) uint32."""
    if not stores_modes(spec):
        return signatures(texts, spec).T
    sig, modes = signatures_and_modes(texts, spec)
    return np.vstack([sig.T, modes[None, :].astype(np.uint32)])


def _copy_columns(fd: int, offset: int, records: int, perms: int, copies: list) -> None:
    """Each repeated text's column set to its first copy's, one band-major row at a time."""
    if not copies:
        return
    rows, sources = np.array(copies, dtype=np.int64).T
    for p in range(perms):
        at = offset + p * records * 4
        row = np.frombuffer(os.pread(fd, records * 4, at), dtype="<u4").copy()
        row[rows] = row[sources]
        os.pwrite(fd, row.tobytes(), at)


def _text_batches(parquet: pq.ParquetFile) -> Iterator[list[str]]:
    """The texts in batches of at most ``BATCH_ROWS`` rows or about ``BATCH_CHARS``."""
    batch: list[str] = []
    chars = 0
    for part in parquet.iter_batches(_READ_ROWS, columns=["text"], use_threads=False):
        for text in part.column(0).to_pylist():
            batch.append(text)
            chars += len(text)
            if len(batch) >= BATCH_ROWS or chars >= BATCH_CHARS:
                yield batch
                batch, chars = [], 0
    if batch:
        yield batch


def _chunk_task(chunk: ChunkRecords, spec: Any) -> ChunkTask:
    return _task(chunk.key, chunk.records["digest"], spec)


def _compute(ws: Workspace, chunk: ChunkRecords, spec: SignatureSpec, done: Any) -> ChunkOutcome:
    def work() -> str:
        folder = ws.cas.root / "tmp"  # the store's filesystem: adopted by hard link
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=folder, prefix=".sig-")
        os.close(fd)
        try:
            write_band_major(Path(name), chunk.parquet(ws.cas), chunk.count, spec)
            return ws.cas.adopt_file(Path(name))[0]
        finally:
            Path(name).unlink(missing_ok=True)

    task = _chunk_task(chunk, spec)
    return run_chunk(ws.catalog, ws.cas, task, work, done=done)


def ensure_signatures(
    ws: Workspace, items: list[ChunkRecords], spec: SignatureSpec, workers: int
) -> list[ChunkSignatures]:
    """Signatures of every chunk of a canonical index, computing only the missing ones.

    ``workers > 1`` (a spawn pool) or ``execution.engine: ray`` hashes chunks in other processes;
    each chunk's bytes do not depend on where.
    """
    done = preload(ws.catalog, LAYER, code_version(spec))
    outcomes = cached_then_pooled(
        ws, items, spec, _chunk_task, _compute, done, workers, ChunkRecords.stored_bytes
    )
    out = []
    for item, outcome in zip(items, outcomes, strict=True):
        if outcome.output_digest is None:
            raise RuntimeError(f"MinHash signatures of chunk {item.key} failed: {outcome.error}")
        hashed = not outcome.skipped
        out.append(ChunkSignatures(item.key, item.count, outcome.output_digest, hashed))
    return out


def load_signatures(ws: Workspace, item: ChunkSignatures, spec: SignatureSpec) -> BandMajorFile:
    """The chunk's signatures, verified against their digest and checked for shape."""
    what = f"MinHash signatures of chunk {item.chunk}"
    ws.cas.verify(item.digest, what)
    block = BandMajorFile.open(ws.cas.path(item.digest))
    if (block.num_perm, block.records) != (file_rows(spec), item.records):
        raise ValueError(
            f"{what} ({item.digest}) holds {block.num_perm} x {block.records} values, "
            f"expected {file_rows(spec)} x {item.records}"
        )
    return block


def load_modes(blocks: list[BandMajorFile], spec: SignatureSpec) -> np.ndarray | None:
    """Each record's char-mode flag (bool, blocks end to end) from v3 files; None before v3."""
    if not stores_modes(spec):
        return None
    rows = [block.row(spec.num_perm).astype(bool) for block in blocks]
    return np.concatenate(rows) if rows else np.zeros(0, dtype=bool)
