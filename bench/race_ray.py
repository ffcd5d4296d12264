"""A local Ray cluster for ``race.py --engine ray``: a head node (and more nodes) on loopback,
each ``ray start`` in its own session, stopped by process group id (and its workers, each in
a group of its own, with the raylet that started them); and the CPU seconds the whole
cluster spent (every daemon and worker, live or already reaped), read from ``/proc``.

The driver's CPU is the measured process's own; the cluster's is what the Ray workers did for
it (the daemons' idle polling is counted too: measure an idle interval to see it, ~1-2% of a
core here). Stopping a group stops every daemon and worker it started.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Cluster:
    """``nodes`` Ray nodes with ``cpus_per_node`` CPUs each, on this machine."""

    nodes: int = 1
    cpus_per_node: int = 2
    address: str = ""
    temp: str = ""
    groups: list[int] = field(default_factory=list)
    _seen: dict[tuple[int, str], int] = field(default_factory=dict)  # CPU ticks per process
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> "Cluster":
        self.temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths are short
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        head = ["--head", f"--port={port}", "--include-dashboard=false", f"--temp-dir={self.temp}"]
        try:
            self.groups.append(self._start(head))
            for _ in range(self.nodes - 1):
                self.groups.append(self._start([f"--address={self.address}"]))
            threading.Thread(target=self._sampling, daemon=True).start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def env(self) -> dict[str, str]:
        """What a driver needs to join this cluster (and not re-create a uv environment)."""
        return {
            "RAY_TMPDIR": self.temp,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
        }

    def _start(self, args: list[str]) -> int:
        ray_cli = Path(sys.executable).with_name("ray")
        ports = [f"--{n}={_free_port()}" for n in ("metrics-export-port", "runtime-env-agent-port")]
        ports += [f"--dashboard-agent-{n}-port={_free_port()}" for n in ("listen", "grpc")]
        command = [
            str(ray_cli),
            "start",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={self.cpus_per_node}",
            *ports,
            *args,
        ]
        process = subprocess.Popen(
            command,
            env={**os.environ, **self.env()},
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        out, _ = process.communicate(timeout=180)
        if process.returncode != 0:
            _stop(process.pid)
            raise RuntimeError(f"ray start failed:\n{out.decode(errors='replace')[-3000:]}")
        return process.pid

    def cpu_seconds(self) -> float:
        """CPU seconds of every process seen in the cluster's sessions (each ``ray start``
        began one; its workers stay in it), the ones gone since included: the raylet does not
        reap its workers into its own children's times, so they are sampled while alive
        (every ``SAMPLE_S``; what a worker spends in its last moments is missed)."""
        self._sample()
        return sum(self._seen.values()) / TICKS

    def _sample(self) -> None:
        for pid, f in _stats(set(self.groups)).items():
            key = (pid, f[19])  # fields[19]: start time, so a reused pid is another process
            self._seen[key] = max(self._seen.get(key, 0), sum(int(v) for v in f[11:15]))

    def _sampling(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        for group in reversed(self.groups):
            _stop(group)
        for pid in _stats(set(self.groups)):  # a worker its raylet did not take down
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.groups.clear()


def _stats(sessions: set[int]) -> dict[int, list[str]]:
    """``/proc/<pid>/stat`` fields after the command name, of the processes in ``sessions``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) in sessions:  # fields[3]: the session id
            found[int(entry.name)] = fields
    return found


def _stop(group: int) -> None:
    """TERM the group, then KILL what is left after 5 s."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
