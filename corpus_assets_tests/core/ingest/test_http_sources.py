"""``objects`` sources over real loopback HTTP: listed URLs, index files, formats, and objects that
change, vanish or appear while a freeze is scanning."""

import gzip
import hashlib
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from sqlalchemy import select

from corpus_assets.core.ingest.pinning import PinError
from corpus_assets.core.ingest.sources import fingerprint
from corpus_assets.core.pipeline import BUILDERS, build_all
from corpus_assets.core.publication.validation import validate_snapshot
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.catalog import chunk_tasks
from corpus_assets.selftest.http_server import LoopbackServer


@pytest.fixture
def site() -> Iterator[tuple[LoopbackServer, str]]:
    """A loopback server of objects put by path, and its base URL."""
    with LoopbackServer() as server:
        yield server, server.url("")


def _jsonl(prefix: str, n: int) -> bytes:
    return "".join(
        json.dumps({"id": f"{prefix}{i}", "text": f"{prefix} document number {i}"}) + "\n"
        for i in range(n)
    ).encode()


def _parquet(prefix: str, n: int) -> bytes:
    table = pa.table(
        {
            "id": [f"{prefix}{i}" for i in range(n)],
            "text": [f"{prefix} parquet row {i}" for i in range(n)],
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _workspace(tmp_path: Path, source: str) -> Workspace:
    config = tmp_path / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: http-test\nstorage: {{home: {tmp_path / 'home'}}}\n"
        f"sources:\n  - {source}\n"
    )
    return open_workspace(config)


def test_listed_urls_in_three_formats_build_and_validate(site, tmp_path: Path) -> None:
    web, base = site
    web.put("/a.jsonl.zst", zstandard.compress(_jsonl("a", 40)))
    web.put("/b.jsonl.gz", gzip.compress(_jsonl("b", 30), mtime=0))
    web.put("/c.parquet", _parquet("c", 20))
    urls = [f"{base}/a.jsonl.zst", f"{base}/b.jsonl.gz", f"{base}/c.parquet"]
    with _workspace(tmp_path, f"{{id: web, kind: objects, urls: {json.dumps(urls)}}}") as ws:
        results = build_all(ws, "p1")
        spec = json.loads(ws.cas.get_bytes(ws.catalog.freeze_digest("p1")))
        (source,) = spec["sources"]
        assert [(o["name"], o["format"]) for o in source["objects"]] == [
            (urls[0], "jsonl"),
            (urls[1], "jsonl"),
            (urls[2], "parquet"),
        ]
        for entry in source["objects"]:
            path = entry["name"].removeprefix(base)
            assert entry["etag"] == web.objects[path].etag
            assert entry["sha256"] == "sha256:" + hashlib.sha256(web.objects[path].body).hexdigest()
        assert source["deferred"] == []
        assert results["canonical_records"].counts["records"] == 90
        report = validate_snapshot(ws, results["manifest"].digests["snapshotId"])
        assert report.ok, report.findings


def test_changes_during_the_scan_belong_to_the_next_snapshot(site, tmp_path: Path) -> None:
    web, base = site
    for name in "abc":
        web.put(f"/{name}.jsonl", _jsonl(name, 5))
    web.put("/index.txt", b"a.jsonl\nb.jsonl\nc.jsonl\n")
    pinned_a = "sha256:" + hashlib.sha256(web.objects["/a.jsonl"].body).hexdigest()

    def mutate() -> None:  # runs once the freeze has fetched b (a is already pinned)
        web.put("/a.jsonl", _jsonl("a-rewritten", 5))
        web.put("/d.jsonl", _jsonl("d", 5))
        web.put("/index.txt", b"a.jsonl\nb.jsonl\nc.jsonl\nd.jsonl\n")

    web.objects["/b.jsonl"].after_get = mutate
    with _workspace(tmp_path, f"{{id: web, kind: objects, index: {base}/index.txt}}") as ws:
        listed = fingerprint(ws.loaded)
        BUILDERS["raw_snapshot"](ws, "p1")
        spec = json.loads(ws.cas.get_bytes(ws.catalog.freeze_digest("p1")))
        (source,) = spec["sources"]
        objects = {o["name"].removeprefix(base): o for o in source["objects"]}
        assert set(objects) == {"/a.jsonl", "/b.jsonl", "/c.jsonl"}
        assert objects["/a.jsonl"]["sha256"] == pinned_a  # the pinned version wins
        assert [
            (d["name"].removeprefix(base), d["change"], d["pinned"]) for d in source["deferred"]
        ] == [
            ("/a.jsonl", "changed", True),
            ("/d.jsonl", "added", False),
        ]
        # the index bytes pinned are those the objects were listed from, not the rewrite
        listed_index = b"a.jsonl\nb.jsonl\nc.jsonl\n"
        assert source["index"]["digest"] == "sha256:" + hashlib.sha256(listed_index).hexdigest()
        assert fingerprint(ws.loaded) != listed  # the sensor will see the next snapshot
        # the pinned copy is what later layers read, not the rewritten object
        canonical = BUILDERS["canonical_records"](ws, "p1")
        assert canonical.counts["records"] == 15


def test_an_object_deleted_before_its_copy_fails_the_freeze_and_a_rerun_works(
    site, tmp_path: Path
) -> None:
    """An object listed, then gone before it was fetched, used to be deferred as
    removed and its records were silently missing from a snapshot that validated."""
    web, base = site
    for name in "abc":
        web.put(f"/{name}.jsonl", _jsonl(name, 5))
    web.put("/index.txt", b"a.jsonl\nb.jsonl\nc.jsonl\n")

    def delete() -> None:  # once b is fetched: c is listed but not yet copied
        web.remove("/c.jsonl")
        web.put("/index.txt", b"a.jsonl\nb.jsonl\n")

    web.objects["/b.jsonl"].after_get = delete
    with _workspace(tmp_path, f"{{id: web, kind: objects, index: {base}/index.txt}}") as ws:
        with pytest.raises(PinError, match=r"deleted before they could be copied: .*/c\.jsonl"):
            BUILDERS["raw_snapshot"](ws, "p1")
        assert ws.catalog.freeze_digest("p1") is None  # nothing frozen
        BUILDERS["raw_snapshot"](ws, "p1")  # the rerun freezes the source as it is now
        spec = json.loads(ws.cas.get_bytes(ws.catalog.freeze_digest("p1")))
        (source,) = spec["sources"]
        assert [o["name"].removeprefix(base) for o in source["objects"]] == ["/a.jsonl", "/b.jsonl"]
        assert source["deferred"] == []


def test_downloads_run_on_the_task_runner_and_pin_the_same_bytes(site, tmp_path: Path) -> None:
    """With two workers the objects are fetched in pool processes, not the driver, and the
    freeze spec is byte-for-byte the one-worker freeze's."""
    web, base = site
    for name in "abcd":
        web.put(f"/{name}.jsonl.zst", zstandard.compress(_jsonl(name, 50)))
    urls = json.dumps([f"{base}/{name}.jsonl.zst" for name in "abcd"])
    freezes, owners = [], []
    for workers in (1, 2):
        root = tmp_path / f"workers-{workers}"
        root.mkdir()
        (root / "corpus.yaml").write_text(
            f"version: 1\npurpose: http-test\nstorage: {{home: {root / 'home'}}}\n"
            f"execution: {{workers: {workers}, in_process_bytes: 0}}\n"
            f"sources:\n  - {{id: web, kind: objects, urls: {urls}}}\n"
        )
        with open_workspace(root / "corpus.yaml") as ws:
            BUILDERS["raw_snapshot"](ws, "p1")
            freezes.append(ws.cas.get_bytes(ws.catalog.freeze_digest("p1")))
            with ws.catalog.begin() as conn:
                rows = conn.execute(
                    select(chunk_tasks.c.owner).where(chunk_tasks.c.layer == "raw_snapshot")
                ).scalars()
                owners.append({int(owner.split(":")[1]) for owner in rows})
    assert owners[0] == {os.getpid()}
    assert owners[1] and os.getpid() not in owners[1]
    assert freezes[0] == freezes[1]


def test_a_truncated_remote_object_fails_its_pin_naming_it(site, tmp_path: Path) -> None:
    """The object is decoded while it downloads: a cut zstd stream fails the freeze at the pin
    (no retries, no freeze written), not later in canonicalisation; the intact one is pinned."""
    web, base = site
    web.put("/good.jsonl.zst", zstandard.compress(_jsonl("g", 40)))
    web.put("/cut.jsonl.zst", zstandard.compress(_jsonl("c", 400))[:-50])
    urls = json.dumps([f"{base}/good.jsonl.zst", f"{base}/cut.jsonl.zst"])
    with _workspace(tmp_path, f"{{id: web, kind: objects, urls: {urls}}}") as ws:
        with pytest.raises(PinError, match=f"{base}/cut.jsonl.zst: .*zstd stream is truncated"):
            BUILDERS["raw_snapshot"](ws, "p1")
        assert ws.catalog.freeze_digest("p1") is None
        with ws.catalog.begin() as conn:
            rows = conn.execute(
                select(chunk_tasks.c.chunk_key, chunk_tasks.c.status, chunk_tasks.c.attempts)
            ).all()
        status = {key.rsplit("/", 1)[-1]: (state, attempts) for key, state, attempts in rows}
        assert status["good.jsonl.zst"][0] == "SUCCESS"
        assert status["cut.jsonl.zst"] == ("FAILED", 1)  # refused once, not retried
