"""Command-line moves show in the Dagster instance at once, derived (``assets.lifecycle``): the
CLI's approve, activate, rollback and gc each leave fresh observations on every partition whose
standing changed and on the ``alias`` asset, read back here as the UI reads them (newest value
per key). The browser test shows the same pages; this one covers the moves it does not make."""

import json
from pathlib import Path

import dagster as dg

from corpus_assets.cli.main import main
from corpus_assets.core.audit.card import load_card
from corpus_assets.core.audit.card_html import card_markdown
from corpus_assets.core.governance import states
from corpus_assets.core.runtime.workspace import open_workspace


def _newest(instance: dg.DagsterInstance, asset: str, partition: str | None) -> dict[str, object]:
    """Each metadata key's newest observed value, as the partition page shows them."""
    where = dg.AssetRecordsFilter(
        asset_key=dg.AssetKey(asset), asset_partitions=[partition] if partition else None
    )
    shown: dict[str, object] = {}
    for record in instance.fetch_observations(where, limit=100).records:  # newest first
        for key, value in record.asset_observation.metadata.items():
            shown.setdefault(key, value.value)
    return shown


def _run(*argv: str) -> None:
    assert main(list(argv)) == 0, argv


def test_cli_moves_observe_every_partition_they_change_and_the_alias(demo_home: Path) -> None:
    _run("demo")  # p1 built, approved, activated: generation 1
    essays = demo_home / "demo-sources" / "essays" / "essays-00001.jsonl"
    with essays.open("a") as out:
        out.write(json.dumps({"id": "e9000", "text": "One more essay, a second snapshot."}) + "\n")
    _run("build", "--partition", "p2")
    with open_workspace() as ws:
        (old,) = [s for s in states.find(ws.catalog) if s.partition_key != "p2"]
        (new,) = states.for_partition(ws.catalog, "p2")
    _run("approve", new.snapshot_id, "--by", "cli-test")
    with dg.DagsterInstance.get() as instance:
        # the card on the materialization is the signed snapshot's card, drawn again the same
        built = (
            instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("manifest"), asset_partitions=["p2"]), 1
            )
            .records[0]
            .asset_materialization.metadata
        )
        with open_workspace() as ws:
            again = card_markdown(load_card(ws.cas, ws.catalog, new.snapshot_id))
        assert built["card"].value == again and again.count("](data:image/png;base64,") == 8
        assert Path(str(built["card_page"].value)).is_file()
        review = _newest(instance, "manifest", "p2")
        assert review["state"] == states.APPROVED and "+1 added" in str(review["review"])
        _run("activate", new.snapshot_id)
        assert _newest(instance, "manifest", "p2")["serving"] is True
        assert _newest(instance, "manifest", old.partition_key)["serving"] is False
        assert "generation 2" in str(_newest(instance, "alias", None)["summary"])

        _run("rollback", old.snapshot_id)  # no run: the CLI reports the observations itself
        assert _newest(instance, "manifest", old.partition_key)["serving"] is True
        assert _newest(instance, "manifest", "p2")["serving"] is False
        assert "generation 3" in str(_newest(instance, "alias", None)["summary"])

        # gc with one kept generation expires p2 (served at generation 2 only)
        with (demo_home / "corpus.yaml").open("a") as out:
            out.write("retention: {keep_generations: 1}\n")
        _run("gc")
        expired = _newest(instance, "manifest", "p2")
        assert (expired["state"], expired["serving"]) == (states.EXPIRED, False)
        assert "EXPIRED" in str(expired["review"])
