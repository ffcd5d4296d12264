"""A one-dimensional ``.npy`` written batch by batch into the CAS, never held whole in memory.

The length is known only at the end (a tokenizer decides it), so the file starts with the header
of an empty array and the real header overwrites it when the stream closes: a 1-D ``.npy``
header has the same size whatever its length (numpy pads the shape field for growth), which
``close`` checks. The finished file is fsynced and hard-linked into the CAS
(``ContentStore.adopt_file``: hashed once, not copied). Readers map it with
``np.load(path, mmap_mode="r")``.
"""

import io
import os
import tempfile
from pathlib import Path
from types import TracebackType

import numpy as np

from corpus_assets.core.storage.artifacts import NPY, Ref, make_ref
from corpus_assets.core.storage.cas import ContentStore


def npy_header(dtype: np.dtype, length: int) -> bytes:
    """The version 1.0 header of a C-ordered 1-D array of ``length`` items of ``dtype``."""
    sink = io.BytesIO()
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False}
    np.lib.format.write_array_header_1_0(sink, {**header, "shape": (length,)})
    return sink.getvalue()


class NpyStream:
    """``with NpyStream(cas, dtype) as out: out.write(batch)``; then ``out.ref`` names the file."""

    def __init__(self, cas: ContentStore, dtype: np.dtype | str) -> None:
        self.cas, self.dtype = cas, np.dtype(dtype)
        self.length = 0
        self.ref: Ref | None = None
        folder = cas.root / "tmp"
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=folder, prefix=".tmp-npy-")
        self._path = Path(name)
        self._file = os.fdopen(fd, "wb")
        self._file.write(npy_header(self.dtype, 0))

    def write(self, values: np.ndarray) -> None:
        """Append ``values`` (cast to the stream's dtype, which is little-endian by contract)."""
        self._file.write(memoryview(np.ascontiguousarray(values, dtype=self.dtype)))
        self.length += len(values)

    def __enter__(self) -> "NpyStream":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, _error: object, _trace: TracebackType | None
    ) -> None:
        if kind is not None:
            self._file.close()
            self._path.unlink(missing_ok=True)
            return
        self.ref = self._close()

    def _close(self) -> Ref:
        header = npy_header(self.dtype, self.length)
        if len(header) != len(npy_header(self.dtype, 0)):
            raise AssertionError(f"a .npy header for {self.length} items changed size")
        try:
            self._file.seek(0)
            self._file.write(header)
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self._file.close()
        digest, size = self.cas.adopt_file(self._path)
        return make_ref(digest, NPY, size)
