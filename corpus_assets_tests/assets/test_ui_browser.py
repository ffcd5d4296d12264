"""The Dagster UI, end to end, in a real browser: sensor-built snapshot, approved from the
launchpad, activated by the publication sensor, then seen in the lineage, a partition and a plot;
a tombstone added on the command line is traced by its sensor onto the snapshot's partition.

Real parts only: ``dagster-webserver`` and ``dagster-daemon`` on a loopback port with throwaway
homes, Debian ``chromium`` driven by Playwright. Screenshots land in ``$CORPUS_UI_ARTIFACTS``
(default: ``tmp_path/screenshots``) so a CI failure can be looked at.
"""

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Locator, Page, expect, sync_playwright

from corpus_assets.core.runtime.layer_index import LAYERS
from corpus_assets.core.runtime.liveness import Worker
from corpus_assets_tests.ui_servers import (
    BIN,
    REPO,
    Servers,
    corpus_status,
    demo_servers,
    finished_run,
    partition_keys,
    run_succeeded,
    wait_for,
)

CHROMIUM = Path("/usr/bin/chromium")
APPROVER = "ui-browser-test"
pytestmark = pytest.mark.browser


def require_chromium() -> None:
    """Outside CI a machine without Debian chromium skips; on CI that is a broken setup."""
    if CHROMIUM.exists():
        return
    reason = f"{CHROMIUM} is absent (apt-get install chromium); Playwright cannot download one"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the browser test: {reason}")
    pytest.skip(reason)


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    """Where screenshots go: kept by CI as test artifacts."""
    path = Path(os.environ.get("CORPUS_UI_ARTIFACTS") or tmp_path / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    print(f"UI screenshots: {path}")
    return path


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Servers]:
    """Webserver + daemon on a demo CORPUS_HOME whose sources no build has seen yet; every
    process group they started is gone afterwards, checked by group id."""
    require_chromium()
    with demo_servers(tmp_path) as started:
        yield started


@pytest.fixture
def page(artifacts: Path) -> Iterator[Page]:
    """A headless Debian chromium page; the community sign-up modal is dismissed when it shows."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            tab.set_default_timeout(60_000)
            expect.set_options(timeout=60_000)  # a loaded 2-core CI box renders slowly
            tab.add_locator_handler(
                tab.get_by_text("Join the Dagster community"),
                lambda: tab.get_by_role("button", name="Skip").click(),
            )
            yield tab
            shoot(tab, artifacts, "last-page")  # where the test stopped, when it failed
        finally:
            browser.close()


def shoot(page: Page, artifacts: Path, name: str) -> None:
    path = artifacts / f"{name}.png"
    page.screenshot(path=str(path))
    print(f"screenshot {path}")


def pick_partition(page: Page, key: str, artifacts: Path) -> None:
    """On a job's launchpad: pick ``key`` in the partition picker and wait until the launchpad
    has generated that partition's run config (its tags show). A Launch Run clicked while it
    still says "Generating configuration..." launched nothing on a loaded machine.

    On a loaded CI box the picker's menu once never listed the key in 60 s; a menu that closes
    (a popup taking the focus closes it) is not opened again by waiting. So an attempt that sees
    no item within 20 s is shot, the menu closed and the picker opened again, three in all.
    """
    picker = page.get_by_placeholder("Partition")
    item = page.get_by_role("menuitem", name=key, exact=True)
    for attempt in (1, 2, 3):
        picker.click()
        try:
            expect(item).to_be_visible(timeout=20_000)
            break
        except AssertionError:
            shoot(page, artifacts, f"partition-picker-attempt-{attempt}")
            page.keyboard.press("Escape")
    else:
        raise AssertionError(f"the partition picker never listed {key} (see the screenshots)")
    item.click()
    expect(picker).to_have_value(key)
    expect(item).to_be_hidden()
    # the partition's run config is in once its tags show; until then the editor is loading
    tag = page.get_by_text(f"partition: {key}", exact=True)
    expect(tag).to_be_visible(timeout=120_000)
    expect(page.get_by_text("Generating configuration")).to_be_hidden()
    expect(page.get_by_role("button", name="Launch Run")).to_be_enabled()


def sensor_build(servers: Servers) -> dict[str, Any]:
    """The discovery sensor added the partition and requested its build, which succeeded."""
    build = wait_for(
        "the sensor's build_snapshot run", lambda: finished_run(servers.gql, "build_snapshot"), 300
    )
    partition = build["tags"]["dagster/partition"]
    assert build["tags"]["dagster/sensor_name"] == "source_discovery"
    assert build["tags"]["dagster/run_key"] == f"build:{partition}"
    # the launched run worker named itself, so run monitoring can tell if it is killed
    assert Worker.parse(build["tags"]["corpus/worker"]) is not None
    assert partition_keys(servers.gql) == [partition]
    return build


def open_launchpad(page: Page, servers: Servers, artifacts: Path) -> Locator:
    """The launchpad's config editor once it shows the scaffolded default config.

    Under load the page has once come up without it (a screenshot of each such attempt is kept);
    it is loaded again, up to three times, before that counts as a failure.
    """
    url = (
        f"http://127.0.0.1:{servers.port}/locations/corpus_assets/jobs/approve_snapshot/playground"
    )
    editor = page.locator(".CodeMirror").first
    for attempt in (1, 2):
        page.goto(url)
        try:
            expect(editor).to_contain_text("newest-validated", timeout=30_000)
            return editor
        except AssertionError:
            shoot(page, artifacts, f"launchpad-attempt-{attempt}")
    page.goto(url)
    expect(editor).to_contain_text("newest-validated")  # the default config, scaffolded
    return editor


def type_config(page: Page, editor: Locator, artifacts: Path, text: str) -> None:
    """Replace the launchpad's config by typing, as a user does: click into the editor, select
    all, type. A popup that opens meanwhile takes the focus, and Control+A then selects the whole
    page (seen under load), so the editor's focus is checked and the typing retried."""
    for attempt in (1, 2, 3):
        editor.locator(".CodeMirror-lines").click()
        try:
            expect(editor).to_have_class(re.compile(r"CodeMirror-focused"), timeout=5_000)
            page.keyboard.press("Control+a")
            page.keyboard.insert_text(text)
            expect(editor).to_contain_text(APPROVER, timeout=10_000)
            return
        except AssertionError:
            shoot(page, artifacts, f"typing-attempt-{attempt}")
    raise AssertionError("the launchpad's config editor never took the typed config")


def approve_from_launchpad(page: Page, servers: Servers, artifacts: Path) -> str:
    """Launch ``approve_snapshot`` from the UI with only the approver filled in, no partition
    picked (the job is partitioned for its review, so Dagster asks "Are you sure?"); its run
    id."""
    editor = open_launchpad(page, servers, artifacts)
    type_config(
        page,
        editor,
        artifacts,
        "ops:\n  approve_digest:\n    config:\n"
        f'      approver: "{APPROVER}"\n      partition: "newest-validated"\n'
        '      snapshot_id: ""\n',
    )
    expect(page.get_by_text("No errors")).to_be_visible()
    shoot(page, artifacts, "1-launchpad")
    page.get_by_role("button", name="Launch Run").click()
    expect(page.get_by_text("launch a run without a partition")).to_be_visible()
    page.get_by_role("button", name="Confirm").click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"))
    run_id = page.url.rsplit("/", 1)[-1].split("?")[0]
    wait_for("the approval run", lambda: run_succeeded(servers.gql, run_id), 180)
    page.reload()
    expect(page.get_by_text("Success", exact=True).first).to_be_visible()
    shoot(page, artifacts, "2-approval-run")
    return run_id


def published(servers: Servers, snapshot_id: str) -> dict[str, Any]:
    """The publication sensor requested activation of the approved snapshot and it ran."""
    run = wait_for(
        "the publication sensor's activate_snapshot run",
        lambda: finished_run(servers.gql, "activate_snapshot"),
        180,
    )
    assert run["tags"]["dagster/sensor_name"] == "publication"
    assert run["tags"]["dagster/run_key"] == f"activate:{snapshot_id}:generation:0"
    assert run["tags"]["corpus/snapshot"] == snapshot_id
    return run


def lineage_graph(page: Page, servers: Servers, artifacts: Path) -> None:
    """Assets -> group ``corpus`` -> Lineage: the seven layers as graph nodes."""
    page.goto(
        f"http://127.0.0.1:{servers.port}/locations/corpus_assets/asset-groups/corpus/lineage"
    )
    for layer in LAYERS:
        expect(page.get_by_text(layer, exact=True).first).to_be_visible()
    shoot(page, artifacts, "3-lineage")


def metadata_row(page: Page, key: str) -> Locator:
    """The metadata table row whose key cell is exactly ``key``."""
    return page.locator("tr").filter(has=page.get_by_text(key, exact=True)).first


def partition_page(page: Page, servers: Servers, artifacts: Path, expected: dict[str, Any]) -> None:
    """``manifest``'s partition: its latest metadata is the lifecycle observation (ACTIVE)."""
    partition = expected["partition"]
    page.goto(
        f"http://127.0.0.1:{servers.port}/assets/manifest?view=partitions&partition={partition}"
    )
    expect(page.get_by_text(partition, exact=True).first).to_be_visible()
    expect(metadata_row(page, "state")).to_contain_text("ACTIVE")
    expect(metadata_row(page, "snapshotId")).to_contain_text(expected["snapshotId"])
    expect(metadata_row(page, "generation")).to_contain_text("1")
    expect(metadata_row(page, "approved_by")).to_contain_text(expected["approvedBy"])
    shoot(page, artifacts, "4-manifest-partition")


PAINTED = """canvas => {
  const {data} = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height);
  let painted = 0;
  for (let i = 3; i < data.length; i += 4) painted += data[i] > 0 ? 1 : 0;
  return painted;
}"""


def records_plot(page: Page, servers: Servers, artifacts: Path) -> None:
    """``canonical_records`` overview -> Metadata -> Plots: a drawn chart titled ``records``."""
    page.goto(f"http://127.0.0.1:{servers.port}/assets/canonical_records")
    page.get_by_role("button", name="Plots").click()
    title = page.locator("span", has_text=re.compile(r"^records$"))
    plot = title.locator("xpath=ancestor::div[.//canvas][1]")
    canvas = plot.locator("canvas")
    expect(canvas).to_have_count(1)
    canvas.scroll_into_view_if_needed()
    expect(canvas).to_be_visible()
    painted = wait_for("the records chart to be drawn", lambda: canvas.evaluate(PAINTED), 30)
    assert painted > 500, painted  # axes, ticks and the point: far more than a blank canvas
    shoot(page, artifacts, "5-plots")
    plot.screenshot(path=str(artifacts / "6-records-plot.png"))
    print(f"screenshot {artifacts / '6-records-plot.png'}")


def tombstone_on_the_page(
    page: Page, servers: Servers, artifacts: Path, snapshot: dict[str, Any]
) -> None:
    """``tombstone add`` on the CLI; the ``tombstone_audit`` sensor traces it, and the partition
    page shows what it hit while still saying where the snapshot stands."""
    add = [str(BIN / "corpus-assets"), "tombstone", "add", "--record", "essays/e0001"]
    added = subprocess.run(
        [*add, "--reason", "erasure request"],
        env=servers.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert added.returncode == 0, added.stderr
    run = wait_for(
        "the tombstone_audit sensor's run", lambda: finished_run(servers.gql, "tombstone_hits"), 180
    )
    assert run["tags"]["dagster/sensor_name"] == "tombstone_audit"
    assert run["tags"]["corpus/tombstone"] == "1"
    page.goto(
        f"http://127.0.0.1:{servers.port}/assets/manifest?view=partitions"
        f"&partition={snapshot['partition']}"
    )
    expect(metadata_row(page, "tombstone_hits")).to_contain_text("essays/e0001")
    expect(metadata_row(page, "state")).to_contain_text("ACTIVE")
    shoot(page, artifacts, "7-tombstone-hits")


def test_sensor_build_ui_approval_publication_and_pages(
    servers: Servers, page: Page, artifacts: Path
) -> None:
    build = sensor_build(servers)
    (validated,) = corpus_status(servers.env)["snapshots"]
    assert (validated["partition"], validated["state"]) == (
        build["tags"]["dagster/partition"],
        "VALIDATED",
    )
    sid = validated["snapshotId"]

    approval_run = approve_from_launchpad(page, servers, artifacts)
    published(servers, sid)

    status = corpus_status(servers.env)
    (alias,) = status["aliases"]
    assert (alias["alias"], alias["generation"], alias["active"]) == ("demo", 1, sid)
    (snapshot,) = status["snapshots"]
    assert (snapshot["snapshotId"], snapshot["state"]) == (sid, "ACTIVE")
    approved_by = f"dagster-run:{approval_run} claimed:{APPROVER}"
    assert snapshot["approvedBy"] == approved_by

    lineage_graph(page, servers, artifacts)
    partition_page(page, servers, artifacts, {**snapshot, "approvedBy": approved_by})
    records_plot(page, servers, artifacts)
    tombstone_on_the_page(page, servers, artifacts, snapshot)
