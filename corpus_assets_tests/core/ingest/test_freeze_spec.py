"""The typed freeze spec writes exactly the stored document, and refuses malformed ones by name."""

import copy
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corpus_assets.core.ingest.freeze import freeze
from corpus_assets.core.ingest.freeze_spec import (
    ChangelogSourceSpec,
    FreezeSpec,
    FreezeSpecError,
    ObjectsSourceSpec,
)
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.digests import canonical_json, json_digest
from corpus_assets.selftest.http_server import LoopbackServer, Remote

ROW = json.dumps({"id": "w1", "text": "a web document"}).encode() + b"\n"


@pytest.fixture
def base_url() -> Iterator[str]:
    """Two objects: one versioned by ETag, one by Last-Modified."""
    objects = {
        "/etag.jsonl": Remote(body=ROW, etag='"v1"', last_modified=None),
        "/dated.jsonl": Remote(body=ROW, etag=None, last_modified="Tue, 01 Jul 2025"),
    }
    with LoopbackServer(objects=objects) as server:
        yield server.url("")


def _event(lsn: int, key: int, body: str) -> str:
    return json.dumps(
        {"op": "c", "before": None, "after": {"id": key, "body": body}, "source": {"lsn": lsn}}
    )


@pytest.fixture
def every_kind(tmp_path: Path, base_url: str) -> Iterator[Workspace]:
    """A changelog with a gap (so the freeze is incomplete) and a half-written last line, and an
    index source listing an ETag object, a Last-Modified object and a local file."""
    (tmp_path / "cdc").mkdir()
    (tmp_path / "cdc" / "000.jsonl").write_text(
        _event(1, 1, "one") + "\n" + _event(4, 2, "two") + "\n" + _event(5, 3, "three")[:9]
    )
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "c.jsonl").write_bytes(ROW)
    (tmp_path / "index.txt").write_text(
        f"{base_url}/etag.jsonl\n{base_url}/dated.jsonl\nlocal/c.jsonl\n"
    )
    config = tmp_path / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: freeze-spec-test\nstorage: {{home: {tmp_path / 'home'}}}\n"
        "sources:\n"
        "  - {id: tickets, kind: changelog, path: cdc, key_field: id, text_field: body}\n"
        "  - {id: web, kind: objects, index: index.txt}\n"
    )
    with open_workspace(config) as ws:
        yield ws


def _assert_round_trip(ws: Workspace) -> FreezeSpec:
    ref, spec = freeze(ws, "p1")
    stored = ws.cas.get_bytes(ref["digest"])
    assert canonical_json(spec.document()) == stored
    assert json_digest(spec.document()) == ref["digest"]
    assert FreezeSpec.load(ws.cas, ref["digest"]) == spec
    return spec


def test_demo_freeze_round_trips_to_the_stored_bytes(workspace: Workspace) -> None:
    spec = _assert_round_trip(workspace)
    assert spec.schema_id == "corpus.freeze.v1" and spec.partition == "p1"
    assert all(isinstance(s, ObjectsSourceSpec) for s in spec.sources)
    assert spec.tombstone_watermark == 0 and spec.incomplete == []


def test_every_member_kind_round_trips_to_the_stored_bytes(every_kind: Workspace) -> None:
    spec = _assert_round_trip(every_kind)
    tickets, web = spec.sources
    assert isinstance(tickets, ChangelogSourceSpec) and isinstance(web, ObjectsSourceSpec)
    assert (tickets.watermark, tickets.start_lsn, tickets.gaps) == (4, 1, [(2, 3)])
    assert tickets.objects[0].rows == 2 and len(tickets.segments) == 1
    assert tickets.segments[0].pending_bytes == 9
    assert web.index is not None and web.index.location.endswith("/index.txt")
    versions = {o.name.rsplit("/", 1)[-1]: (o.etag, o.last_modified) for o in web.objects}
    assert versions == {
        "etag.jsonl": ('"v1"', None),
        "dated.jsonl": (None, "Tue, 01 Jul 2025"),
        "c.jsonl": (None, None),
    }
    assert spec.incomplete and "missing lsn 2-3" in spec.incomplete[0]
    document = spec.document()
    assert document["sources"][0]["gaps"] == [["2", "3"]]  # offsets stay decimal strings
    dated = next(o for o in document["sources"][1]["objects"] if o["name"].endswith("dated.jsonl"))
    assert "lastModified" in dated and "etag" not in dated  # absent, not null
    assert document["sources"][0]["segments"][0]["pendingBytes"] == 9


def _set(path: tuple[str | int, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        target: Any = document
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return change


def _drop(path: tuple[str | int, ...]) -> Callable[[dict[str, Any]], None]:
    def change(document: dict[str, Any]) -> None:
        target: Any = document
        for part in path[:-1]:
            target = target[part]
        del target[path[-1]]

    return change


@pytest.mark.parametrize(
    ("change", "member", "why"),
    [
        (_drop(("sources", 1, "objects", 0, "sha256")), "sources[1].objects[0].sha256", "required"),
        (_set(("sources", 0, "watermark"), 4), "sources[0].watermark", "decimal string"),
        (_set(("tombstoneWatermark",), "007"), "tombstoneWatermark", "no leading zeros"),
        (_set(("sources", 0, "gaps", 0), ["2"]), "sources[0].gaps[0][1]", "required"),
        (_set(("sources", 0, "events"), "2"), "sources[0].events", "integer"),
        (
            _set(("sources", 0, "segments", 0, "pendingBytes"), 0),
            "sources[0].segments[0].pendingBytes",
            "greater than or equal to 1",
        ),
        (_set(("sources", 1, "objects", 0, "etag"), None), "sources[1].objects[0]", "null"),
        (_set(("sources", 1, "kind"), "tape"), "sources[1]", "'tape'"),
        (_set(("sources", 0, "eventsDigest"), "sha256:abc"), "sources[0].eventsDigest", "64"),
        (_set(("surprise",), 1), "surprise", "Extra inputs"),
        (_set(("schema",), "corpus.freeze.v2"), "schema", "corpus.freeze.v1"),
    ],
)
def test_malformed_spec_is_refused_naming_the_member(
    every_kind: Workspace, change: Callable[[dict[str, Any]], None], member: str, why: str
) -> None:
    _, spec = freeze(every_kind, "p1")
    document = spec.document()
    broken = copy.deepcopy(document)
    change(broken)
    with pytest.raises(FreezeSpecError) as info:
        FreezeSpec.parse(broken)
    message = str(info.value)
    assert re.search(rf"(^|; |: ){re.escape(member)}: ", message), message
    assert why in message
