"""In a real browser: the checks of ONE partition run from the UI without rebuilding a layer, and
show on that partition only; a key typed into "Add a partition" that breaks the rule is removed
by the ``partition_key_guard`` sensor, whose tick says which key and why.

The asset page's Checks tab cannot execute partitioned checks on their own in Dagster 1.13 (its
Execute button says so), so the path is Jobs -> ``check_snapshot`` -> Launchpad -> pick the
partition -> Launch Run. Real parts as in ``test_ui_browser``: a webserver and a daemon on a
loopback port with throwaway homes, Debian ``chromium`` driven by Playwright.
"""

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from corpus_assets.core.runtime.keys import RULE
from corpus_assets.core.runtime.layer_index import LAYERS
from corpus_assets_tests.assets import test_ui_browser as ui
from corpus_assets_tests.ui_servers import (
    BIN,
    REPO,
    Servers,
    partition_keys,
    run_succeeded,
    runs,
    wait_for,
)

pytestmark = pytest.mark.browser
CHECKS = {f"{layer}_invariants" for layer in LAYERS[:-1]} | {"snapshot_validates"}
# the browser test's fixtures, shared: pytest finds them as attributes of this module
servers, page, artifacts = ui.servers, ui.page, ui.artifacts
BAD = "Bad_Key!"  # the UI's dialog takes it (no space, comma or bracket); our rule does not


RUN_STEPS = """query Run($runId: ID!) { runOrError(runId: $runId) { ... on Run {
  tags { key value } stepStats { stepKey } assetMaterializations { assetKey { path } } } } }"""

GUARD_TICKS = """{ sensorOrError(sensorSelector: {repositoryLocationName: "corpus_assets",
  repositoryName: "__repository__", sensorName: "partition_key_guard"}) { ... on Sensor {
  sensorState { ticks(limit: 10) { status skipReason
    dynamicPartitionsRequestResults { partitionKeys type } } } } } }"""


def cli_build(servers: Servers, key: str) -> str:
    """``corpus-assets build --partition KEY`` on the servers' homes; its run id."""
    done = subprocess.run(
        [str(BIN / "corpus-assets"), "build", "--partition", key],
        env=servers.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (run,) = [
        r for r in runs(servers.gql, "build_snapshot") if r["tags"]["dagster/partition"] == key
    ]
    assert run["status"] == "SUCCESS"
    return run["runId"]


def check_from_launchpad(page: Page, servers: Servers, artifacts: Path, key: str) -> str:
    """Jobs -> check_snapshot -> Launchpad: pick ``key`` in the partition picker, launch; the
    run id once it succeeded."""
    page.goto(
        f"http://127.0.0.1:{servers.port}/locations/corpus_assets/jobs/check_snapshot/playground"
    )
    ui.pick_partition(page, key, artifacts)
    ui.shoot(page, artifacts, "1-check-launchpad")
    page.get_by_role("button", name="Launch Run").click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"))
    run_id = page.url.rsplit("/", 1)[-1].split("?")[0]
    wait_for("the check_snapshot run", lambda: run_succeeded(servers.gql, run_id), 180)
    return run_id


def only_checks_ran(servers: Servers, run_id: str, key: str) -> None:
    """The run's steps are the seven checks, for ``key``; no layer was materialized."""
    run = servers.gql.query(RUN_STEPS, {"runId": run_id})["runOrError"]
    assert {t["key"]: t["value"] for t in run["tags"]}["dagster/partition"] == key
    assert {s["stepKey"] for s in run["stepStats"]} == CHECKS
    assert run["assetMaterializations"] == []


def check_partition_shows(
    page: Page, servers: Servers, artifacts: Path, expected: dict[str, tuple[str, str, int]]
) -> None:
    """manifest -> Checks -> snapshot_validates -> Partitions: per partition key, the latest
    execution's run, a run that must not show there, and how many executions it has."""
    page.goto(
        f"http://127.0.0.1:{servers.port}/assets/manifest?view=checks&checkDetail=snapshot_validates"
    )
    expect(page.get_by_role("tab", name="Execution history")).to_be_visible()
    page.get_by_role("tab", name="Partitions").last.click()  # the check's, not the asset's
    for key, (latest, absent, executions) in expected.items():
        page.get_by_placeholder("Filter by partition").fill(key)
        page.get_by_title(key, exact=True).last.click()  # the list row (its text is truncated)
        history = f"View all historical executions ({executions})"
        expect(page.get_by_text(history, exact=True)).to_be_visible()
        expect(page.get_by_role("link", name=latest[:8], exact=True)).to_be_visible()
        expect(page.get_by_role("link", name=absent[:8], exact=True)).to_have_count(0)
        ui.shoot(page, artifacts, f"2-check-partition-{key}")


def add_partition_in_ui(page: Page, servers: Servers, artifacts: Path, key: str) -> None:
    """manifest -> Materialize... -> Add a partition: the dialog Dagster gives every user."""
    page.goto(f"http://127.0.0.1:{servers.port}/assets/manifest")
    page.get_by_role("button", name="Materialize…").click()
    page.get_by_role("button", name="Add a partition").click()
    page.get_by_placeholder("name").fill(key)
    page.get_by_role("button", name="Save").click()
    wait_for(f"{key!r} to be added", lambda: key in partition_keys(servers.gql), 30)
    ui.shoot(page, artifacts, "3-bad-key-added")
    page.get_by_role("button", name="Cancel").click()


def guard_removed(servers: Servers, key: str) -> dict[str, Any] | None:
    """The guard's tick that deleted ``key``, once the key is gone."""
    if key in partition_keys(servers.gql):
        return None
    ticks = servers.gql.query(GUARD_TICKS)["sensorOrError"]["sensorState"]["ticks"]
    for tick in ticks:
        for request in tick["dynamicPartitionsRequestResults"]:
            if request == {"partitionKeys": [key], "type": "DELETE_PARTITIONS"}:
                return tick
    return None


def test_checks_of_one_partition_from_the_ui_and_a_bad_key_removed(
    servers: Servers, page: Page, artifacts: Path
) -> None:
    a = ui.sensor_build(servers)
    key_a, build_a = a["tags"]["dagster/partition"], a["runId"]
    build_b = cli_build(servers, "snap-b")

    checked = check_from_launchpad(page, servers, artifacts, key_a)
    only_checks_ran(servers, checked, key_a)
    # A: the re-check is its latest of two executions; B: its build's check only, never A's
    expected = {key_a: (checked, build_a, 2), "snap-b": (build_b, checked, 1)}
    check_partition_shows(page, servers, artifacts, expected)

    add_partition_in_ui(page, servers, artifacts, BAD)
    tick = wait_for("the guard to remove the bad key", lambda: guard_removed(servers, BAD), 120)
    assert tick["status"] == "SKIPPED"
    assert tick["skipReason"] == f"removed partition key {BAD!r} is invalid: {RULE}"
    assert sorted(partition_keys(servers.gql)) == sorted([key_a, "snap-b"])
