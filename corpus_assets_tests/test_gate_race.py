"""Activation against a tombstone advance, started together on one gate row: exactly one commits.

Both sides decide on the same gate row (the one they read) and compete with one conditional
UPDATE each. Run for real on SQLite and on PostgreSQL, 200 trials per backend.
"""

import random
import threading
import time

from corpus_assets.core.governance import gate, states
from corpus_assets.core.storage.catalog import Catalog

TRIALS = 200


def _approved(catalog: Catalog, n: int) -> str:
    sid = f"sha256:{n:064x}"
    states.register(catalog, sid, f"p{n}", "sha256:" + "c" * 64, "train")
    states.transition(catalog, sid, states.BUILDING, states.VALIDATED, "test")
    states.approve(catalog, sid, by="reviewer")
    return sid


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
        barrier = threading.Barrier(2)
        outcome: dict[str, bool] = {}

        def activation(
            delay: float = 0.0,
            sid: str = sid,
            seen: gate.Gate = seen,
            barrier: threading.Barrier = barrier,
            outcome: dict[str, bool] = outcome,
        ) -> None:
            barrier.wait()
            time.sleep(max(0.0, -delay))
            try:
                gate.activate(
                    catalog,
                    sid,
                    seen.tombstone_watermark,
                    seen.benchmark_fence,
                    actor="race",
                    seen=seen,
                )
                outcome["activation"] = True
            except gate.GateError:
                outcome["activation"] = False

        delay = offset + rng.uniform(-0.0005, 0.0005)

        def tombstone(
            delay: float = 0.0,
            seen: gate.Gate = seen,
            barrier: threading.Barrier = barrier,
            outcome: dict[str, bool] = outcome,
        ) -> None:
            barrier.wait()
            time.sleep(max(0.0, delay))
            outcome["tombstone"] = gate.advance_tombstone(
                catalog, seen, seen.tombstone_watermark + 1
            )

        threads = [
            threading.Thread(target=activation, args=(delay,)),
            threading.Thread(target=tombstone, args=(delay,)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sum(outcome.values()) == 1, f"trial {n}: {outcome}"
        after = gate.read_gate(catalog, "train")
        offset += 0.0002 if outcome["tombstone"] else -0.0002
        if outcome["tombstone"]:
            wins["tombstone"] += 1
            # the candidate is not active and stays APPROVED; nothing else moved
            assert after.active_snapshot == seen.active_snapshot
            assert after.generation == seen.generation
            assert after.tombstone_watermark == seen.tombstone_watermark + 1
            assert states.get(catalog, sid).state == states.APPROVED
        else:
            wins["activation"] += 1
            assert (after.active_snapshot, after.generation) == (sid, seen.generation + 1)
            assert after.tombstone_watermark == seen.tombstone_watermark
            assert states.get(catalog, sid).state == states.ACTIVE
    catalog.dispose()
    assert wins["activation"] + wins["tombstone"] == TRIALS
    print(f"winners over {TRIALS} trials: {wins}")
    assert min(wins.values()) >= 3, f"the race was one-sided: {wins}"
