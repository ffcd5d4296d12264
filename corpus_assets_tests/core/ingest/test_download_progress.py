"""Retries count attempts without progress, a server ignoring Range is bounded by a byte budget,
and resume-only mode leaves nothing behind for a download it refuses, over the real
loopback server."""

import json
import random
import re
from pathlib import Path

import pytest

from corpus_assets.core.ingest.download import OverBudget, ResumeRefused
from corpus_assets.core.ingest.pinning import PinError
from corpus_assets.core.ingest.remote_http import DownloadError
from corpus_assets.core.pipeline import BUILDERS
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.selftest.http_server import LoopbackServer
from corpus_assets_tests.core.ingest import test_download
from corpus_assets_tests.core.ingest.test_download import (
    BODY,
    SIZE,
    Drop,
    assert_published,
    checkpoint_of,
    fetch,
)
from corpus_assets_tests.core.ingest.test_download_validate import Serve

serve = test_download.serve  # the loopback server and CAS fixtures of the download tests
cas = test_download.cas

EVERY = 15_000  # the server drops every this many body bytes


def test_a_server_dropping_every_15_kb_honouring_range_completes(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    """~210 drops, each after progress: none of them counts towards giving up."""
    drops = -(-SIZE // EVERY) - 1
    remote, url = serve(drops=[Drop(EVERY, "fin")] * drops)
    fetched = fetch(url, cas, tmp_path / "work")
    assert_published(fetched, cas, tmp_path / "work")
    assert remote.gets == drops + 1 and not remote.drops
    assert fetched.bytes_transferred == SIZE and remote.sent <= 1.5 * SIZE
    assert fetched.restarts == 0 and fetched.resumed


def test_attempts_without_progress_give_up_and_progress_resets_the_count(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    """Two fruitless attempts, one that advances, two more fruitless: the limit of three in a row
    is never reached; then three fruitless ones in a row give up, naming the URL and byte."""
    nothing = Drop(0, "fin")
    remote, url = serve(drops=[nothing, nothing, Drop(100_000, "fin"), nothing, nothing])
    fetched = fetch(url, cas, tmp_path / "a", max_attempts_without_progress=3)
    assert_published(fetched, cas, tmp_path / "a")
    assert remote.gets == 6

    remote, url = serve(drops=[Drop(100_000, "fin"), nothing, nothing, nothing])
    expected = (
        re.escape(url) + ": gave up after 3 attempts in a row without progress at byte 100000"
    )
    with pytest.raises(DownloadError, match=expected):
        fetch(url, cas, tmp_path / "b", max_attempts_without_progress=3)
    assert remote.gets == 4


def _ignoring_range_message(url: str) -> str:
    return re.escape(url) + r": .*the server ignores Range .* and keeps dropping the connection"


@pytest.mark.parametrize("chunked", [False, True], ids=["sized", "chunked"])
def test_a_server_ignoring_range_and_dropping_at_random_offsets_stops_at_the_budget(
    serve: Serve, cas: ContentStore, tmp_path: Path, chunked: bool
) -> None:
    """Each answer re-sends the object from byte zero and drops somewhere in it, often further
    than before (progress): the byte budget, not the attempt count, ends it. Chunked answers
    announce no size: the budget then multiplies the longest prefix received."""
    rng = random.Random(19)
    offsets = [rng.randrange(SIZE // 4, SIZE) for _ in range(200)]
    remote, url = serve(
        honor_range=False, chunked=chunked, drops=[Drop(offset=o, how="fin") for o in offsets]
    )
    with pytest.raises(OverBudget, match=_ignoring_range_message(url)) as raised:
        fetch(url, cas, tmp_path / "work")
    found = re.search(
        r"(\d+) bytes received, and (\d+) more would pass the budget of 3x", str(raised.value)
    )
    assert found is not None, raised.value
    assert int(found[1]) <= 3 * SIZE
    # the server may have pushed part of the one answer the client then refused to read
    assert remote.sent <= 4 * SIZE, f"{remote.sent / SIZE:.1f}x the object sent"
    assert remote.gets < 10


def test_a_restart_to_a_much_smaller_version_is_within_the_budget(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    """The budget multiplies the largest size seen: the bytes of an abandoned big version do
    not count against a small new one."""
    remote, url = serve(drops=[Drop(2 << 20, "fin")])
    small = BODY[:100_000]
    remote.after_drop = lambda r: r.change(small, '"v2"')
    fetched = fetch(url, cas, tmp_path / "work")
    assert_published(fetched, cas, tmp_path / "work", small)
    assert fetched.restarts == 1 and fetched.bytes_transferred == (2 << 20) + len(small)


def test_a_server_ignoring_range_and_dropping_every_15_kb_is_named(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    """Each answer starts again at byte zero and drops at the same place: no attempt advances."""
    remote, url = serve(honor_range=False, drops=[Drop(EVERY, "fin")] * 50)
    with pytest.raises(DownloadError, match=_ignoring_range_message(url)):
        fetch(url, cas, tmp_path / "work", max_attempts_without_progress=5)
    assert remote.gets == 6 and remote.sent == 6 * EVERY


def _failed_freeze(tmp_path: Path, url: str) -> str:
    """The freeze (what ``build`` runs first) of one URL, which must fail; its pin error."""
    config = tmp_path / "corpus.yaml"
    config.write_text(
        f"version: 1\npurpose: downloads\nstorage: {{home: {tmp_path / 'home'}}}\n"
        f"sources:\n  - {{id: web, kind: objects, urls: [{json.dumps(url)}]}}\n"
    )
    with open_workspace(config) as ws, pytest.raises(PinError) as raised:
        BUILDERS["raw_snapshot"](ws, "p1")
    return str(raised.value)


def test_a_freeze_spends_the_budget_once_on_a_server_ignoring_range(tmp_path: Path) -> None:
    """The pin reports the server at once instead of retrying the task (3 tries, 3 budgets)."""
    rng = random.Random(19)
    with LoopbackServer() as server:
        remote = server.put("/a.jsonl", BODY)
        remote.honor_range = False
        remote.drops = [Drop(offset=rng.randrange(SIZE // 4, SIZE), how="fin") for _ in range(200)]
        url = server.url("/a.jsonl")
        error = _failed_freeze(tmp_path, url)
        sent = remote.sent
    assert re.search(_ignoring_range_message(url), error), error
    assert sent <= 4 * SIZE, f"{sent / SIZE:.1f}x the object sent"


def test_resume_only_leaves_no_file_for_a_download_it_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``build --resume-only`` sets ``CORPUS_RESUME_ONLY``, which the pin reads."""
    monkeypatch.setenv("CORPUS_RESUME_ONLY", "1")
    with LoopbackServer() as server:
        server.put("/a.jsonl", b'{"id": 1, "text": "a"}\n')
        url = server.url("/a.jsonl")
        error = _failed_freeze(tmp_path, url)
        assert server.objects["/a.jsonl"].gets == 0
    assert url in error and "resume-only" in error
    downloads = tmp_path / "home" / "downloads"
    assert not downloads.exists() or list(downloads.iterdir()) == []


def test_resume_only_leaves_an_unusable_partial_untouched(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    """A partial without a checkpoint, and a checkpoint without its partial: both refused, and
    what was on disk is exactly what stays."""
    _remote, url = serve()
    work = tmp_path / "work"
    work.mkdir()
    partial = checkpoint_of(work, url).with_suffix("")
    partial.write_bytes(BODY[:1000])
    with pytest.raises(ResumeRefused, match=re.escape(url) + ".*no checkpoint"):
        fetch(url, cas, work, resume_only=True)
    assert list(work.iterdir()) == [partial] and partial.read_bytes() == BODY[:1000]

    partial.rename(tmp_path / "elsewhere")
    checkpoint_of(work, url).write_text("{}")
    with pytest.raises(ResumeRefused, match=re.escape(url) + ".*no partial file"):
        fetch(url, cas, work, resume_only=True)
    assert list(work.iterdir()) == [checkpoint_of(work, url)]
