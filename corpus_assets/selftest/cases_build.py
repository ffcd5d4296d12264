"""Task-state faults on one build of the standard corpus through the ``build_snapshot`` job: a
power loss at 95% resumed, a poison record, the same build triggered twice at once, a full
disk. Each drives ``corpus-assets build`` processes and reads the home back afterwards."""

import math
import subprocess
from pathlib import Path

import zstandard
from sqlalchemy import select

from corpus_assets.core.governance import states
from corpus_assets.core.runtime.layer_index import LAYERS
from corpus_assets.core.storage.catalog import chunk_tasks
from corpus_assets.core.storage.failpoints import TRACE_ENV
from corpus_assets.core.storage.tasks import FAILED, SUCCESS
from corpus_assets.selftest.case import Outcome, fault
from corpus_assets.selftest.corpus import write_objects
from corpus_assets.selftest.evidence import intact, stray_temps, stuck_tasks, workspace
from corpus_assets.selftest.lab import PARTITION, Home, Lab, error_line, parse_built
from corpus_assets.selftest.resume import (
    CLI,
    count_rules,
    count_tasks,
    kill_and_resume,
    reference_trace,
)


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
        f"resume exit {r.resume_code}{' ' + r.resume_error if r.resume_code else ''} in "
        f"{r.resume_seconds:.1f} s: "
        f"{r.tasks_before} of {trace.tasks} chunk tasks reused, {r.tasks_rerun} re-run; "
        f"the check ran {r.rules_rerun} of {count_rules(trace.points)} rules; "
        f"stuck RUNNING {r.stuck}, stray temps {r.strays}, runs left STARTED {r.started}, "
        f"resume {'named' if r.announced else 'did not name'} the run that died"
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
    errors = [error_line(err) for _out, err, code in done if code]
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


SMALL, LARGE = "3m", "64m"  # the standard build needs about 7 MB of data home


def _mount(data: Path, options: str) -> str:
    """``mount`` a tmpfs at ``data`` (or remount it); '' if done, else why not."""
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(data)], capture_output=True, text=True
    )
    return "" if done.returncode == 0 else (done.stderr.strip() or f"mount exit {done.returncode}")


def _damaged(home: Home) -> list[str]:
    """CAS objects whose bytes do not hash to their name (a partial write made visible)."""
    with workspace(home) as ws:
        return [d for d in ws.cas.iter_digests() if not intact(ws, d)]


@fault(
    "004.disk-full",
    "004",
    f"the data home on a {SMALL} tmpfs fills up during the build; then grown to {LARGE}",
    "the atomic replace never ran, so no damaged file is left; a clear error naming the path "
    "and the data home; a later run with space completes and verifies",
    catalog=False,
)
def disk_full(lab: Lab) -> Outcome:
    trace = reference_trace(lab)
    home = lab.standard_home("disk-full")
    data = home.dir / "data"
    data.mkdir()
    why = _mount(data, f"size={SMALL}")
    if why:
        return Outcome(f"NOT RUN: cannot mount a tmpfs data home ({why})", False, "unknown")
    try:
        return _fill_then_grow(home, trace.snapshot_id, trace.tasks)
    finally:
        subprocess.run(["umount", str(data)], capture_output=True)


def _fill_then_grow(home: Home, reference: str, tasks: int) -> Outcome:
    data = home.dir / "data"
    full = home.cli("build", "--partition", PARTITION)
    strays, damaged = stray_temps(home), _damaged(home)
    why = _mount(data, f"remount,size={LARGE}")
    trace = home.dir / "rerun.trace"
    rerun = home.start("build", "--partition", PARTITION, env={TRACE_ENV: str(trace)})
    out, _err = rerun.communicate(timeout=600)
    sid = parse_built(out).snapshot_id if rerun.returncode == 0 else None
    verify = home.cli("verify", sid) if sid else None
    rerun_tasks = count_tasks(trace.read_text().split()) if trace.exists() else -1
    named = str(data) in full.err and "rerun" in full.err
    observed = (
        f"build exit {full.code}: {full.error_line()}; stray temps {len(strays)}, damaged objects "
        f"{len(damaged)}; after growing{' (remount failed: ' + why + ')' if why else ''}: rerun "
        f"exit {rerun.returncode} re-ran {rerun_tasks} of {tasks} chunk tasks, verify exit "
        f"{verify.code if verify else '-'}"
    )
    return Outcome(
        observed=observed,
        matched=full.code == 1
        and named
        and not strays
        and not damaged
        and sid is not None
        and verify is not None
        and verify.code == 0,
        lost="none" if not damaged else f"{len(damaged)} damaged objects",
        digests_equal=sid == reference,
    )


POISON = "part-900.jsonl.zst"


def poisoned_home(lab: Lab) -> tuple[Home, str]:
    """A home whose source is the standard objects plus one that cannot be decoded (a zstd
    stream cut in half: every attempt of its chunk fails the same way)."""
    home = lab.home("poison-record")
    write_objects(home.sources)
    whole = zstandard.ZstdCompressor().compress(b'{"id": "p-1", "text": "fine"}\n' * 200)
    (home.sources / POISON).write_bytes(whole[: len(whole) // 2])
    home.configure([{"id": "docs", "kind": "objects", "path": str(home.sources)}])
    return home, POISON


@fault(
    "004.poison-record",
    "004",
    "a poison object: a zstd stream cut in half, so its chunk task fails on every attempt",
    "that chunk is marked FAILED and kept as a dead letter; the other chunks run to the end; "
    "validation names the dead letter",
)
def poison_record(lab: Lab) -> Outcome:
    home, name = poisoned_home(lab)
    ran = home.cli("build", "--partition", PARTITION)
    with workspace(home) as ws:
        with ws.catalog.begin() as conn:
            rows = conn.execute(
                select(chunk_tasks).where(chunk_tasks.c.layer == "canonical_records")
            ).all()
        built = [layer for layer in LAYERS if ws.catalog.layer_output(PARTITION, layer)]
        found = states.for_partition(ws.catalog, PARTITION)
        stuck = stuck_tasks(ws)
    poison = [r for r in rows if r.chunk_key == f"docs/{name}"]
    dead = [r for r in poison if r.status == FAILED and r.dead_letter]
    others = sum(r.status == SUCCESS for r in rows if r.chunk_key != f"docs/{name}")
    state = found[0].state if found else "none"
    named = f"dead letter open: chunk docs/{name}" in ran.error_line()
    observed = (
        f"build exit {ran.code}: {ran.error_line()}; poison chunk "
        f"{[(r.status, r.attempts, bool(r.dead_letter)) for r in poison]} (status, attempts, "
        f"dead letter); {others} other chunks SUCCESS; {len(built)}/7 layers built; snapshot "
        f"{state}; stuck RUNNING {stuck}"
    )
    return Outcome(
        observed=observed,
        matched=ran.code == 1
        and named
        and len(dead) == 1
        and others == len(rows) - 1
        and len(built) == len(LAYERS)
        and state == states.REJECTED
        and stuck == 0,
        digests_equal=None,  # its own source folder: no undisturbed build to compare with
    )
