"""The local engine's pool: one per build, reused by every layer, with workers that import only
the code their tasks need (never the CLI, Dagster or the Dagster wrappers of the parent)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from corpus_assets.assets.executor import pooled_in_process_executor
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.core.runtime.code_identity import code_identity
from corpus_assets.core.runtime.pool import shared_pool
from corpus_assets.core.runtime.runners import LocalRunner, WorkerSetup
from corpus_assets_tests.paths import REPO
from corpus_assets_tests.worker_probe import (
    arrow_without_pandas,
    identity_parses,
    no_setup,
    worker_pid,
)

# A parent that has loaded what the CLI's build and Dagster's run worker load, then maps a probe
# on the local pool: spawn would run this main module again in every worker.
PARENT = """\
import json

import dagster  # noqa: F401
import corpus_assets.assets.resources  # noqa: F401
import corpus_assets.cli.main  # noqa: F401
from corpus_assets.core.runtime.runners import LocalRunner, WorkerSetup
from corpus_assets_tests.worker_probe import forbidden_loaded, no_setup

if __name__ == "__main__":
    found = LocalRunner(2).map(forbidden_loaded, [0, 1, 2, 3], WorkerSetup(no_setup, ""))
    print(json.dumps(sorted(set().union(*found))))
"""


@pytest.mark.parametrize("how", ["script", "module"])
def test_workers_never_import_the_cli_or_dagster(tmp_path: Path, how: str) -> None:
    """Whether the parent's main is a file (the console script) or a module (``-m``)."""
    (tmp_path / "pool_parent.py").write_text(PARENT)
    command = ["pool_parent.py"] if how == "script" else ["-m", "pool_parent"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    done = subprocess.run(
        [sys.executable, *command], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_workers_build_arrow_tables_without_importing_pandas() -> None:
    """pyarrow imports pandas (installed here: the dev tools need it) at a process's first
    array, ~0.25 CPU-s per worker; the workers build their arrays and tables without it."""
    assert importlib.util.find_spec("pandas") is not None, "without pandas this proves nothing"
    found = LocalRunner(2).map(arrow_without_pandas, [0, 1, 2, 3], WorkerSetup(no_setup, ""))
    assert found == [(False, 2, True)] * 4


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _spawned_workers() -> set[int]:
    """The spawn workers this process has running now (its children running ``spawn_main``)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue  # gone while listing
        if ppid == os.getpid() and b"spawn_main" in command:
            found.add(int(stat.parent.name))
    return found


def _two_maps() -> tuple[set[int], set[int]]:
    """Two maps as two layers would run them (each its own worker setup): the workers that ran
    them, and the workers alive after the second."""
    first = LocalRunner(2).map(worker_pid, range(4), WorkerSetup(no_setup, "", ("a",)))
    second = LocalRunner(2).map(worker_pid, range(4), WorkerSetup(no_setup, "", ("b",)))
    return {*first, *second}, _spawned_workers()


def test_one_pool_serves_every_map_of_a_session() -> None:
    """Both maps ran on workers still alive after the second (one pool, at most two
    processes), and they are gone once the session ends."""
    with shared_pool():
        ran, alive = _two_maps()
    assert ran <= alive
    assert len(alive) <= 2
    assert not any(_alive(pid) for pid in ran)


@dg.asset
def first_layer() -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"ran": sorted(_two_maps()[0])})


@dg.asset(deps=[first_layer])
def second_layer() -> dg.MaterializeResult:
    ran, alive = _two_maps()
    return dg.MaterializeResult(metadata={"ran": sorted(ran), "alive": sorted(alive)})


def _metadata(instance: dg.DagsterInstance, asset: str) -> dict[str, list[int]]:
    event = instance.get_latest_materialization_event(dg.AssetKey(asset))
    assert event is not None and event.asset_materialization is not None
    return {k: list(v.value) for k, v in event.asset_materialization.metadata.items()}


def two_layer_job() -> dg.JobDefinition:
    """Two steps on the build's executor (reconstructable: ``execute_job`` keeps the executor,
    ``execute_in_process`` would replace it)."""
    job = dg.define_asset_job("two_layers", executor_def=pooled_in_process_executor)
    return dg.Definitions(assets=[first_layer, second_layer], jobs=[job]).resolve_job_def(
        "two_layers"
    )


def test_a_build_run_shares_one_pool_between_its_steps() -> None:
    """The build job's executor holds one pool session for the whole run: its in-process steps
    (every layer) use the same workers, which stop when the run ends."""
    with dg.instance_for_test() as instance:
        assert dg.execute_job(dg.reconstructable(two_layer_job), instance).success
        first, second = _metadata(instance, "first_layer"), _metadata(instance, "second_layer")
    ran = {*first["ran"], *second["ran"]}
    assert ran <= set(second["alive"])
    assert len(second["alive"]) <= 2
    assert not any(_alive(pid) for pid in ran)


def test_sensors_still_build_the_corpus_resource_without_a_with_block() -> None:
    """A resource with a teardown would be a context manager, which sensor contexts built
    without ``with`` refuse: the pool's session is the executor's, not the resource's."""
    context = dg.build_sensor_context(resources={"corpus": CorpusResource()})
    assert isinstance(context.resources.corpus, CorpusResource)


def test_workers_parse_no_source_their_driver_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker starts with its driver's parses (keyed by file digest): the code identity it
    computes is the driver's, and it parses no file for it (~0.3 CPU-s a worker otherwise),
    even with no on-disk parse cache to fall back on."""
    monkeypatch.setenv("CORPUS_CODE_CACHE", "off")
    module = "corpus_assets.core.records.canonical_records"
    driver = code_identity(module)  # imported by the stage modules before any pool starts
    with shared_pool():
        found = LocalRunner(2).map(identity_parses, [module] * 2, WorkerSetup(no_setup, ""))
    assert found == [(driver, 0), (driver, 0)]
