"""A process that runs layers uses allocators that hand freed memory back: Arrow on the system
allocator and at most two glibc arenas, unless the user chose otherwise. Measured on a 1.1 GB
build in one process, the default mimalloc pool and per-thread arenas let the floor between
layers grow from 236 to 546 MB. Each case runs in a fresh interpreter: allocators are chosen
once per process."""

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


def _probe(**env: str) -> tuple[str, int]:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ARROW_DEFAULT_MEMORY_POOL", "MALLOC_ARENA_MAX")
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=base | env, capture_output=True, text=True, check=True
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
