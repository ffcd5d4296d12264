"""``changelog`` (CDC) sources through the freeze, validation and activation."""

import json
from pathlib import Path

import pytest

from corpus_assets.core.governance import states
from corpus_assets.core.ingest.freeze_spec import FreezeSpec
from corpus_assets.core.ingest.pinning import late_changes
from corpus_assets.core.ingest.sources import fingerprint
from corpus_assets.core.pipeline import build_all
from corpus_assets.core.publication.publish import PublishError, activate, approve
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.workspace import Workspace, open_workspace


def _event(lsn: int, op: str, key: int, body: str | None = None) -> dict:
    row = None if body is None else {"id": key, "body": body}
    before = {"id": key, "body": "old"} if op in ("u", "d") else None
    return {"op": op, "before": before, "after": row, "source": {"lsn": lsn}}


def _segment(folder: Path, name: str, events: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps(e) + "\n" for e in events))


def _workspace(tmp_path: Path) -> Workspace:
    config = tmp_path / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: cdc-test\nstorage: {{home: {tmp_path / 'home'}}}\n"
        "sources:\n  - {id: tickets, kind: changelog, path: cdc, key_field: id, "
        "text_field: body}\n"
    )
    return open_workspace(config)


LOG = [
    _event(1, "c", 1, "first ticket"),
    _event(2, "c", 2, "second ticket"),
    _event(3, "c", 3, "third ticket"),
    _event(4, "u", 2, "second ticket, edited"),
    _event(5, "d", 3),
    _event(6, "r", 4, "snapshot-read ticket"),
]


def _freeze(ws: Workspace, key: str) -> dict:
    return json.loads(ws.cas.get_bytes(ws.catalog.freeze_digest(key)))


def _spec(ws: Workspace, key: str) -> FreezeSpec:
    return FreezeSpec.load(ws.cas, ws.catalog.freeze_digest(key))


def test_log_is_folded_at_its_watermark_and_later_events_wait(tmp_path: Path) -> None:
    _segment(tmp_path / "cdc", "000.jsonl", LOG[:3])
    _segment(tmp_path / "cdc", "001.jsonl", LOG[3:])
    with _workspace(tmp_path) as ws:
        results = build_all(ws, "p1")
        (source,) = _freeze(ws, "p1")["sources"]
        assert (source["watermark"], source["events"], source["gaps"]) == ("6", 6, [])
        assert results["canonical_records"].counts["records"] == 3  # tickets 1, 2, 4
        canonical = CanonicalIndex.load(ws.cas, results["canonical_records"].digest)
        records = canonical.table(["record_id", "cdc_lsn"]).to_pylist()
        # lineage names the CDC key (in the record id) and the lsn that last wrote the row
        assert {r["record_id"]: r["cdc_lsn"] for r in records} == {
            "tickets/1": "1",
            "tickets/2": "4",
            "tickets/4": "6",
        }
        report = validate_snapshot(ws, results["manifest"].digests["snapshotId"])
        assert report.ok, report.findings

        before = fingerprint(ws.loaded)
        _segment(tmp_path / "cdc", "002.jsonl", [_event(7, "c", 5, "after the freeze")])
        assert fingerprint(ws.loaded) != before  # the sensor sees a new head offset
        again = build_all(ws, "p1")  # the same partition keeps its freeze and its bytes
        snapshot = again["manifest"].digests["snapshotId"]
        assert snapshot == results["manifest"].digests["snapshotId"]
        assert late_changes(ws)(_spec(ws, "p1")) == []  # lsn 7 belongs to the next snapshot

        build_all(ws, "p2")
        assert _freeze(ws, "p2")["sources"][0]["watermark"] == "7"


def test_a_half_written_last_line_belongs_to_the_next_snapshot(tmp_path: Path) -> None:
    """The freeze stops before a line the writer has not ended: the build succeeds without it
    and validates; once the line is ended, the next snapshot has it once and the first is not
    made INCOMPLETE by it."""
    _segment(tmp_path / "cdc", "000.jsonl", LOG[:5])
    line = json.dumps(_event(6, "r", 4, "snapshot-read ticket")).encode()
    with (tmp_path / "cdc" / "000.jsonl").open("ab") as handle:
        handle.write(line[:30])
    with _workspace(tmp_path) as ws:
        results = build_all(ws, "p1")
        (source,) = _freeze(ws, "p1")["sources"]
        assert (source["watermark"], source["events"], source["gaps"]) == ("5", 5, [])
        assert source["segments"][0]["pendingBytes"] == 30
        assert results["canonical_records"].counts["records"] == 2  # tickets 1, 2
        sid = results["manifest"].digests["snapshotId"]
        assert validate_snapshot(ws, sid).ok

        with (tmp_path / "cdc" / "000.jsonl").open("ab") as handle:
            handle.write(line[30:] + b"\n")
        assert late_changes(ws)(_spec(ws, "p1")) == []
        later = build_all(ws, "p2")
        (source,) = _freeze(ws, "p2")["sources"]
        assert (source["watermark"], source["events"]) == ("6", 6)
        assert "pendingBytes" not in source["segments"][0]
        canonical = CanonicalIndex.load(ws.cas, later["canonical_records"].digest)
        records = canonical.table(["record_id", "cdc_lsn"]).to_pylist()
        assert sorted((r["record_id"], r["cdc_lsn"]) for r in records) == [
            ("tickets/1", "1"),
            ("tickets/2", "4"),
            ("tickets/4", "6"),
        ]
        assert validate_snapshot(ws, later["manifest"].digests["snapshotId"]).ok


def test_offset_gap_makes_the_snapshot_incomplete_naming_the_range(tmp_path: Path) -> None:
    _segment(tmp_path / "cdc", "000.jsonl", [LOG[0], LOG[1]])
    _segment(tmp_path / "cdc", "001.jsonl", [LOG[5]])  # lsn 3..5 missing
    with _workspace(tmp_path) as ws:
        results = build_all(ws, "p1")
        sid = results["manifest"].digests["snapshotId"]
        report = validate_snapshot(ws, sid)
        assert "source 'tickets': CDC offsets missing lsn 3-5 (watermark 6)" in report.findings
        assert states.get(ws.catalog, sid).state == states.INCOMPLETE

        # the missing events arrive late: still INCOMPLETE, and now named as late
        _segment(tmp_path / "cdc", "002.jsonl", LOG[2:5])
        late = late_changes(ws)(_spec(ws, "p1"))
        assert any("lsn 3" in f and "after the freeze" in f for f in late), late


def test_rewritten_old_event_stops_activation(tmp_path: Path) -> None:
    _segment(tmp_path / "cdc", "000.jsonl", LOG)
    with _workspace(tmp_path) as ws:
        sid = build_all(ws, "p1")["manifest"].digests["snapshotId"]
        assert validate_snapshot(ws, sid).ok
        approve(ws, sid, by="alice")
        changed = [*LOG]
        changed[1] = _event(2, "c", 2, "second ticket, silently rewritten")
        _segment(tmp_path / "cdc", "000.jsonl", changed)
        with pytest.raises(PublishError, match="INCOMPLETE"):
            activate(ws, sid, actor="test")
        assert states.get(ws.catalog, sid).state == states.INCOMPLETE
