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


_HEAP_FROZEN = False


def release_memory(collect: bool = False) -> None:
    """Return unused pages of Arrow's pool and glibc's heap to the system. With ``collect``
    (only between layers or layer phases) cycles go first, so what they held is freed too."""
    if collect:
        gc.collect()
        _freeze_long_lived_heap()
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _freeze_long_lived_heap() -> None:
    """After the process's first collection, move what survived it out of the collector's sight.

    That is the import-time heap (modules, classes, the loaded libraries' caches: 150-230k
    objects), which a full collection otherwise walks every time: ~0.1-0.2 s per layer, more
    than a small layer's whole work. Later collections walk only what was allocated since. A
    frozen object is still freed when its last reference goes; only a cycle among frozen objects
    would outlive its use, and the import-time heap holds none that become garbage.
    """
    global _HEAP_FROZEN
    if not _HEAP_FROZEN:
        gc.freeze()
        _HEAP_FROZEN = True
