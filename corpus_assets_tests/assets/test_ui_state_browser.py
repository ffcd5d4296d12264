"""Where a snapshot stands, its review and its card, as a user sees them in a real browser.

One built pair of snapshots is shared by every test here (builds are the expensive part): the
CLI's ``demo`` builds, approves and activates the first (generation 1), one more essay and
``build`` make the second, VALIDATED, before the servers start. Then, in the UI: the candidate's
shadow diff is visible before the approval is launched, on its partition and in the approval
Launchpad's config once its partition is picked; after the publication sensor activates it
(generation 2) exactly one partition says ``serving`` and the ``alias`` asset says generation 2;
a rollback on the command line moves both again; the manifest's card renders its plots.

Real parts only, as ``test_ui_browser``: ``dagster-webserver`` and ``dagster-daemon`` on loopback
with throwaway homes, stopped by process group; Debian ``chromium`` through Playwright.
"""

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from playwright.sync_api import Page, expect, sync_playwright

from corpus_assets.demo import write_demo
from corpus_assets_tests.assets.test_ui_browser import (
    CHROMIUM,
    metadata_row,
    pick_partition,
    require_chromium,
    shoot,
)
from corpus_assets_tests.ui_servers import (
    BIN,
    REPO,
    Servers,
    corpus_status,
    dagster_home,
    dagster_servers,
    group_alive,
    run_succeeded,
    runs,
    server_env,
    wait_for,
)

pytestmark = pytest.mark.browser
NEW_ESSAY = {"id": "e9000", "text": "A new essay about harbor lanterns, for the second snapshot."}
PLOTS = 8  # core.audit.card_plots.render_plots draws eight


def cli(env: dict[str, str], *argv: str) -> str:
    """``corpus-assets ARGV`` against the test's homes; its stdout (a failure shows stderr)."""
    done = subprocess.run(
        [str(BIN / "corpus-assets"), *argv],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"corpus-assets {' '.join(argv)}: {done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("state-screenshots")
    print(f"UI screenshots: {path}")
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Servers, dict[str, Any]]]:
    """The servers, once the CLI built both snapshots: {old, new} -> their status rows."""
    require_chromium()
    root = tmp_path_factory.mktemp("state")
    home = root / "corpus"
    config = write_demo(home)
    env = server_env(dagster_home(root / "dagster"), home, config)
    cli(env, "demo")  # built, approved, activated: generation 1
    with (home / "demo-sources" / "essays" / "essays-00001.jsonl").open("a") as essays:
        essays.write(json.dumps(NEW_ESSAY) + "\n")
    cli(env, "build")
    old, new = sorted(corpus_status(env)["snapshots"], key=lambda s: s["partition"])
    assert (old["state"], new["state"]) == ("ACTIVE", "VALIDATED")
    logs = root / "logs"
    logs.mkdir()
    with dagster_servers(root / "dagster", home, config, logs) as started:
        print(f"Dagster logs: {logs}")
        yield started, {"old": old, "new": new}
    for group in started.groups:
        assert not group_alive(group.pgid), f"{group.name}'s process group {group.pgid} remains"


@pytest.fixture
def page(artifacts: Path, request: pytest.FixtureRequest) -> Iterator[Page]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            tab.set_default_timeout(60_000)
            expect.set_options(timeout=60_000)
            tab.add_locator_handler(
                tab.get_by_text("Join the Dagster community"),
                lambda: tab.get_by_role("button", name="Skip").click(),
            )
            yield tab
            shoot(tab, artifacts, f"last-page-{request.node.name}")
        finally:
            browser.close()


def partition_page(page: Page, servers: Servers, partition: str) -> None:
    page.goto(
        f"http://127.0.0.1:{servers.port}/assets/manifest?view=partitions&partition={partition}"
    )
    expect(page.get_by_text(partition, exact=True).first).to_be_visible()


def alias_page(page: Page, servers: Servers) -> None:
    """Catalog -> ``alias``: every alias as it stands, from the newest observation."""
    page.goto(f"http://127.0.0.1:{servers.port}/assets/alias")
    expect(page.get_by_text("External Asset").first).to_be_visible()


def serving_shown(page: Page, servers: Servers, partitions: list[str]) -> dict[str, str]:
    """What each partition's page shows as ``serving``, read off the page."""
    shown = {}
    for partition in partitions:
        partition_page(page, servers, partition)
        row = metadata_row(page, "serving")
        expect(row).to_contain_text(re.compile(r"true|false"))
        shown[partition] = "true" if "true" in row.inner_text() else "false"
    return shown


def expect_serving(page: Page, servers: Servers, serving: str, other: str) -> None:
    """``serving`` true on exactly one partition, and its page says so, in the UI."""
    partition_page(page, servers, serving)
    expect(metadata_row(page, "serving")).to_contain_text("true")
    partition_page(page, servers, other)
    expect(metadata_row(page, "serving")).to_contain_text("false")
    shown = serving_shown(page, servers, [serving, other])
    assert shown == {serving: "true", other: "false"}, shown


LAUNCHED = """query Run($runId: ID!) { runOrError(runId: $runId) { ... on Run {
  runConfigYaml tags { key value } } } }"""


def approve_after_review(
    page: Page, servers: Servers, artifacts: Path, candidate: dict[str, Any], served: str
) -> str:
    """Jobs -> approve_snapshot -> Launchpad -> pick the candidate's partition: its review (the
    shadow diff against ``served``) shows in the config editor before anything is launched; then
    Launch Run. The run id once the approval succeeded."""
    page.goto(
        f"http://127.0.0.1:{servers.port}/locations/corpus_assets/jobs/approve_snapshot/playground"
    )
    pick_partition(page, candidate["partition"], artifacts)
    editor = page.locator(".CodeMirror").first
    expect(editor).to_contain_text("+1 added, -0 removed, 0 split migrations")
    expect(editor).to_contain_text("added, e.g.: essays/e9000")
    expect(editor).to_contain_text(served)  # what it is compared against
    expect(editor).to_contain_text("review_digest: 'sha256:")
    assert runs(servers.gql, "approve_snapshot") == []  # read before anything was launched
    shoot(page, artifacts, "2-approval-launchpad-review")
    page.get_by_role("button", name="Launch Run").click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]{36}"))
    run_id = page.url.rsplit("/", 1)[-1].split("?")[0]
    wait_for("the approval run", lambda: run_succeeded(servers.gql, run_id), 180)
    run = servers.gql.query(LAUNCHED, {"runId": run_id})["runOrError"]
    config = yaml.safe_load(run["runConfigYaml"])["ops"]["approve_digest"]["config"]
    assert config["snapshot_id"] == candidate["snapshotId"]  # bound to what was reviewed
    assert config["review_digest"].startswith("sha256:")
    tags = {t["key"]: t["value"] for t in run["tags"]}
    assert tags["dagster/partition"] == candidate["partition"]
    return run_id


def publication_run(servers: Servers) -> dict[str, Any] | None:
    """The publication sensor's activation run once it succeeded (the CLI's ran before)."""
    found = [
        r
        for r in runs(servers.gql, "activate_snapshot")
        if r["tags"].get("dagster/sensor_name") == "publication"
    ]
    if found and found[0]["status"] in ("FAILURE", "CANCELED"):
        raise AssertionError(f"activation run {found[0]['runId']} ended {found[0]['status']}")
    return found[0] if found and found[0]["status"] == "SUCCESS" else None


def test_the_review_shows_before_approval_and_one_partition_serves_after_each_move(
    pair: tuple[Servers, dict[str, Any]], page: Page, artifacts: Path
) -> None:
    servers, snaps = pair
    old, new = snaps["old"], snaps["new"]
    expect_serving(page, servers, old["partition"], new["partition"])

    # before anything is launched: the candidate's review and what the default would approve
    partition_page(page, servers, new["partition"])
    review = metadata_row(page, "review")
    expect(review).to_contain_text(f"generation 1: {old['snapshotId']}")
    expect(review).to_contain_text("+1 added")
    expect(review).to_contain_text("essays/e9000")
    shoot(page, artifacts, "1a-candidate-review")
    alias_page(page, servers)
    summary = metadata_row(page, "summary")
    expect(summary).to_contain_text(f"would approve {new['snapshotId']}")
    expect(summary).to_contain_text("+1 added")
    expect(summary).to_contain_text("generation 1")
    shoot(page, artifacts, "1b-alias-before-approval")
    page.goto(f"http://127.0.0.1:{servers.port}/locations/corpus_assets/jobs/approve_snapshot")
    expect(page.get_by_text("Pick the candidate's partition").first).to_be_visible()

    approve_after_review(page, servers, artifacts, new, old["snapshotId"])
    wait_for("the publication sensor's activation", lambda: publication_run(servers), 240)
    (alias,) = corpus_status(servers.env)["aliases"]
    assert (alias["generation"], alias["active"]) == (2, new["snapshotId"])
    expect_serving(page, servers, new["partition"], old["partition"])
    alias_page(page, servers)
    summary = metadata_row(page, "summary")
    expect(summary).to_contain_text(f"Serves {new['snapshotId']}")
    expect(summary).to_contain_text("generation 2")
    shoot(page, artifacts, "3-alias-generation-2")

    # a move on the command line shows at once too: no run, the CLI observes it
    cli(servers.env, "rollback", old["snapshotId"])
    expect_serving(page, servers, old["partition"], new["partition"])
    alias_page(page, servers)
    expect(metadata_row(page, "summary")).to_contain_text("generation 3")
    shoot(page, artifacts, "4-alias-after-cli-rollback")


def test_the_manifest_shows_its_dataset_card_with_the_plots_drawn(
    pair: tuple[Servers, dict[str, Any]], page: Page, artifacts: Path
) -> None:
    servers, snaps = pair
    partition_page(page, servers, snaps["new"]["partition"])
    card = metadata_row(page, "card")
    card.get_by_text("[Show Markdown]").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text(f"Dataset card of {snaps['new']['snapshotId']}")
    images = dialog.locator("img")
    expect(images).to_have_count(PLOTS)
    drawn = "imgs => imgs.filter(i => i.complete && i.naturalWidth > 0).length"
    wait_for("every card plot to be drawn", lambda: images.evaluate_all(drawn) == PLOTS, 30)
    shoot(page, artifacts, "5-card")
