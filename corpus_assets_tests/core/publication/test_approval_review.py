"""The approval Launchpad's review (``approve_snapshot``'s partitioned config): picking a partition
fills in its candidate and shadow diff, bound by a digest the approval checks again; a partition
with nothing to approve gets a review saying why, never an error.

Dagster evaluates the same function when the UI's Launchpad asks for a partition's config and
when ``execute_in_process(partition_key=...)`` has no run config, so these tests go through it.
"""

from pathlib import Path
from typing import Any

import dagster as dg

from corpus_assets.assets.jobs import approval_for_partition
from corpus_assets.core.governance import states
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication import publish
from corpus_assets.core.publication.review import NOT_REVIEWED
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.definitions import defs


def _validated(ws: Workspace, key: str) -> str:
    sid = build_all(ws, key)["manifest"].digests["snapshotId"]
    assert validate_snapshot(ws, sid).ok
    return sid


def _config(run_config: dict[str, Any]) -> dict[str, Any]:
    return run_config["ops"]["approve_digest"]["config"]


def _failure(result: dg.ExecuteInProcessResult) -> str:
    """The approval step's failure as the run's page shows it."""
    (failure,) = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    return failure.step_failure_data.user_failure_data.description


def test_the_launchpad_review_binds_the_approval_to_the_diff_it_showed(demo_home: Path) -> None:
    with open_workspace() as ws:
        first, second = _validated(ws, "pa"), _validated(ws, "pb")
    approve = defs.resolve_job_def("approve_snapshot")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("snapshots", ["pa", "pb"])
        shown = approval_for_partition("pb")  # what the Launchpad fills in for pb
        config = _config(shown)
        assert (config["partition"], config["snapshot_id"]) == ("pb", second)
        assert config["review"][:3] == [
            f"candidate: {second} (partition pb, VALIDATED)",
            "against: nothing; this would be the first snapshot alias demo serves",
            "+284 added, -0 removed, 0 split migrations",
        ]
        assert config["review_digest"].startswith("sha256:")

        # the alias moves before the approver clicks Launch: pb's diff is now against pa
        with open_workspace() as ws:
            publish.approve(ws, first, by="alice")
            publish.activate(ws, first, actor="op")
        stale = approve.execute_in_process(shown, instance=instance, raise_on_error=False)
        assert not stale.success
        assert _failure(stale) == (
            f"refusing to approve {second}: its shadow diff changed since it was reviewed "
            f"(review_digest {config['review_digest']}, now "
            f"{_config(approval_for_partition('pb'))['review_digest']}); "
            "pick the partition again to review it"
        )
        with open_workspace() as ws:
            assert states.get(ws.catalog, second).state == states.VALIDATED

        # picked again: the review says what changed, and approving it works (Dagster evaluates
        # the partition's config itself when a run names the partition and no config)
        review = _config(approval_for_partition("pb"))["review"]
        assert review[1].startswith(f"against: {first} (partition pa), what alias demo serves")
        assert review[2] == "+0 added, -0 removed, 0 split migrations"
        approved = approve.execute_in_process(partition_key="pb", instance=instance)
        assert approved.dagster_run.tags["dagster/partition"] == "pb"
        with open_workspace() as ws:
            assert states.get(ws.catalog, second).state == states.APPROVED


def test_a_partition_with_nothing_to_approve_gets_a_review_saying_why(demo_home: Path) -> None:
    with open_workspace() as ws:
        first = _validated(ws, "pa")
        publish.approve(ws, first, by="alice")
    expected = {
        "pa": f"nothing to approve: partition pa's newest snapshot {first} is APPROVED",
        "pz": "nothing to approve: partition pz has no snapshot in the catalog: build it first",
        "Bad Key": "refused: partition key 'Bad Key' is invalid",
    }
    for key, why in expected.items():
        config = _config(approval_for_partition(key))
        assert config["review"][0].startswith(why), config["review"]
        assert len(config["review"]) == 1 and config["review_digest"] == NOT_REVIEWED
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("snapshots", ["pz"])
        refused = defs.resolve_job_def("approve_snapshot").execute_in_process(
            approval_for_partition("pz"), instance=instance, raise_on_error=False
        )
        assert "partition pz has no snapshot in the catalog" in _failure(refused)
        refused = defs.resolve_job_def("approve_snapshot").execute_in_process(
            approval_for_partition("pa"), instance=instance, raise_on_error=False
        )
        assert _failure(refused) == (
            f"refusing to approve {first}: when the Launchpad loaded, its partition had nothing "
            "to approve (see `review`); pick the partition again to review it"
        )
