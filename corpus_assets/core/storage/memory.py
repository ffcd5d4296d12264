"""Handing freed memory back to the system between phases and between layers.

Arrow's allocator and glibc's heap keep freed pages for reuse, but the next phase allocates
through another allocator (numpy, DuckDB, Arrow), which cannot reuse them; in one process that
runs every layer (the CLI's in-process run) each layer would otherwise start from the previous
one's high-water mark.

Which allocators a process uses (ones that hand memory back at all) is chosen when the package
is first imported, before pyarrow loads: ``corpus_assets._allocators``.
"""

import ctypes
import gc
from typing import Any

import pyarrow as pa

from corpus_assets._gc import resume_deferred

try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL("libc.so.6")
    _LIBC.malloc_trim  # noqa: B018 - glibc only
except (OSError, AttributeError):
    _LIBC = None


_FROZEN = 0  # objects frozen since the last full collection (counted as they are frozen)
_FROZEN_AT_FULL = 0  # objects frozen right after the last full collection
_STARTUP_FROZEN = False  # freeze_startup_heap ran in this process


def release_memory(collect: bool = False) -> None:
    """Return unused pages of Arrow's pool and glibc's heap to the system. With ``collect``
    (only between layers or layer phases) cycles go first, so what they held is freed too."""
    if collect:
        collect_cycles()
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def hand_back_duckdb(con: Any) -> None:
    """Hand the pages a DuckDB connection freed back to the system now, at the end of a phase.

    DuckDB's allocator (jemalloc on Linux) keeps the pages of finished queries for reuse, so a
    join's working memory would sit under whatever the next phase allocates elsewhere (numpy,
    Arrow, Python). Changing the thread count makes DuckDB flush every arena (its scheduler
    calls ``FlushAll`` when the threads are relaunched), so the count goes up by one and
    straight back; then Arrow's and glibc's unused pages go too."""
    threads = int(con.execute("SELECT current_setting('threads')").fetchall()[0][0])
    con.execute(f"SET threads = {threads + 1}")
    con.execute(f"SET threads = {threads}")
    release_memory()


def collect_cycles() -> None:
    """Free garbage cycles at a cost proportional to what was allocated since the last call.

    A full ``gc.collect()`` walks every tracked object: the import-time heap alone is 150-230k
    objects (~0.1-0.2 s, more than a small layer's whole work), and a long-lived process (a test
    worker, a Ray worker) keeps adding to it. So survivors are frozen after each collection and
    the next one walks only younger objects. A frozen object is still freed when its last
    reference goes; a cycle among frozen objects is freed by the full collection that runs once
    the frozen heap has doubled since the last one (amortised: each object is walked a bounded
    number of times, and garbage cycles never hold more than the live heap did).
    """
    global _FROZEN, _FROZEN_AT_FULL
    full = _FROZEN == 0 or _FROZEN > 2 * _FROZEN_AT_FULL
    if full:
        gc.unfreeze()
        _FROZEN = 0
    gc.collect()
    # survivors all sit in the oldest generation now; counting them walks only them
    # (gc.get_freeze_count() walks the whole frozen heap: ~50 ms at 300k objects)
    _FROZEN += len(gc.get_objects(generation=2))
    gc.freeze()
    if full:
        _FROZEN_AT_FULL = _FROZEN


def freeze_startup_heap() -> None:
    """Freeze what start-up left (imports, Dagster's definitions and instance: ~200k objects)
    without a full collection walking it, once per process, before a run's first layer; then
    collections deferred during start-up (``_gc.defer_collections``) resume.

    ``collect_cycles``' first call is otherwise a full collection, and at that point the
    start-up heap is nearly all of what it walks (~0.1 CPU-s; a +1% child build's whole layer
    work is a few CPU-s). The heap counts as frozen at a full collection, so the doubling rule
    still decides when one runs: a garbage cycle left by start-up waits for it, like any other
    frozen one. Only young garbage is collected here (cheap), and none when collections were
    deferred (nothing was promoted: collecting the young generations would walk it all). A
    process that already collected (or froze at start-up) is left as it is."""
    global _FROZEN, _FROZEN_AT_FULL, _STARTUP_FROZEN
    if _STARTUP_FROZEN or _FROZEN:
        resume_deferred()
        return
    _STARTUP_FROZEN = True
    if gc.isenabled():
        gc.collect(1)  # survivors of the young generations join the oldest
    gc.freeze()  # a start-up that deferred collections (the CLI's build): frozen as it is
    resume_deferred()
    _FROZEN = _FROZEN_AT_FULL = gc.get_freeze_count()
