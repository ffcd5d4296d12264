"""What a resume costs when a build was killed inside its validation check.

For each kill point (a ``validate/<rule>`` failpoint, hit as that rule starts) on a data home
whose layers are already built: forget the recorded gate outcomes (``gate_results``: the check
starts cold, as in a first build), run ``corpus-assets build --partition P`` SIGKILLed at the
point (a new partition each time, so its layers are memo hits and only the check is left), then
resume it with a plain ``build --partition P`` and report its wall seconds, the check step's
seconds (``CORPUS_VERBOSE=1``) and the rules its check ran (from ``CORPUS_FAILPOINT_TRACE``).
The code measured is the one on ``sys.path``: put another checkout first with ``PYTHONPATH``.

    .venv/bin/python bench/check_resume.py CONFIG --points validate/canary_reproduces,...
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import delete

from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.catalog import gate_results
from corpus_assets.core.storage.failpoints import DIR_ENV, ENV, TRACE_ENV

# the console script, not ``-m``: ``-m`` puts the working folder first on sys.path, ahead of
# a PYTHONPATH that selects other code
CLI = [str(Path(sys.executable).parent / "corpus-assets"), "build", "--partition"]
CHECK_STEP = re.compile(r'Finished execution of step "snapshot_validates" in ([0-9.]+)(m?s)')


def forget_gate_outcomes(config: Path) -> int:
    with open_workspace(config) as ws, ws.catalog.begin() as conn:
        return conn.execute(delete(gate_results)).rowcount


def kill_and_resume(config: Path, point: str, scratch: Path) -> dict[str, object]:
    partition = f"check-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "CORPUS_CONFIG": str(config)}
    forgot = forget_gate_outcomes(config)
    killed = subprocess.run(
        [*CLI, partition],
        env={**env, ENV: f"{point}=kill@1", DIR_ENV: str(scratch)},
        capture_output=True,
        text=True,
        start_new_session=True,
    )
    if killed.returncode != -9:
        raise SystemExit(f"{point}: the build was not killed (exit {killed.returncode})")
    trace = scratch / f"{partition}.trace"
    load = os.getloadavg()[0]
    started = time.perf_counter()
    resumed = subprocess.run(
        [*CLI, partition],
        env={**env, TRACE_ENV: str(trace), "CORPUS_VERBOSE": "1"},
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    if resumed.returncode != 0:
        raise SystemExit(f"{point}: the resume failed: {resumed.stderr[-500:]}")
    step = CHECK_STEP.search(resumed.stderr)
    check = float(step.group(1)) / (1000 if step.group(2) == "ms" else 1) if step else None
    ran = [p.removeprefix("validate/") for p in trace.read_text().split() if "validate/" in p]
    return {
        "point": point,
        "forgotten_outcomes": forgot,
        "resume_s": round(seconds, 1),
        "check_s": check,
        "load_1min": round(load, 1),
        "rules_run": [r for r in ran if r != "state-read"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--points", default="validate/canary_reproduces,validate/build_latency")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="check-resume-") as scratch:
        for point in args.points.split(","):
            row = kill_and_resume(args.config.resolve(), point, Path(scratch))
            rules = row.pop("rules_run")
            print(row | {"rules_run": len(rules)}, " ".join(rules), flush=True)  # type: ignore[operator]


if __name__ == "__main__":
    main()
