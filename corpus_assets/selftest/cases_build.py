"""Seed 004 faults on one build of the standard corpus through the ``build_snapshot`` job: a
power loss at 95% resumed, a poison record, the same build triggered twice at once, a full
disk. Each drives ``corpus-assets build`` processes and reads the home back afterwards."""

import math

from corpus_assets.selftest.case import Outcome, fault
from corpus_assets.selftest.lab import Lab
from corpus_assets.selftest.resume import CLI, kill_and_resume, reference_trace


@fault(
    "004.power-loss-95",
    "004",
    "SIGKILL of the whole build process group at 95% of the build's failpoint hits",
    "the resume recognises the finished chunks and runs only the rest; the same snapshotId "
    "as an undisturbed build; no half-written file left",
)
def power_loss_95(lab: Lab) -> Outcome:
    trace = reference_trace(lab)
    nth = math.ceil(0.95 * len(trace.points))
    r = kill_and_resume(lab, nth, CLI, "power-loss")
    observed = (
        f"kill exit {r.kill_code} at hit {nth}/{len(trace.points)} ({r.reached or 'not reached'}); "
        f"resume exit {r.resume_code} {r.resume_error} in {r.resume_seconds:.1f} s: "
        f"{r.tasks_before} of {trace.tasks} chunk tasks reused, {r.tasks_rerun} re-run; "
        f"stuck RUNNING {r.stuck}, stray temps {r.strays}"
    )
    return Outcome(
        observed=observed,
        matched=r.good(trace),
        digests_equal=r.snapshot_id == trace.snapshot_id == lab.reference().snapshot_id,
    )
