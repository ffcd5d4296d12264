"""A new snapshot from the UI in one launch, in a real browser: ``build_snapshot`` launched from
its launchpad without a partition (the UI asks "Are you sure?") becomes a build of a new, valid
partition in the same job the sensor uses; no asset turns red (with Dagster's own instance the
run fails in its first step and all seven layers are drawn red: their latest run failed); and it
waits in Dagster's run queue while the sensor's build runs (one build at a time, dagster.yaml).

Real parts only: ``dagster-webserver`` and ``dagster-daemon`` on loopback with throwaway homes
(the project's instance config), Debian ``chromium`` via Playwright.
"""

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from corpus_assets.assets.instance import NEW_SNAPSHOT_TAG
from corpus_assets.core.runtime.keys import is_valid_partition_key
from corpus_assets.core.runtime.layer_index import LAYERS
from corpus_assets_tests.assets.test_ui_browser import artifacts, page, require_chromium, shoot
from corpus_assets_tests.ui_servers import (
    Servers,
    build_runs,
    corpus_status,
    demo_servers,
    latest_runs,
    launched_at,
    partition_keys,
    run_succeeded,
    wait_for,
)

pytestmark = pytest.mark.browser
__all__ = ["artifacts", "page"]  # the browser test's fixtures, shared


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    """Webserver + daemon (sensors on, as shipped) on a demo CORPUS_HOME no build has seen."""
    require_chromium()
    with demo_servers(tmp_path) as started:
        yield started


def sensor_build_started(servers: Servers) -> dict[str, Any]:
    """The discovery sensor's build of the fresh sources, once it exists."""
    runs = [r for r in build_runs(servers.gql) if "dagster/sensor_name" in r["tags"]]
    return runs[0] if runs else {}


def launch_without_partition(page: Page, servers: Servers, artifacts: Path) -> str:
    """``build_snapshot``'s launchpad, Launch Run with no partition chosen, confirm; run id."""
    page.goto(
        f"http://127.0.0.1:{servers.port}/locations/corpus_assets/jobs/build_snapshot/playground"
    )
    launch = page.get_by_role("button", name="Launch Run")
    expect(launch).to_be_enabled()
    shoot(page, artifacts, "1-build-launchpad")
    launch.click()
    confirm = page.get_by_role("dialog")
    expect(confirm).to_contain_text("without a partition")
    shoot(page, artifacts, "2-are-you-sure")
    confirm.get_by_role("button", name="Confirm").click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"))
    shoot(page, artifacts, "3-run-page")
    return page.url.rsplit("/", 1)[-1].split("?")[0]


BORDER = "node => getComputedStyle(node.parentElement).borderTopColor"


def node_colour(page: Page, layer: str) -> tuple[int, ...] | None:
    """The border colour of ``layer``'s node in the lineage graph once its status is drawn
    (red, rgb(199, 42, 28), for a failed latest run; grey while loading)."""
    text = page.get_by_text(layer, exact=True).first.evaluate(BORDER)
    rgb = tuple(int(n) for n in re.findall(r"\d+", text)[:3])
    return rgb if max(rgb) - min(rgb) > 60 else None


def no_red_assets(page: Page, servers: Servers, artifacts: Path) -> None:
    """Every layer's latest run succeeded; no node of the lineage graph is drawn red."""
    statuses = latest_runs(servers.gql, list(LAYERS))
    assert statuses == dict.fromkeys(LAYERS, "SUCCESS"), statuses
    page.goto(
        f"http://127.0.0.1:{servers.port}/locations/corpus_assets/asset-groups/corpus/lineage"
    )
    for layer in LAYERS:
        expect(page.get_by_text(layer, exact=True).first).to_be_visible()
        red, green, blue = wait_for(
            f"{layer}'s status", lambda layer=layer: node_colour(page, layer), 60
        )
        assert not (red > 150 and green < 100 and blue < 100), f"{layer} is red"
        print(f"{layer} drawn rgb({red}, {green}, {blue})")
    shoot(page, artifacts, "4-lineage-not-red")


def test_one_partitionless_launch_builds_a_new_snapshot_queued_behind_the_sensor(
    servers: Servers, page: Page, artifacts: Path
) -> None:
    sensor_run = wait_for("the sensor's build run", lambda: sensor_build_started(servers), 180)
    run_id = launch_without_partition(page, servers, artifacts)
    wait_for("the UI-launched build", lambda: run_succeeded(servers.gql, run_id), 420)
    wait_for("the sensor's build", lambda: run_succeeded(servers.gql, sensor_run["runId"]), 300)

    runs = {r["runId"]: r for r in build_runs(servers.gql)}
    ui_run, sensor_run = runs[run_id], runs[sensor_run["runId"]]
    key = ui_run["tags"]["dagster/partition"]
    assert ui_run["tags"][NEW_SNAPSHOT_TAG] == "true" and is_valid_partition_key(key)
    assert key != sensor_run["tags"]["dagster/partition"] and key in partition_keys(servers.gql)
    assert all("dagster/partition" in r["tags"] for r in runs.values()), runs
    built = {s["partition"]: s["state"] for s in corpus_status(servers.env)["snapshots"]}
    assert built[key] == "VALIDATED", built

    # one build at a time: the later-created run left the queue once the other had ended
    first, second = sorted((ui_run, sensor_run), key=lambda r: r["creationTime"])
    launched = launched_at(servers.gql, second["runId"])
    print(f"created {second['creationTime']}, launched {launched}, other ended {first['endTime']}")
    assert launched >= first["endTime"], (first, second, launched)

    no_red_assets(page, servers, artifacts)
