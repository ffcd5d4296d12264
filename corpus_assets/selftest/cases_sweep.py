"""The SIGKILL sweep: random kill points across all seven layers of the real
``build_snapshot`` job, in CLI builds and in ``dagster job execute`` runs, each resumed to
completion with a plain ``build --partition``. Points come from a traced reference build; the
quick case samples 3 (seeded by ``lab.rng``), the slow one (``--full``, ``-m slow``) 50."""

from corpus_assets.selftest.case import Outcome, fault
from corpus_assets.selftest.lab import Lab
from corpus_assets.selftest.resume import (
    CLI,
    DAGSTER,
    Resumed,
    Trace,
    kill_and_resume,
    layer_of,
    reference_trace,
)

EXPECTED = (
    "every resumed build ends with the snapshotId of an uninterrupted one; finished chunks are "
    "not re-run; no stuck RUNNING task, no stray temp files, no run left STARTED (the resume "
    "names the run that died); the resume time of each point"
)
FULL_POINTS, QUICK_POINTS = 50, 3


def choose(lab: Lab, trace: Trace, count: int) -> list[tuple[int, str]]:
    """``count`` (hit, kind) pairs, seeded: one per layer first (so a small sample still covers
    many layers), then any; kinds alternate CLI / Dagster so both are killed."""
    by_layer: dict[str, list[int]] = {}
    for nth, point in enumerate(trace.points, start=1):
        by_layer.setdefault(layer_of(point), []).append(nth)
    layers = trace.layers()
    lab.rng.shuffle(layers)
    hits = [lab.rng.choice(by_layer[layer]) for layer in layers][:count]
    pairs = [(nth, kind) for nth in range(1, len(trace.points) + 1) for kind in (CLI, DAGSTER)]
    spare = [pair for pair in pairs if pair[0] not in hits]
    lab.rng.shuffle(spare)
    chosen = [(nth, (CLI, DAGSTER)[i % 2]) for i, nth in enumerate(hits)]
    return sorted(chosen + spare[: max(0, count - len(chosen))])


def sweep(lab: Lab, count: int) -> Outcome:
    trace = reference_trace(lab)
    results = [kill_and_resume(lab, nth, kind, "sweep") for nth, kind in choose(lab, trace, count)]
    return summary(trace, results)


def summary(trace: Trace, results: list[Resumed]) -> Outcome:
    """One line: how many points resumed right, the layers and kinds covered, each resume time."""
    bad = [r for r in results if not r.good(trace)]
    layers = sorted({layer_of(r.reached) for r in results if r.reached})
    kinds = sorted({r.kind for r in results if r.killed})
    times = [r.resume_seconds for r in results]
    worst = "; ".join(_why(r, trace) for r in bad[:3])
    observed = (
        f"{len(results) - len(bad)} of {len(results)} kill points resumed to the reference "
        f"snapshotId ({', '.join(kinds)} killed; layers {len(layers)}/7: {', '.join(layers)}); "
        f"resume s min {min(times):.1f} max {max(times):.1f}; points: "
        + "; ".join(r.line() for r in results)
        + (f"; FAILED: {worst}" if bad else "")
    )
    return Outcome(
        observed=observed,
        matched=not bad and len(layers) >= min(7, len(results)),
        digests_equal=all(r.snapshot_id == trace.snapshot_id for r in results),
    )


def _why(r: Resumed, trace: Trace) -> str:
    return (
        f"#{r.nth} {r.kind} kill exit {r.kill_code} at {r.reached or '-'}, resume exit "
        f"{r.resume_code} {r.resume_error}, same id {r.snapshot_id == trace.snapshot_id}, "
        f"reran {r.tasks_rerun} of {trace.tasks - r.tasks_before}, stuck {r.stuck}, "
        f"stray temps {r.strays}, runs left STARTED {r.started}, resume announced {r.announced}"
    )


@fault(
    "004.sigkill-sweep",
    "004",
    "SIGKILL of the build's process group at 3 seeded points (CLI builds and a Dagster run)",
    EXPECTED,
)
def sigkill_sweep(lab: Lab) -> Outcome:
    return sweep(lab, QUICK_POINTS)


@fault(
    "004.sigkill-sweep-full",
    "004",
    f"SIGKILL at {FULL_POINTS} seeded points across all seven layers (CLI builds and Dagster runs)",
    EXPECTED,
    quick=False,
)
def sigkill_sweep_full(lab: Lab) -> Outcome:
    return sweep(lab, FULL_POINTS)
