"""Activation racing a tombstone or a benchmark fence on one alias: exactly one order commits, and
the loser ends as docs/REFERENCE.md ("Snapshot states") promises.

Both sides are the production paths: ``publish.activate`` (what ``corpus-assets activate`` and
the ``activate_snapshot`` job run) against ``add_tombstone`` (``corpus-assets tombstone add``) or
``add_benchmark_items`` (``corpus-assets benchmark``), on SQLite and PostgreSQL. Every trial
races a freshly built and approved snapshot (a build after a fence is a new manifest with the new
watermark), so no catalog row is reset by hand.

Activation's validation takes ~35 ms, the fence ~2 ms: the barrier both sides start from is
placed right after ``publish.activate``'s real validation (a pass-through wrapper), so the race
is on the gate's compare-and-swap, not on how long validation happens to take. The order the
gate row's UPDATEs landed in is read off both engines, so an activation that swapped in after a
fence (the bug the gate exists to prevent) fails even though its end state looks like a win.
"""

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import Engine, event, select

from corpus_assets.core.governance import alias_gate, benchmarks, states, tombstones
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication import publish
from corpus_assets.core.publication.verify import Report
from corpus_assets.core.records.normalize import dedup_key
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.catalog import Catalog, alias_history

TRIALS = 16  # per backend and fence, in the default run
SOAK_TRIALS = 200  # the same race under ``-m slow``
STEP = 0.0003  # seconds the head start moves towards the side that lost, times its streak
BARRIER_TIMEOUT = 60.0


@dataclass
class Race:
    """One trial's start line and what each side did."""

    delay: float  # > 0 holds the fence back, < 0 the activation
    barrier: threading.Barrier = field(default_factory=lambda: threading.Barrier(2))
    activated: alias_gate.AliasGate | None = None
    refused: str | None = None  # the AliasGateError activation raised
    fence_seq: int | None = None
    errors: list[BaseException] = field(default_factory=list)


class StartLine:
    """Wraps the real ``validate_snapshot`` that ``publish.activate`` calls: returns its report
    unchanged, then waits at the armed race's barrier (approval validates with none armed)."""

    def __init__(self) -> None:
        self.race: Race | None = None
        self.validate = publish.validate_snapshot

    def __call__(self, ws: Workspace, digest: str, trust_unchanged: bool = False) -> Report:
        race = self.race
        try:
            return self.validate(ws, digest, trust_unchanged=trust_unchanged)
        finally:
            if race is not None:
                race.barrier.wait(BARRIER_TIMEOUT)
                time.sleep(max(0.0, -race.delay))


class SwapLog:
    """Which thread's UPDATE of the gate row changed it, in order. A second writer on the row
    waits for the first to commit (PostgreSQL's row lock, SQLite's one writer), so this is the
    order the swaps committed in."""

    def __init__(self, *engines: Engine) -> None:
        self.engines = engines
        self.swaps: list[str] = []
        for engine in engines:
            event.listen(engine, "after_cursor_execute", self._executed)

    def _executed(self, _conn: object, cursor: Any, statement: str, *_rest: object) -> None:
        if statement.startswith("UPDATE gate ") and cursor.rowcount == 1:
            self.swaps.append(threading.current_thread().name)

    def take(self) -> list[str]:
        swaps, self.swaps = self.swaps, []
        return swaps

    def close(self) -> None:
        for engine in self.engines:
            event.remove(engine, "after_cursor_execute", self._executed)


def _fresh_candidate(ws: Workspace, n: int) -> str:
    """A new snapshot behind the gate's current fences, built and approved as a user would."""
    sid = build_all(ws, f"race-{n}")["manifest"].digests["snapshotId"]
    publish.approve(ws, sid, by="reviewer")
    return sid


def _fence(kind: str, ws: Workspace, catalog: Catalog, n: int) -> Callable[[], int]:
    """What ``corpus-assets tombstone add`` or ``corpus-assets benchmark`` runs, ready to go:
    revoking a record no build holds, or registering an item no record matches."""
    if kind == "tombstone":
        return lambda: tombstones.add_tombstone(catalog, "record", f"race/absent-{n}", "race")
    text = f"race item {n}: " + " ".join(f"zq{n}w{i}" for i in range(16))
    item = benchmarks.BenchmarkItem(f"race/{n}", ws.cas.put_bytes(text.encode()), dedup_key(text))
    return lambda: benchmarks.add_benchmark_items(catalog, "race", [item])


def _activate(ws: Workspace, sid: str, race: Race) -> None:
    try:
        race.activated = publish.activate(ws, sid, actor="race")
    except alias_gate.AliasGateError as error:
        race.refused = str(error)
    except BaseException as error:  # reported by the trial, not lost in the thread
        race.errors.append(error)


def _advance(fence: Callable[[], int], race: Race) -> None:
    try:
        race.barrier.wait(BARRIER_TIMEOUT)
        time.sleep(max(0.0, race.delay))
        race.fence_seq = fence()
    except BaseException as error:
        race.errors.append(error)


def _run(ws: Workspace, sid: str, fence: Callable[[], int], start: StartLine, race: Race) -> None:
    start.race = race
    threads = [
        threading.Thread(target=_activate, args=(ws, sid, race), name="activation"),
        threading.Thread(target=_advance, args=(fence, race), name="fence"),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    start.race = None


def _outcome(
    ws: Workspace, kind: str, sid: str, before: alias_gate.AliasGate, race: Race, swaps: list[str]
) -> str:
    """Which order committed, after checking the catalog shows exactly that order's state."""
    assert not race.errors, race.errors
    assert (race.activated is None) != (race.refused is None), race
    # one order, never an activation after the fence: refused -> the fence alone swapped
    assert swaps == (["fence"] if race.refused else ["activation", "fence"]), (swaps, race)
    after = alias_gate.read_alias_gate(ws.catalog, before.alias)
    moved, kept = ("tombstone_watermark", "benchmark_fence")[:: 1 if kind == "tombstone" else -1]
    # the fence lands whichever order it came in, and fences the alias
    assert race.fence_seq is not None and race.fence_seq > getattr(before, moved)
    assert getattr(after, moved) == race.fence_seq
    assert getattr(after, kept) == getattr(before, kept)
    with ws.catalog.begin() as conn:
        history = conn.scalar(
            select(alias_history.c.snapshot_id)
            .where(alias_history.c.alias == before.alias)
            .where(alias_history.c.generation == before.generation + 1)
        )
    state = states.get(ws.catalog, sid).state
    if race.refused is not None:  # the fence first: the candidate stays APPROVED, alias unmoved
        assert (state, history) == (states.APPROVED, None), race.refused
        assert (after.generation, after.active_snapshot) == (
            before.generation,
            before.active_snapshot,
        )
        if "gate moved" in race.refused:  # the loser is told which fence won
            moved = "tombstone watermark" if kind == "tombstone" else "benchmark fence"
            assert f"{moved} {getattr(before, moved.replace(' ', '_'))} -> " in race.refused
            return "fence won the swap"
        return "fence before the read"
    assert (state, history) == (states.ACTIVE, sid)
    assert (after.generation, after.active_snapshot) == (before.generation + 1, sid)
    assert race.activated is not None and race.activated.generation == before.generation + 1
    return "activation"


def _race_trials(ws: Workspace, kind: str, trials: int, monkeypatch: pytest.MonkeyPatch) -> None:
    start = StartLine()
    monkeypatch.setattr(publish, "validate_snapshot", start)
    fence_catalog = Catalog(ws.catalog.url)  # the CLI's own connection, as another process has
    log = SwapLog(ws.catalog.engine, fence_catalog.engine)
    outcomes: Counter[str] = Counter()
    rng = random.Random(18)
    # Head start in seconds, moving towards the side that lost (further each time the same side
    # wins again), so both orders keep happening however loaded the machine is.
    offset, streak, last = 0.0, 0, ""
    begun = time.perf_counter()
    for n in range(1, trials + 1):
        sid = _fresh_candidate(ws, n)
        before = alias_gate.read_alias_gate(ws.catalog, ws.config.alias)
        race = Race(delay=offset + rng.uniform(-0.0005, 0.0005))
        _run(ws, sid, _fence(kind, ws, fence_catalog, n), start, race)
        outcome = _outcome(ws, kind, sid, before, race, log.take())
        outcomes[outcome] += 1
        side = "activation" if outcome == "activation" else "fence"
        streak, last = (streak + 1 if side == last else 1), side
        offset += (-STEP if side == "activation" else STEP) * streak
    log.close()
    fence_catalog.dispose()
    took = time.perf_counter() - begun
    print(f"{kind} on {ws.catalog.engine.dialect.name}, {trials} trials in {took:.1f}s: {outcomes}")
    activations = outcomes["activation"]
    assert min(activations, trials - activations) >= trials // 8, f"one-sided: {outcomes}"
    # the narrow case raced too: the fence committed between activation's read and its swap
    assert outcomes["fence won the swap"] >= 1, outcomes


# Each backend against each fence (~15 s each on a 2-core runner: a fresh build per trial).
PAIRS = [
    ("sqlite", "tombstone"),
    ("sqlite", "benchmark"),
    ("postgres", "tombstone"),
    ("postgres", "benchmark"),
]


@pytest.mark.parametrize(("catalog_url", "kind"), PAIRS, indirect=["catalog_url"])
def test_activation_racing_a_fence_commits_in_one_order(
    workspace: Workspace, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _race_trials(workspace, kind, TRIALS, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["tombstone", "benchmark"])
def test_activation_racing_a_fence_soak(
    workspace: Workspace, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _race_trials(workspace, kind, SOAK_TRIALS, monkeypatch)
