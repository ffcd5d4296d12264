"""Resume-only mode leaves nothing behind for a download it refuses (issue 19), over the real
loopback server."""

import json
import re
from pathlib import Path

import pytest

from corpus_assets.core.ingest.download_transfer import ResumeRefused
from corpus_assets.core.ingest.pinning import PinError
from corpus_assets.core.pipeline import BUILDERS
from corpus_assets.core.runtime.workspace import open_workspace
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.selftest.http_server import LoopbackServer
from corpus_assets_tests import test_download
from corpus_assets_tests.test_download import (
    BODY,
    checkpoint_of,
    fetch,
)
from corpus_assets_tests.test_download_validate import Serve

serve = test_download.serve  # the loopback server and CAS fixtures of the download tests
cas = test_download.cas


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
