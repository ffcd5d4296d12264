"""Ctrl-C for every command: one line, no traceback, exit 130, and nothing left running.

A terminal sends SIGINT to the whole foreground process group: this process, its spawn-pool
workers and the helpers Dagster starts (``watch_orphans`` and ``tail`` for compute logs). Left
to Python, each of them raised ``KeyboardInterrupt`` wherever it was (52 lines of tracebacks),
and Dagster's own interrupt capture could hold the signal until a step ended. So the console
script blocks SIGINT before it does anything else - a blocked signal mask is inherited by every
thread and process started afterwards, so none of them is ever interrupted mid-line - and one
thread waits for it: it prints the line, kills this process's children and leaves at once.
Native threads that unblock it again (DuckDB's, Arrow's) hand it to Python's handler in the main
thread, which does the same; Dagster replaces that handler while it executes a job in the main
thread, so the CLI runs its jobs on another one (``off_main_thread``).

Leaving at once is the kill -9 path the store is built for (atomic renames, transactions,
locks held by open files and sessions): what finished is kept, and the next build resumes it
(a Dagster run left STARTED is marked failed by that build, ``cli.runs._report_dead_runs``).
"""

import os
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any, TypeVar

INTERRUPTED = "corpus-assets: interrupted; finished work is kept, rerun to resume\n"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention
_STOPPING = threading.Lock()
_TERMINAL = [2]  # where the line goes: install() keeps a duplicate of the stderr it was given
Result = TypeVar("Result")


def install() -> None:
    """Block SIGINT here (and so in everything started from now on) and wait for it in a thread.

    multiprocessing's resource tracker unblocks SIGINT in the thread that first starts it (it
    blocks it only around the spawn), so it is started first: later pools find it running."""
    resource_tracker.ensure_running()
    # Dagster points fd 2 at a step's compute log while the step runs (a ``tail`` child copies
    # it back); that child is killed with the rest, so the line must not travel through it.
    _TERMINAL[0] = os.dup(2)
    # A parent that ignores SIGTERM (a supervisor, nohup-like wrappers, pytest-xdist's workers)
    # hands that on to everything started from here; Dagster stops each step's compute-log
    # ``tail`` with SIGTERM and waits for it, so every step hung and failed. SIGTERM stops this
    # process and its children again, as the store expects of a kill.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, lambda _signo, _frame: stop())
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    threading.Thread(target=_wait, name="sigint", daemon=True).start()


@contextmanager
def sigterm_default() -> Iterator[None]:
    """SIGTERM stops what the command starts, even when the caller ignores it: an ignored
    signal is the one disposition a child inherits through exec, and Dagster stops each step's
    compute-log ``tail`` with SIGTERM and waits 30 s for it; ignored, every step failed and its
    ``tail`` was left running. ``main`` runs every command inside this, so an in-process caller
    (a test under a worker that ignores SIGTERM) gets the same; the caller's disposition is put
    back afterwards. Only the main thread may set it: elsewhere it is left as it is."""
    ignored = signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    if not ignored or threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _wait() -> None:
    signal.sigwait({signal.SIGINT})
    stop()


def stop() -> None:
    """The one line, every child process killed, exit 130 (once, whichever thread got here)."""
    _STOPPING.acquire()
    os.write(_TERMINAL[0], INTERRUPTED.encode())
    for pid in _children(os.getpid()):
        with suppress(ProcessLookupError):  # it finished meanwhile
            os.kill(pid, signal.SIGKILL)
    os._exit(EXIT_INTERRUPTED)


def _children(parent: int) -> list[int]:
    """Every process whose parent is ``parent``, and theirs (Linux ``/proc``; elsewhere none)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone while listing
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [parent]
    while frontier:
        below = [pid for pid, ppid in parents.items() if ppid in frontier]
        found += below
        frontier = below
    return found


def off_main_thread(run: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
    """``run(*args, **kwargs)`` on a worker thread, the main thread polling for it: Dagster
    installs its own SIGINT handler only when it executes on the main thread, so ours stays."""
    with ThreadPoolExecutor(1, thread_name_prefix="job") as pool:
        future = pool.submit(run, *args, **kwargs)
        while not future.done():
            threading.Event().wait(0.2)  # the main thread runs signal handlers between waits
        return future.result()
