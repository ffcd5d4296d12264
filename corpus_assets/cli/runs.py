"""The CLI's Dagster side: the instance in ``$DAGSTER_HOME`` and the jobs the CLI runs in its own
process (``build_snapshot``, ``activate_snapshot``), the same jobs the UI and sensors launch."""

import time
from typing import TYPE_CHECKING, Any, NoReturn

from corpus_assets.cli.common import CliError, note, opened
from corpus_assets.cli.instance import dagster_instance, run_config
from corpus_assets.cli.interrupt import off_main_thread
from corpus_assets.core.governance import alias_gate, states
from corpus_assets.core.ingest.sources import check_source_folders
from corpus_assets.core.publication.verify import load_manifest, reachable, resolve, verify
from corpus_assets.core.runtime.build_lock import partition_build_lock
from corpus_assets.core.runtime.keys import check_new_partition_key, new_partition_key
from corpus_assets.core.runtime.layer_index import LAYERS, load_index
from corpus_assets.core.runtime.pool import shared_pool
from corpus_assets.core.runtime.workspace import Workspace, check_writable_home
from corpus_assets.core.storage.artifacts import JSON, make_ref
from corpus_assets.core.storage.cas import CasError
from corpus_assets.core.storage.memory import freeze_startup_heap
from corpus_assets.core.storage.trust import StatTrust

if TYPE_CHECKING:
    from dagster import DagsterInstance, ExecuteInProcessResult


def failure(result: Any) -> str:
    """The innermost error of the first failed step: the user's reason, not Dagster's wrapper."""
    for event in result.all_events:
        if event.is_step_failure:
            error = event.step_failure_data.error
            while error.cause is not None:
                error = error.cause
            return f"step {event.step_key}: {error.message.strip()}"
    return "the run failed; see the Dagster UI for its logs"


def _report_dead_runs(instance: "DagsterInstance", key: str) -> None:
    """A run of ``key`` killed without reporting is marked failed, and the build says it resumes."""
    from corpus_assets.assets.run_workers import fail_dead_runs

    for dead in fail_dead_runs(instance, key):
        note(f"partition {key}: resuming after {dead.describe()}; marked it failed")


def build(partition: str | None) -> dict[str, Any]:
    """Run the build_snapshot job for one partition; return what the CLI prints."""
    if partition is not None:  # before anything is opened or created
        check_new_partition_key(partition)
    from corpus_assets.definitions import defs

    with opened(config=True) as ws:
        # the user's mistakes, each one line, before Dagster is touched
        check_writable_home(ws.home)
        check_source_folders(ws.loaded)
        taken = set(ws.catalog.partition_keys())
        home = ws.home
    instance = dagster_instance()
    taken |= set(instance.get_dynamic_partitions("snapshots"))
    key = partition or new_partition_key(taken)
    # one pool for the run's layers: execute_in_process replaces the job's (assets.executor)
    with (
        partition_build_lock(home, key, note),
        opened(writing=True, config=True) as ws,
        shared_pool(),
    ):
        _report_dead_runs(instance, key)
        instance.add_dynamic_partitions("snapshots", [key])
        freeze_startup_heap()  # the layers' collections then walk only what the run makes
        started = time.perf_counter()
        result = off_main_thread(
            defs.resolve_job_def("build_snapshot").execute_in_process,
            partition_key=key,
            instance=instance,
            raise_on_error=False,
            run_config=run_config(),
        )
    if not result.success:
        _refuse_failed_build(result, key)
    return _built(key, round(time.perf_counter() - started, 2))


def _refuse_failed_build(result: "ExecuteInProcessResult", key: str) -> NoReturn:
    """One line: the gate's verdict when validation refused, else why the run failed."""
    for check in result.get_asset_check_evaluations():
        # the gate's verdict; a layer check's warning (a CDC gap, a dead letter) names none
        if not check.passed and "snapshotId" in check.metadata:
            sid = check.metadata["snapshotId"].value
            raise CliError(
                f"snapshot {sid} (partition {key}) did not validate and is "
                f"{check.metadata['state'].value}: {check.description}"
            )
    raise CliError(f"build of partition {key} failed: {failure(result)}")


def _built(key: str, seconds: float) -> dict[str, Any]:
    """What ``build`` prints for the partition just built: its snapshot, layers and reuse."""
    with opened(config=True) as ws:
        manifest_digest = ws.catalog.layer_output(key, "manifest")
        snapshot = resolve(ws.catalog, manifest_digest)
        # only to count the objects: the check just verified them, so unchanged files are
        # trusted (storage.trust) rather than hashed a second time
        report = verify(
            ws.cas, ws.catalog, snapshot.snapshot_id, trust=StatTrust(ws.cas, ws.catalog)
        )
        parents = load_manifest(ws.cas, snapshot).parents
        parent_objects = _named_by(ws, parents[0]) if parents else set()
        layers = {layer: ws.catalog.layer_output(key, layer) for layer in LAYERS}
        dedup = load_index(ws.cas, layers["dedup_clusters"], "dedup_clusters")
        records = load_index(ws.cas, layers["canonical_records"], "canonical_records")
    return {
        "dedup": dedup.counts,
        "contamination": records.output("contamination"),
        "partition": key,
        "snapshotId": snapshot.snapshot_id,
        "state": snapshot.state,
        "layers": layers,
        "seconds": seconds,
        "casObjects": len(report.digests),
        "casReused": len(report.digests & parent_objects),
    }


def _named_by(ws: Workspace, snapshot_id: str) -> set[str]:
    """Every CAS object the snapshot ``snapshot_id`` names (its documents walked, no table
    read): what a child reused is what it shares with its parent. Not a listing of the store,
    which grows with every build the home ever kept (on S3, a request per 1,000 objects)."""
    try:
        manifest = states.get(ws.catalog, snapshot_id).manifest_digest
        named, _ = reachable(ws.cas, [make_ref(manifest, JSON, ws.cas.size(manifest))])
    except (states.StateError, CasError):  # a parent gone from the catalog or the store
        return set()
    return named


def activate_via_job(digest: str) -> alias_gate.AliasGate:
    """Activate through the same Dagster job the publication sensor requests."""
    from corpus_assets.assets.jobs import activation_run_config
    from corpus_assets.definitions import defs

    with opened() as home:
        snapshot = resolve(home.catalog, digest)
    result = off_main_thread(
        defs.resolve_job_def("activate_snapshot").execute_in_process,
        run_config={**activation_run_config(snapshot.snapshot_id), **run_config()},
        instance=dagster_instance(),
        raise_on_error=False,
        tags={"corpus/snapshot": snapshot.snapshot_id},
    )
    if not result.success:
        raise CliError(f"activation of {snapshot.snapshot_id} failed: {failure(result)}")
    with opened() as home:
        return alias_gate.read_alias_gate(home.catalog, snapshot.alias)
