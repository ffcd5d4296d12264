"""Activation against a tombstone advance, started together on one gate row: exactly one commits.

Both sides decide on the same gate row (the one they read) and compete with one conditional
UPDATE each. Run for real on SQLite and on PostgreSQL, 200 trials per backend.
"""

import random
import threading
import time

from corpus_assets.core.governance import gate, states, tombstones
from corpus_assets.core.storage.catalog import Catalog

TRIALS = 200


def _approved(catalog: Catalog, n: int) -> str:
    sid = f"sha256:{n:064x}"
    states.register(catalog, sid, f"p{n}", "sha256:" + "c" * 64, "train")
    states.transition(catalog, sid, states.BUILDING, states.VALIDATED, "test")
    states.approve(catalog, sid, by="reviewer")
    return sid


def _activation(
    catalog: Catalog,
    sid: str,
    seen: gate.Gate,
    barrier: threading.Barrier,
    delay: float,
    outcome: dict[str, bool],
) -> None:
    barrier.wait()
    time.sleep(max(0.0, -delay))
    try:
        gate.activate(
            catalog, sid, seen.tombstone_watermark, seen.benchmark_fence, actor="race", seen=seen
        )
        outcome["activation"] = True
    except gate.GateError:
        outcome["activation"] = False


def _tombstone(
    catalog: Catalog,
    seen: gate.Gate,
    barrier: threading.Barrier,
    delay: float,
    outcome: dict[str, bool],
) -> None:
    barrier.wait()
    time.sleep(max(0.0, delay))
    outcome["tombstone"] = tombstones.advance_tombstone(catalog, seen, seen.tombstone_watermark + 1)


def _race(catalog: Catalog, sid: str, seen: gate.Gate, delay: float) -> dict[str, bool]:
    """Both sides released together by a barrier, ``delay`` apart; which committed."""
    barrier = threading.Barrier(2)
    outcome: dict[str, bool] = {}
    threads = [
        threading.Thread(target=_activation, args=(catalog, sid, seen, barrier, delay, outcome)),
        threading.Thread(target=_tombstone, args=(catalog, seen, barrier, delay, outcome)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcome


def _winner(catalog: Catalog, sid: str, seen: gate.Gate, outcome: dict[str, bool]) -> str:
    """The side that committed, after checking the gate row shows exactly its change."""
    after = gate.read_gate(catalog, "train")
    if outcome["tombstone"]:
        # the candidate is not active and stays APPROVED; nothing else moved
        assert after.active_snapshot == seen.active_snapshot
        assert after.generation == seen.generation
        assert after.tombstone_watermark == seen.tombstone_watermark + 1
        assert states.get(catalog, sid).state == states.APPROVED
        return "tombstone"
    assert (after.active_snapshot, after.generation) == (sid, seen.generation + 1)
    assert after.tombstone_watermark == seen.tombstone_watermark
    assert states.get(catalog, sid).state == states.ACTIVE
    return "activation"


def test_activation_and_tombstone_race_has_exactly_one_winner(catalog_url: str) -> None:
    catalog = Catalog(catalog_url)
    wins = {"activation": 0, "tombstone": 0}
    rng = random.Random(18)
    # Head start in seconds: > 0 delays the tombstone, < 0 the activation. It moves towards the
    # side that lost, so both orders keep happening however loaded the machine is.
    offset = 0.0
    for n in range(1, TRIALS + 1):
        sid = _approved(catalog, n)
        seen = gate.read_gate(catalog, "train")
        outcome = _race(catalog, sid, seen, offset + rng.uniform(-0.0005, 0.0005))
        assert sum(outcome.values()) == 1, f"trial {n}: {outcome}"
        winner = _winner(catalog, sid, seen, outcome)
        wins[winner] += 1
        offset += 0.0002 if winner == "tombstone" else -0.0002
    catalog.dispose()
    assert wins["activation"] + wins["tombstone"] == TRIALS
    print(f"winners over {TRIALS} trials: {wins}")
    assert min(wins.values()) >= 3, f"the race was one-sided: {wins}"
