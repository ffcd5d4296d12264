"""Allocators that hand freed memory back, chosen when the package is first imported.

A build runs every layer in one process; Arrow's default pool (mimalloc) keeps the segments a
layer freed, and glibc gives each thread (DuckDB's, Arrow's) an arena whose free pages stay
mapped. Measured on a 1.1 GB full build in one process: the floor between layers grew
236 -> 546 MB and the peak reached 1012 MB; with the system allocator for Arrow and two glibc
arenas the floor stays ~350 MB and the peak was 800 MB, CPU within noise.

glibc also moves its mmap threshold up to the largest block freed so far (up to 32 MB): after one
large buffer, the next ones of up to that size come from the heap, where a block freed below a
live one cannot be handed back. The held-out search reads texts in Arrow batches of a few MB
between long-lived arrays, and its peak at 1.1 GB varied 441-481 MB run to run; with the
threshold fixed at ``MMAP_THRESHOLD`` (every larger block is its own mapping, unmapped when
freed) it was 402-415 MB. Fixing it also freezes the trim threshold, at 128 KB: the heap's top
was then given back and faulted in again at every small free (+20% CPU), so it is set to
``TRIM_THRESHOLD``, with which the layer's CPU stayed within noise. What it costs: blocks of
4-16 MB are mapped and faulted in afresh each time, +2.5 CPU-s (+10%) for the dedup layer at
1.1 GB rebuilt alone; the whole 1.1 GB build measured 184 CPU-s against 185 before, and its
largest process 579 MB against 613 (its largest pool worker in the dedup layer 237-302 MB
against 291-313).

Arrow's C++ code reads ``ARROW_DEFAULT_MEMORY_POOL`` once and glibc reads its ``MALLOC_*``
variables when a process starts, so they are set here, before pyarrow loads, and this process
gets the same through ``mallopt``; processes this one starts (pool workers) inherit the
variables. A user's own setting of any of them wins.
"""

import contextlib
import ctypes
import os
import sys

# glibc's mallopt parameters, and the environment variables glibc reads for them at start-up
_M_ARENA_MAX, _M_MMAP_THRESHOLD, _M_TRIM_THRESHOLD = -8, -3, -1
MMAP_THRESHOLD = 4 << 20  # blocks at least this large are mappings of their own
TRIM_THRESHOLD = 32 << 20  # the heap's free top is given back once it is this large
GLIBC_SETTINGS = (
    ("MALLOC_ARENA_MAX", _M_ARENA_MAX, 2),
    ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, TRIM_THRESHOLD),
)


def use_returning_allocators() -> None:
    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
        if "pyarrow" in sys.modules:  # loaded before us: at least its Python-level default
            import pyarrow as pa

            pa.set_memory_pool(pa.system_memory_pool())
    for variable, parameter, value in GLIBC_SETTINGS:
        if variable not in os.environ:
            os.environ[variable] = str(value)  # read by glibc when a process starts
            with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to set
                ctypes.CDLL("libc.so.6").mallopt(parameter, value)  # this process, from now
