"""A process that runs layers uses allocators that hand freed memory back: Arrow on the system
allocator, at most two glibc arenas, and a fixed glibc mmap threshold (a large block freed is
unmapped, whatever was freed before it), unless the user chose otherwise. Measured on a 1.1 GB
build in one process, the default mimalloc pool and per-thread arenas let the floor between
layers grow from 236 to 546 MB; glibc's moving threshold put 30-70 MB on the held-out search's
peak. Each case runs in a fresh interpreter: allocators are chosen once per process."""

import os
import subprocess
import sys
import textwrap

# Threads that each allocate small blocks (as DuckDB's and Arrow's workers do) get their own
# glibc arena unless the arena count is capped; malloc_info lists one <heap> per arena.
PROBE = textwrap.dedent(
    """
    import ctypes, re, threading, tempfile
    import corpus_assets.core.pipeline  # what a build, a worker and the UI's code import
    import pyarrow as pa

    ready = threading.Barrier(8)

    def churn():  # all eight alive at once: a finished thread's arena would be reused
        ready.wait()
        held = [bytearray(256) for _ in range(20000)]
        ready.wait()
        del held

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    with tempfile.NamedTemporaryFile("r") as out:
        stream = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(stream))
        libc.fclose(ctypes.c_void_p(stream))
        heaps = len(re.findall(r'<heap nr="', out.read()))
    import os
    assert os.environ["ARROW_DEFAULT_MEMORY_POOL"] == pa.default_memory_pool().backend_name
    print(pa.default_memory_pool().backend_name, heaps)
    """
)


def _unset() -> dict[str, str]:
    """This environment without the allocator choices a case makes (or leaves to the package)."""
    return {
        k: v
        for k, v in os.environ.items()
        if k != "ARROW_DEFAULT_MEMORY_POOL" and not k.startswith("MALLOC_")
    }


def _probe(**env: str) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=_unset() | env,
        capture_output=True,
        text=True,
        check=True,
    )
    backend, heaps = done.stdout.split()
    return backend, int(heaps)


def test_a_build_process_uses_the_system_pool_and_two_arenas() -> None:
    backend, heaps = _probe()
    assert backend == "system"
    assert heaps <= 2


def test_the_users_allocator_choice_wins() -> None:
    backend, heaps = _probe(ARROW_DEFAULT_MEMORY_POOL="mimalloc", MALLOC_ARENA_MAX="8")
    assert backend == "mimalloc"
    assert heaps > 2  # eight threads, up to eight arenas: the cap was not imposed


# glibc raises its mmap threshold to the size of a mapped block when it is freed: the next block
# of up to that size comes from the heap, and there, below a live block, it cannot be handed back
# when freed. With the threshold fixed, it is a mapping of its own and goes back at ``free``.
AFTER_A_LARGER_BLOCK = textwrap.dedent(
    """
    import ctypes, os, sys
    if sys.argv[1] == "package":
        import corpus_assets  # what every process of a build imports first
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def rss_mb():
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024

    def touched(size):
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)
        return block

    libc.free(touched(24 << 20))  # glibc's own threshold would now be 24 MB
    middle = touched(16 << 20)
    pin = touched(256 << 10)  # a live block above it: the heap's top cannot be trimmed past it
    before = rss_mb()
    libc.free(middle)
    print(before - rss_mb())
    """
)


def _handed_back_mb(*argv: str, **env: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", AFTER_A_LARGER_BLOCK, *argv],
        env=_unset() | env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout)


def test_a_large_block_freed_after_a_larger_one_is_handed_back() -> None:
    assert _handed_back_mb("bare") < 1  # glibc's default: the 16 MB stay in the heap
    assert _handed_back_mb("package") > 15


def test_the_users_mmap_threshold_wins() -> None:
    assert _handed_back_mb("package", MALLOC_MMAP_THRESHOLD_=str(32 << 20)) < 1
