"""The same build triggered twice at once (seed 004, issue 19): both CLI invocations end with
the one snapshot, exit 0, and the chunk work is done once."""

from pathlib import Path

from corpus_assets.core.storage.failpoints import TRACE_ENV
from corpus_assets.selftest.lab import PARTITION, Lab, parse_built
from corpus_assets.selftest.resume import count_tasks


def test_two_concurrent_builds_of_one_partition_both_report_the_one_snapshot(
    tmp_path: Path,
) -> None:
    lab = Lab(tmp_path)
    home = lab.standard_home("twice")
    traces = [home.dir / f"build-{n}.trace" for n in range(2)]
    runs = [home.start("build", "--partition", PARTITION, env={TRACE_ENV: str(t)}) for t in traces]
    done = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-600:] for _out, err in done]
    ids = {parse_built(out).snapshot_id for out, _err in done}
    assert len(ids) == 1
    tasks = [count_tasks(t.read_text().split()) if t.exists() else 0 for t in traces]
    assert sum(tasks) == 24 and 0 in tasks  # 6 objects x 4 chunked layers, each run once
