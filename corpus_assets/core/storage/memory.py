"""Handing freed memory back to the system between phases and between layers.

Arrow's allocator and glibc's heap keep freed pages for reuse, but the next phase allocates
through another allocator (numpy, DuckDB, Arrow), which cannot reuse them; in one process that
runs every layer (the CLI's in-process run) each layer would otherwise start from the previous
one's high-water mark.
"""

import ctypes
import gc

import pyarrow as pa

try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6")
    _LIBC.malloc_trim  # noqa: B018 - glibc only
except (OSError, AttributeError):
    _LIBC = None


def release_memory(collect: bool = False) -> None:
    """Return unused pages of Arrow's pool and glibc's heap to the system. With ``collect``
    (costly: only between layers or layer phases) cycles go first, so what they held is freed
    too."""
    if collect:
        gc.collect()
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
