"""Concurrency faults through CLI processes: activation racing a tombstone
or a benchmark registration on one alias, and two builds on one data home at once.

A race holds both processes at their critical point with a failpoint (activation right after it
read the gate's watermarks, the fence right before its transaction), then releases them a random
few milliseconds apart, so each trial is a real race between two processes on the catalog.
Which order committed is read back from the catalog. On SQLite a writer holds the database's
write lock before it stamps its rows, so the fence's rows and the alias history carry commit
order, and an activation that swapped in after a fence (the bug the gate exists to prevent) is
caught even though its end state looks like a win. On PostgreSQL the fence stamps its rows
before it waits for the gate row's lock, so the stamps do not give the order there; the
in-process race test (``test_gate_race``) reads the order off the gate UPDATEs themselves on
both engines, and here PostgreSQL trials check each outcome and the loser's reason.
"""

import json
import subprocess
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import func, select

from corpus_assets.core.governance import alias_gate, states
from corpus_assets.core.publication.publish import approve
from corpus_assets.core.storage.catalog import alias_history, benchmark_items, tombstones
from corpus_assets.selftest.case import NO_LOSS, Outcome, fault
from corpus_assets.selftest.evidence import stray_temps, stuck_tasks, workspace
from corpus_assets.selftest.lab import PARTITION, Home, Lab, SelftestError, error_line, parse_built

QUICK_TRIALS = 2  # per fence; ``--full`` runs FULL_TRIALS
FULL_TRIALS = 200
SPREAD = 0.05  # seconds: how far apart the two releases may fall
PAUSE_TIMEOUT = 180.0


def _held(home: Home, args: tuple[str, ...], point: str, folder: Path) -> subprocess.Popen[str]:
    """A CLI process stopped at ``point`` (it waits there for its go file)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {"CORPUS_FAILPOINTS": f"{point}=pause@1", "CORPUS_FAILPOINT_DIR": str(folder)}
    process = home.start(*args, env=env)
    marker = folder / f"{point.replace('/', '_')}.paused"
    deadline = time.monotonic() + PAUSE_TIMEOUT
    while not marker.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            _, err = process.communicate()
            raise SelftestError(f"{' '.join(args)} never reached {point}: {err.strip()[-300:]}")
        time.sleep(0.02)
    return process


def _go(folder: Path, point: str) -> None:
    (folder / f"{point.replace('/', '_')}.go").touch()


def _fence_args(home: Home, kind: str, n: int) -> tuple[str, ...]:
    """``tombstone add`` of a record no build holds, or ``benchmark add`` of an item no record
    matches: the fence advances, nothing else changes."""
    if kind == "tombstone":
        return ("tombstone", "add", "--record", f"race/absent-{n}", "--reason", "selftest race")
    items = home.dir / f"race-items-{n}.jsonl"
    text = f"race item {n}: " + " ".join(f"zq{n}w{i}" for i in range(16))
    items.write_text(json.dumps({"id": f"i{n}", "text": text}) + "\n")
    return ("benchmark", "add", "race", str(items))


def _candidate(lab: Lab, name: str) -> tuple[Home, str, alias_gate.AliasGate]:
    """A copy of the reference home with its snapshot approved, and the gate row before."""
    home, built = lab.copy_of_reference(name)
    with workspace(home) as ws:
        approve(ws, built.snapshot_id, by="selftest")
        before = alias_gate.read_alias_gate(ws.catalog, ws.config.alias)
    return home, built.snapshot_id, before


def _release(lab: Lab, n: int, folders: tuple[Path, Path], points: tuple[str, str]) -> None:
    """Let both go a few milliseconds apart: a random order under ``--full``; otherwise the
    fence first in odd trials and activation first in even ones, so both orders are raced."""
    offset = lab.rng.uniform(-SPREAD, SPREAD) if lab.full else SPREAD * (-1) ** n
    first, second = (0, 1) if offset >= 0 else (1, 0)
    _go(folders[first], points[first])
    time.sleep(abs(offset))
    _go(folders[second], points[second])


def race_trial(lab: Lab, kind: str, n: int) -> str:
    """One race; returns which order committed, or raises naming what broke the rules."""
    home, sid, before = _candidate(lab, f"race-{kind}-{n}")
    points = ("gate/activate-read", f"fence/{kind}")
    folders = (home.dir / "fp-activate", home.dir / "fp-fence")
    activation = _held(home, ("activate", sid), points[0], folders[0])
    fence = _held(home, _fence_args(home, kind, n), points[1], folders[1])
    _release(lab, n, folders, points)
    _, act_err = activation.communicate(timeout=PAUSE_TIMEOUT)
    _, fence_err = fence.communicate(timeout=PAUSE_TIMEOUT)
    if fence.returncode != 0:
        raise SelftestError(f"the {kind} fence failed: {fence_err.strip()[-300:]}")
    return _judge(home, kind, sid, before, activation.returncode, act_err)


def _judge(
    home: Home, kind: str, sid: str, before: alias_gate.AliasGate, code: int, err: str
) -> str:
    """Check the catalog shows exactly one order, and that a refused activation said why."""
    with workspace(home) as ws, ws.catalog.begin() as conn:
        sqlite = conn.dialect.name == "sqlite"
        after = alias_gate.read_alias_gate(ws.catalog, before.alias)
        state = states.get(ws.catalog, sid).state
        swapped = conn.scalar(
            select(alias_history.c.at)
            .where(alias_history.c.alias == before.alias)
            .where(alias_history.c.generation == before.generation + 1)
        )
        table = tombstones if kind == "tombstone" else benchmark_items
        fenced = conn.scalar(select(func.max(table.c.at)))
    if code != 0:
        named = ("tombstone watermark" if kind == "tombstone" else "benchmark fence") in err
        unmoved = (after.generation, after.active_snapshot) == (
            before.generation,
            before.active_snapshot,
        )
        if state != states.APPROVED or swapped is not None or not unmoved or not named:
            raise SelftestError(f"refused activation left {state}, gate {after}: {err[-300:]}")
        return "fence first: activation refused, naming the fence"
    if state != states.ACTIVE or after.generation != before.generation + 1:
        raise SelftestError(f"activation exited 0 but the snapshot is {state}, gate {after}")
    if swapped is None or fenced is None:
        raise SelftestError("activation exited 0 but its swap or the fence is not recorded")
    if sqlite and swapped > fenced:
        raise SelftestError("activation swapped in after the fence had committed")
    return "activation first, then the fence"


def _race_case(lab: Lab, kind: str) -> Outcome:
    trials = FULL_TRIALS if lab.full else QUICK_TRIALS
    outcomes: Counter[str] = Counter()
    started = time.perf_counter()
    for n in range(1, trials + 1):
        outcomes[race_trial(lab, kind, n)] += 1
    took = time.perf_counter() - started
    summary = "; ".join(f"{count}x {what}" for what, count in sorted(outcomes.items()))
    return Outcome(
        observed=f"{trials} trials in {took:.0f} s: {summary}",
        matched=sum(outcomes.values()) == trials and len(outcomes) == 2,  # both orders raced
        lost=NO_LOSS,
    )


RACE_EXPECTED = (
    "exactly one order commits each trial; a fence that commits first refuses the activation "
    "with the reason (the candidate stays APPROVED, the alias unmoved); an activation that "
    "commits first is followed by the fence"
)


@fault(
    "race.activate-vs-tombstone",
    "001",
    "`activate` racing `tombstone add` (CLI processes, released ms apart at their critical point)",
    RACE_EXPECTED,
)
def activate_vs_tombstone(lab: Lab) -> Outcome:
    return _race_case(lab, "tombstone")


@fault(
    "race.activate-vs-benchmark",
    "001",
    "`activate` racing `benchmark add` (CLI processes, released ms apart at their critical point)",
    RACE_EXPECTED,
)
def activate_vs_benchmark(lab: Lab) -> Outcome:
    return _race_case(lab, "benchmark")


@fault(
    "004.two-builds-one-home",
    "004",
    "two builds of different partitions on one data home at once",
    "both complete; each equals what it would be alone; no stuck task, no stray temp file",
)
def two_builds(lab: Lab) -> Outcome:
    home = lab.standard_home("two-builds")
    runs = [home.start("build", "--partition", key) for key in (PARTITION, "p2")]
    done = [run.communicate(timeout=900) for run in runs]
    codes = [run.returncode for run in runs]
    if codes != [0, 0]:
        errors = " / ".join(err.strip().splitlines()[-1] for _, err in done if err.strip())
        return Outcome(observed=f"exit codes {codes}: {errors}", matched=False, lost="unknown")
    first, second = (parse_built(out) for out, _ in done)
    verified = home.cli("verify", second.snapshot_id)
    with workspace(home) as ws:
        stuck = stuck_tasks(ws)
    temps = stray_temps(home)
    return Outcome(
        observed=f"both exit 0; p2 verify exit {verified.code}; {stuck} stuck tasks, "
        f"{len(temps)} stray temp files",
        matched=verified.code == 0 and stuck == 0 and not temps,
        digests_equal=first.snapshot_id == lab.reference().snapshot_id,
    )


@fault(
    "001.tombstone-after-read",
    "001",
    "a tombstone committed after activation read the watermarks and before the alias CAS",
    "the tombstone wins: activation is refused naming it, the candidate stays APPROVED, the "
    "alias is unmoved, and a pinned training run keeps reading its digest",
)
def tombstone_after_read(lab: Lab) -> Outcome:
    home, built = lab.copy_of_reference("tombstone-after-read")
    home.publish(built.snapshot_id)  # the active snapshot a training run is pinned to
    pinned = ("read", built.snapshot_id, "--run-id", "pinned-run", "--purpose", "selftest")
    home.must(*pinned)
    candidate = home.build("--partition", "p2")
    home.must("approve", candidate.snapshot_id, "--by", "selftest")
    folder = home.dir / "fp-activate"
    activation = _held(home, ("activate", candidate.snapshot_id), "gate/activate-read", folder)
    home.must("tombstone", "add", "--record", "docs/0-1", "--reason", "revoked mid-activation")
    _go(folder, "gate/activate-read")
    _, err = activation.communicate(timeout=PAUSE_TIMEOUT)
    with workspace(home) as ws:
        state = states.get(ws.catalog, candidate.snapshot_id).state
        after = alias_gate.read_alias_gate(ws.catalog, ws.config.alias)
    again = home.cli(*pinned)
    reading = json.loads(again.out) if again.code == 0 else {}
    refused = activation.returncode != 0 and "tombstone watermark" in err
    kept = reading.get("resumed") is True and reading.get("snapshotId") == built.snapshot_id
    unmoved = after.active_snapshot == built.snapshot_id
    return Outcome(
        observed=f"activate exit {activation.returncode} ({error_line(err)[-200:]}); "
        f"candidate {state}; "
        f"alias at {after.active_snapshot} gen {after.generation}; pinned read exit "
        f"{again.code}, resumed {reading.get('resumed')}",
        matched=refused and state == states.APPROVED and unmoved and kept,
        lost=NO_LOSS if again.code == 0 else "the pinned run cannot read its snapshot",
    )
