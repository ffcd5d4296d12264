"""Is the process that ran a build still there? A run's worker is named by host, pid and the
kernel's start time of that pid, so a SIGKILLed worker reads as dead even after its pid is reused.

A run killed without a chance to report (SIGKILL, power loss, OOM) stays "started" in any run
history that only the worker itself updates; this is what lets the history, ``status`` and the
next ``build`` of the partition tell such a run from one still working.
"""

import os
import socket
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class Liveness(StrEnum):
    ALIVE = "alive"
    DEAD = "dead"
    UNKNOWN = "unknown"  # another host's process, or a name this module cannot read


@dataclass(frozen=True)
class Worker:
    """One process: ``host:pid:start`` (start in clock ticks since boot; 0 where unknown)."""

    host: str
    pid: int
    start: int

    def tag(self) -> str:
        return f"{self.host}:{self.pid}:{self.start}"

    @classmethod
    def parse(cls, tag: str) -> "Worker | None":
        host, _, rest = tag.rpartition(":")
        host, _, pid = host.rpartition(":")
        if not (host and pid.isdigit() and rest.isdigit()):
            return None
        return cls(host, int(pid), int(rest))

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def this_worker() -> Worker:
    pid = os.getpid()
    stat = _stat(pid)
    return Worker(socket.gethostname(), pid, stat[1] if stat else 0)


def liveness(worker: Worker) -> Liveness:
    """Whether ``worker`` still runs: only a process of this host can be looked at."""
    if worker.host != socket.gethostname():
        return Liveness.UNKNOWN
    stat = _stat(worker.pid)
    if stat is None:
        return Liveness.DEAD if _gone(worker.pid) else Liveness.UNKNOWN
    state, start = stat
    if worker.start and start != worker.start:
        return Liveness.DEAD  # the pid was reused by a later process
    # a zombie is a killed child its parent has not reaped yet: it runs no code any more
    return Liveness.DEAD if state == "Z" else Liveness.ALIVE


def _stat(pid: int) -> tuple[str, int] | None:
    """State (field 3) and start time in clock ticks (field 22) of ``/proc/<pid>/stat``; None
    without procfs or without that process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], int(fields[19])


def _gone(pid: int) -> bool:
    """No such process (where procfs is missing, ``kill(pid, 0)`` says)."""
    if Path("/proc/self/stat").exists():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
