"""Named fault-injection points for ``corpus-assets selftest --faults`` (``CORPUS_FAILPOINTS``).

A build passes named points: a chunk task finished, a layer published, a source listed, a CAS
object about to be renamed into place, a validity rule starting, an activation that has read the
watermarks. With the variable unset (every production run) ``hit`` is one dict lookup. Set, it
is a comma list of ``POINT=ACTION``: POINT a name, a prefix ending in ``*``, or ``*`` (every
point); ACTION ``kill@N`` (SIGKILL this process group at the N-th matching hit, counted across
all the build's processes: a power loss) or ``pause@N`` (at the N-th hit create
``<dir>/<rule>.paused`` and wait for ``<dir>/<rule>.go``: the test injects its fault
meanwhile). Counters live in
``CORPUS_FAILPOINT_DIR``; ``CORPUS_FAILPOINT_TRACE`` names a file every hit appends its point to
(a reference run lists the points a build passes, for a kill sweep to choose from).
"""

import fcntl
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ENV = "CORPUS_FAILPOINTS"
DIR_ENV = "CORPUS_FAILPOINT_DIR"
TRACE_ENV = "CORPUS_FAILPOINT_TRACE"
ACTIONS = ("kill", "pause")


@dataclass(frozen=True)
class Rule:
    point: str
    action: str
    nth: int

    def matches(self, name: str) -> bool:
        if self.point.endswith("*"):
            return name.startswith(self.point[:-1])
        return name == self.point

    @property
    def slug(self) -> str:
        return self.point.replace("*", "ANY").replace("/", "_")


def parse(spec: str) -> list[Rule]:
    """``POINT=ACTION@N,...`` as rules; a malformed rule is an error naming it."""
    rules = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        point, _, action = item.partition("=")
        verb, _, nth = action.partition("@")
        if not point or verb not in ACTIONS or not nth.isdigit() or int(nth) < 1:
            raise ValueError(f"{ENV}: {item!r} is not POINT=kill@N or POINT=pause@N (N >= 1)")
        rules.append(Rule(point, verb, int(nth)))
    return rules


_RULES = parse(os.environ.get(ENV, ""))
_TRACE = os.environ.get(TRACE_ENV)


def hit(name: str) -> None:
    """Pass the point ``name``: nothing unless a rule or the trace names it."""
    if _TRACE:
        _append(Path(_TRACE), f"{name}\n".encode())
    for rule in _RULES:
        if rule.matches(name) and _count(rule) == rule.nth:
            _act(rule, name)


def _directory() -> Path:
    folder = os.environ.get(DIR_ENV)
    if not folder:
        raise RuntimeError(f"{ENV} is set but {DIR_ENV} is not")
    return Path(folder)


def _append(path: Path, data: bytes) -> int:
    """Append under an exclusive lock; the file's size afterwards."""
    with path.open("ab") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(data)
        handle.flush()
        return handle.tell()


def _count(rule: Rule) -> int:
    """This hit's number among the rule's hits in every process of the build."""
    return _append(_directory() / f"{rule.slug}.count", b".")


def _act(rule: Rule, name: str) -> None:
    folder = _directory()
    (folder / f"{rule.slug}.reached").write_text(name)
    if rule.action == "kill":
        os.killpg(os.getpgid(0), signal.SIGKILL)
    go = folder / f"{rule.slug}.go"
    (folder / f"{rule.slug}.paused").write_text(name)
    while not go.exists():
        time.sleep(0.02)
