"""Seed 004 faults on one build of the standard corpus through the ``build_snapshot`` job: a
power loss at 95% resumed, a poison record, the same build triggered twice at once, a full
disk. Each drives ``corpus-assets build`` processes and reads the home back afterwards."""

import math

from corpus_assets.core.storage.failpoints import TRACE_ENV
from corpus_assets.selftest.case import Outcome, fault
from corpus_assets.selftest.evidence import stray_temps, stuck_tasks, workspace
from corpus_assets.selftest.lab import PARTITION, Lab, parse_built
from corpus_assets.selftest.resume import CLI, count_tasks, kill_and_resume, reference_trace


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


@fault(
    "004.duplicate-trigger",
    "004",
    "the same build (build --partition p1) started twice at once on one data home",
    "absolutely idempotent: one result, as if run once (same checksum); no work done twice, "
    "no corrupt state",
)
def duplicate_trigger(lab: Lab) -> Outcome:
    trace = reference_trace(lab)
    home = lab.standard_home("duplicate-trigger")
    traces = [home.dir / f"build-{n}.trace" for n in range(2)]
    runs = [home.start("build", "--partition", PARTITION, env={TRACE_ENV: str(t)}) for t in traces]
    done = [(*run.communicate(timeout=600), run.returncode) for run in runs]
    codes = [code for _out, _err, code in done]
    ids = {parse_built(out).snapshot_id for out, _err, code in done if code == 0}
    tasks = [count_tasks(t.read_text().split()) if t.exists() else 0 for t in traces]
    waited = sum("waiting to join" in err for _out, err, _code in done)
    with workspace(home) as ws:
        stuck = stuck_tasks(ws)
    strays = len(stray_temps(home))
    errors = [err.strip().splitlines()[-1] for _out, err, code in done if code]
    observed = (
        f"exits {codes}, {len(ids)} snapshotId(s); {waited} invocation waited to join the "
        f"other; chunk tasks run {tasks} (reference {trace.tasks}); stuck RUNNING {stuck}, "
        f"stray temps {strays}" + (f"; error: {errors[0]}" if errors else "")
    )
    one = sorted(tasks) == [0, trace.tasks]
    return Outcome(
        observed=observed,
        matched=codes == [0, 0] and len(ids) == 1 and one and stuck == 0 and strays == 0,
        digests_equal=ids == {trace.snapshot_id},
    )
