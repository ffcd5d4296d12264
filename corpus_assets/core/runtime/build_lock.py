"""One build of a partition at a time on a data home (a duplicate trigger gives one
result and no duplicate work). A second ``build`` of the same partition waits for the first's
lock, then runs the job over finished work: every chunk and layer is reused and it reports the
same snapshot instead of racing the first one's validation."""

import fcntl
import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def lock_path(home: Path, partition_key: str) -> Path:
    """The lock file of a partition (keys are hashed: any key is a safe file name)."""
    name = hashlib.sha256(partition_key.encode()).hexdigest()[:16]
    return home / "locks" / f"build-{name}.lock"


@contextmanager
def partition_build_lock(
    home: Path, partition_key: str, on_wait: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold the partition's build lock; ``on_wait`` is told who holds it before blocking. The
    lock is the kernel's (``flock``): a SIGKILLed holder releases it with its last descriptor."""
    path = lock_path(home, partition_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            if on_wait is not None:
                holder = handle.read().strip() or "another process"
                on_wait(f"{holder}; waiting to join that build")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"partition {partition_key} is being built by pid {os.getpid()}")
        handle.flush()
        yield
