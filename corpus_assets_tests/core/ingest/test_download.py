import fcntl
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import corpus_assets
from corpus_assets.core.ingest.download import Fetched, ResumeRefused, fetch_to_cas
from corpus_assets.core.ingest.remote_http import DownloadError, RemoteVersion, head
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.selftest.http_server import LAST_MODIFIED, Drop, LoopbackServer, Remote

REPO_ROOT = Path(corpus_assets.__file__).resolve().parents[1]
SIZE = 3 * (1 << 20) + 12_345
BODY = random.Random(3).randbytes(SIZE)
DIGEST = "sha256:" + hashlib.sha256(BODY).hexdigest()


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[Remote, str]]]:
    """Loopback servers of one object (``BODY`` unless given), stopped after the test."""
    servers: list[LoopbackServer] = []

    def start(**kwargs: object) -> tuple[Remote, str]:
        remote = Remote(**{"body": BODY, **kwargs})  # type: ignore[arg-type]
        server = LoopbackServer(remote).start()
        servers.append(server)
        return remote, server.url("/shard-0001.jsonl.zst")

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def cas(tmp_path: Path) -> ContentStore:
    return ContentStore(tmp_path / "cas")


def fetch(url: str, cas: ContentStore, work: Path, **kwargs: object) -> Fetched:
    options: dict[str, object] = {"backoff_seconds": 0.001, "timeout": 5.0}
    options.update(kwargs)
    return fetch_to_cas(url, cas, work, **options)  # type: ignore[arg-type]


def interrupted(remote: Remote, url: str, cas: ContentStore, work: Path, **kwargs: object) -> Path:
    """A call that ends at the server's next drop: the attempt after it gets no byte, and this
    call allows one attempt without progress. Returns the partial file it leaves."""
    remote.drops.append(Drop(0, "fin"))
    with pytest.raises(DownloadError, match="gave up after 1 attempts in a row without progress"):
        fetch(url, cas, work, max_attempts_without_progress=1, **kwargs)
    return checkpoint_of(work, url).with_suffix("")


def checkpoint_of(work: Path, url: str) -> Path:
    return work / f"{hashlib.sha256(url.encode()).hexdigest()}.partial.json"


def assert_published(fetched: Fetched, cas: ContentStore, work: Path, body: bytes = BODY) -> None:
    assert fetched.digest == "sha256:" + hashlib.sha256(body).hexdigest()
    assert fetched.size == len(body)
    assert cas.get_bytes(fetched.digest) == body
    assert list(work.iterdir()) == []  # partial and checkpoint are gone


DROP_OFFSETS = [
    0,
    1,
    2,
    4095,
    65_535,
    65_536,
    100_000,
    (1 << 20) - 1,
    1 << 20,
    (1 << 20) + 1,
    1_500_000,
    (2 << 20) - 7,
    2 << 20,
    2_500_000,
    3 << 20,
    SIZE - 65_537,
    SIZE - 4096,
    SIZE - 100,
    SIZE - 2,
    SIZE - 1,
]


@pytest.mark.parametrize("how", ["rst", "fin"])
@pytest.mark.parametrize("at", DROP_OFFSETS)
def test_completes_after_a_drop_at_any_offset(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path, at: int, how: str
) -> None:
    remote, url = serve(drops=[Drop(at, how)])
    work = tmp_path / "work"
    fetched = fetch(url, cas, work)
    assert_published(fetched, cas, work)
    assert fetched.bytes_transferred < 1.5 * SIZE
    assert fetched.restarts == 0
    assert fetched.etag == '"v1"' and fetched.last_modified == LAST_MODIFIED
    assert remote.gets == 2
    if how == "fin" and at:  # a clean close delivers every byte sent: resume exactly there
        assert fetched.resumed
        assert fetched.bytes_transferred == SIZE
        assert remote.ranges[1] == f"bytes={at}-"


def test_many_drops_in_a_row_including_zero_progress(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    drops = [Drop(0), Drop(0, "fin"), Drop(300_000), Drop(0, "noresponse"), Drop(200_000, "fin")]
    drops += [Drop(0, "status", status=503), Drop(1 << 20), Drop(5)]
    remote, url = serve(drops=list(drops))
    fetched = fetch(url, cas, tmp_path / "work")
    assert_published(fetched, cas, tmp_path / "work")
    assert remote.gets == len(drops) + 1
    assert fetched.bytes_transferred < 1.5 * SIZE


def test_a_stalled_connection_times_out_and_resumes(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    remote, url = serve(drops=[Drop(700_000, "stall", stall_seconds=1.0)])
    fetched = fetch(url, cas, tmp_path / "work", timeout=0.3)
    assert_published(fetched, cas, tmp_path / "work")
    assert fetched.resumed and fetched.bytes_transferred == SIZE
    assert remote.ranges[1] == "bytes=700000-"


def test_a_client_error_is_not_retried(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    remote, url = serve(drops=[Drop(how="status", status=404)])
    with pytest.raises(DownloadError, match=re.escape(url) + ": HTTP 404"):
        fetch(url, cas, tmp_path / "work")
    assert remote.gets == 1


def test_corrupt_partial_prefix_restarts_from_zero(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    remote, url = serve(drops=[Drop(1 << 20, "fin")])
    work = tmp_path / "work"
    interrupted(remote, url, cas, work)
    checkpoint = json.loads(checkpoint_of(work, url).read_text())
    assert checkpoint["verified_bytes"] == 1 << 20
    assert checkpoint["sha256_prefix"] == hashlib.sha256(BODY[: 1 << 20]).hexdigest()
    partial = work / checkpoint_of(work, url).name.removesuffix(".json")
    data = bytearray(partial.read_bytes())
    data[12_345] ^= 0x40
    partial.write_bytes(bytes(data))

    fetched = fetch(url, cas, work)
    assert_published(fetched, cas, work)
    assert fetched.restarts == 1 and not fetched.resumed
    assert fetched.bytes_transferred == SIZE
    assert remote.ranges[-1] is None  # asked for the whole object again


def test_bytes_written_after_the_last_checkpoint_are_cut_off(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    """A crash between appending data and committing the checkpoint is recoverable."""
    remote, url = serve(drops=[Drop(1 << 20, "fin")])
    work = tmp_path / "work"
    partial = interrupted(remote, url, cas, work)
    with open(partial, "ab") as handle:
        handle.write(b"bytes the checkpoint never committed")
    fetched = fetch(url, cas, work)
    assert_published(fetched, cas, work)
    assert fetched.resumed and fetched.restarts == 0
    assert fetched.bytes_transferred == SIZE - (1 << 20)
    assert remote.ranges[-1] == f"bytes={1 << 20}-"


def test_a_checkpoint_claiming_missing_bytes_restarts_from_zero(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    """What a checkpoint-first order would leave after a crash: the claim without the bytes."""
    remote, url = serve(drops=[Drop(1 << 20, "fin")])
    work = tmp_path / "work"
    partial = interrupted(remote, url, cas, work)
    os.truncate(partial, (1 << 20) - 10)
    fetched = fetch(url, cas, work)
    assert_published(fetched, cas, work)
    assert fetched.restarts == 1 and fetched.bytes_transferred == SIZE


def test_a_complete_unpublished_download_is_published_without_the_network(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    remote, url = serve()
    work = tmp_path / "work"
    work.mkdir()
    checkpoint = checkpoint_of(work, url)
    (work / checkpoint.name.removesuffix(".json")).write_bytes(BODY)
    checkpoint.write_text(
        json.dumps(
            {
                "url": url,
                "verified_bytes": SIZE,
                "expected_size": SIZE,
                "sha256_prefix": DIGEST.removeprefix("sha256:"),
                "etag": '"v1"',
                "last_modified": LAST_MODIFIED,
            }
        )
    )
    fetched = fetch(url, cas, work, resume_only=True)
    assert_published(fetched, cas, work)
    assert fetched.bytes_transferred == 0 and fetched.resumed
    assert remote.gets == 0


def test_a_server_ignoring_range_still_works_after_a_drop(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    remote, url = serve(honor_range=False, drops=[Drop(1_500_000, "fin")])
    fetched = fetch(url, cas, tmp_path / "work")
    assert_published(fetched, cas, tmp_path / "work")
    assert fetched.restarts == 1 and not fetched.resumed
    assert fetched.bytes_transferred == 1_500_000 + SIZE
    assert remote.ranges[1] == "bytes=1500000-"


def test_a_chunked_body_without_length_completes_and_resumes(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    remote, url = serve(chunked=True, drops=[Drop(800_000, "rst")])
    fetched = fetch(url, cas, tmp_path / "work")
    assert_published(fetched, cas, tmp_path / "work")
    assert remote.gets == 2 and fetched.bytes_transferred < 1.5 * SIZE


NEW_BODY = random.Random(4).randbytes(SIZE + 1000)


def test_pinned_version_that_changed_between_attempts_is_refused(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    remote, url = serve(drops=[Drop(1 << 20, "rst")])
    pinned = head(url)
    assert pinned == RemoteVersion(url, SIZE, '"v1"', LAST_MODIFIED)
    remote.after_drop = lambda r: r.change(NEW_BODY, '"v2"')
    with pytest.raises(DownloadError) as raised:
        fetch(url, cas, tmp_path / "work", expected=pinned)
    message = str(raised.value)
    assert url in message and "no longer matches its pinned version" in message
    assert '"v1"' in message and '"v2"' in message
    assert list(cas.iter_digests()) == []


def test_pinned_version_already_gone_is_refused_before_any_byte(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    remote, url = serve()
    pinned = head(url)
    remote.change(NEW_BODY, '"v2"')
    with pytest.raises(DownloadError, match=re.escape(url) + ".*pinned version"):
        fetch(url, cas, tmp_path / "work", expected=pinned)
    partials = list((tmp_path / "work").glob("*.partial"))
    assert [p.stat().st_size for p in partials] == [0]  # not one byte of the new version kept
    assert list(cas.iter_digests()) == []


def test_unpinned_object_that_changed_restarts_and_fetches_the_new_bytes(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    remote, url = serve(drops=[Drop(1 << 20, "fin")])
    remote.after_drop = lambda r: r.change(NEW_BODY, '"v2"')
    fetched = fetch(url, cas, tmp_path / "work")
    assert_published(fetched, cas, tmp_path / "work", NEW_BODY)
    assert fetched.restarts == 1 and fetched.etag == '"v2"'
    assert fetched.bytes_transferred == (1 << 20) + len(NEW_BODY)


def test_a_server_that_sends_a_changed_206_is_not_appended(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    """Even if a server ignores If-Range, a 206 with another ETag never joins the old bytes."""
    remote, url = serve(drops=[Drop(1 << 20, "fin")])
    work = tmp_path / "work"
    interrupted(remote, url, cas, work)
    remote.change(NEW_BODY, '"v2"')
    remote.last_modified = LAST_MODIFIED  # If-Range on the date would still match
    checkpoint = checkpoint_of(work, url)
    payload = json.loads(checkpoint.read_text())
    payload["etag"] = 'W/"v1"'  # a weak ETag: If-Range must fall back to the date
    checkpoint.write_text(json.dumps(payload))
    fetched = fetch(url, cas, work)
    assert_published(fetched, cas, work, NEW_BODY)
    assert fetched.restarts == 1


def test_resume_only_refuses_without_a_checkpoint(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    remote, url = serve(drops=[Drop(0, "fin")])
    work = tmp_path / "work"
    with pytest.raises(ResumeRefused, match=re.escape(url) + ".*no partial file"):
        fetch(url, cas, work, resume_only=True)
    assert remote.gets == 0
    with pytest.raises(DownloadError):  # leaves a checkpoint, but with no verified byte
        fetch(url, cas, work, max_attempts_without_progress=1)
    assert json.loads(checkpoint_of(work, url).read_text())["verified_bytes"] == 0
    with pytest.raises(ResumeRefused, match="no verified bytes"):
        fetch(url, cas, work, resume_only=True)
    assert remote.gets == 1


def test_resume_only_resumes_from_a_checkpoint(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    remote, url = serve(drops=[Drop(2 << 20, "fin")])
    work = tmp_path / "work"
    interrupted(remote, url, cas, work)
    fetched = fetch(url, cas, work, resume_only=True)
    assert_published(fetched, cas, work)
    assert fetched.resumed and fetched.bytes_transferred == SIZE - (2 << 20)


def test_resume_only_refuses_when_the_object_changed(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    remote, url = serve(drops=[Drop(1 << 20, "fin")])
    work = tmp_path / "work"
    interrupted(remote, url, cas, work)
    remote.change(NEW_BODY, '"v2"')
    with pytest.raises(ResumeRefused, match="object changed"):
        fetch(url, cas, work, resume_only=True)


def test_head_falls_back_to_a_one_byte_get(serve: Callable[..., tuple[Remote, str]]) -> None:
    remote, url = serve(allow_head=False)
    assert head(url) == RemoteVersion(url, SIZE, '"v1"', LAST_MODIFIED)
    assert remote.ranges == ["bytes=0-0"]


def test_head_names_the_url_on_failure(serve: Callable[..., tuple[Remote, str]]) -> None:
    _remote, url = serve()
    with pytest.raises(
        DownloadError, match=re.escape(url + "-missing") + ": HEAD answered HTTP 404"
    ):
        head(url + "-missing")


def test_a_second_downloader_of_the_same_url_is_refused(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    _remote, url = serve()
    work = tmp_path / "work"
    work.mkdir()
    partial = work / checkpoint_of(work, url).name.removesuffix(".json")
    with open(partial, "wb") as holder:
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        with pytest.raises(DownloadError, match="another process is downloading"):
            fetch(url, cas, work)


CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from corpus_assets.core.storage.cas import ContentStore
    from corpus_assets.core.ingest.download import fetch_to_cas

    url, cas_root, work = sys.argv[1:4]
    fetch_to_cas(url, ContentStore(Path(cas_root)), Path(work),
                 checkpoint_bytes=128 << 10, checkpoint_seconds=0.05)
    """
)


def kill_past_checkpoint(child: str, url: str, cas: ContentStore, work: Path, past: int) -> int:
    """Run the download script ``child`` in a new process and SIGKILL it once its checkpoint
    vouches for more than ``past`` bytes; returns the bytes the last checkpoint read vouched for."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", child, url, str(cas.root), str(work)], env=env, cwd=REPO_ROOT
    )
    checkpoint = checkpoint_of(work, url)
    deadline = time.monotonic() + 20
    verified = 0
    while verified < past:
        assert process.poll() is None, "the child finished before it could be killed"
        assert time.monotonic() < deadline, f"no checkpoint past {past} bytes"
        time.sleep(0.01)
        try:
            verified = json.loads(checkpoint.read_text())["verified_bytes"]
        except (FileNotFoundError, ValueError):
            continue
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=10) == -signal.SIGKILL
    return verified


def test_sigkill_mid_download_then_resume(
    serve: Callable[..., tuple[Remote, str]], cas: ContentStore, tmp_path: Path
) -> None:
    remote, url = serve(piece=32 << 10, delay=0.02)  # ~1.6 MB/s: two seconds for the object
    work = tmp_path / "work"
    verified = kill_past_checkpoint(CHILD, url, cas, work, 1 << 20)
    remote.delay = 0.0

    fetched = fetch(url, cas, work)
    assert_published(fetched, cas, work)
    assert fetched.resumed and fetched.restarts == 0
    assert fetched.bytes_transferred <= SIZE - verified
    assert remote.sent < 1.5 * SIZE  # both processes together, counted by the server
