"""``fetch_to_cas(validate=...)`` over a real loopback server: a compressed object is decoded while
it downloads (resumed ones from their first byte on disk), and one that is truncated, corrupt or a
bomb is refused with an error naming it, before anything is published."""

import gzip
import hashlib
import json
import random
import re
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard

from corpus_assets.core.ingest.codecs import DEFAULT_LIMITS, DecompressionLimits
from corpus_assets.core.ingest.download import InvalidObject
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets_tests.core.ingest import test_download
from corpus_assets_tests.core.ingest.test_download import (
    Drop,
    Remote,
    assert_published,
    checkpoint_of,
    fetch,
    interrupted,
)

serve = test_download.serve  # the loopback server and CAS fixtures of the download tests
cas = test_download.cas

Serve = Callable[..., tuple[Remote, str]]


def _jsonl(lines: int, seed: int = 7) -> bytes:
    rng = random.Random(seed)
    words = ["".join(rng.choices("abcdefghij", k=rng.randint(2, 9))) for _ in range(2000)]
    return "".join(
        json.dumps({"id": n, "text": " ".join(rng.choices(words, k=40))}) + "\n"
        for n in range(lines)
    ).encode()


RAW = _jsonl(12_000)  # ~3.6 MB of text
ZST = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(RAW)
# several frames, so a resume can land between frames as well as inside one
FIRST_FRAME = zstandard.compress(RAW[:700_000])
FRAMES = FIRST_FRAME + b"".join(
    zstandard.compress(RAW[i : i + 700_000]) for i in range(700_000, len(RAW), 700_000)
)
# where the first attempt drops: inside the magic number, right after it, at the first frame's
# end (a frame boundary in FRAMES), half way, in the last block
DROPS: dict[str, Callable[[bytes], int]] = {
    "1": lambda _: 1,
    "3": lambda _: 3,
    "4": lambda _: 4,
    "5": lambda _: 5,
    "64KiB": lambda _: 65_536,
    "first-frame-end": lambda _: len(FIRST_FRAME),
    "half": lambda body: len(body) // 2,
    "end-5": lambda body: len(body) - 5,
}


def _cas_is_empty(cas: ContentStore) -> bool:
    return not any(path.is_file() for path in Path(cas.root).rglob("*"))


@pytest.mark.parametrize("body", [ZST, FRAMES], ids=["one-frame", "frames"])
def test_a_zstd_object_is_decoded_while_it_downloads(
    serve: Serve, cas: ContentStore, tmp_path: Path, body: bytes
) -> None:
    _remote, url = serve(body=body)
    fetched = fetch(url, cas, tmp_path / "work", validate=DEFAULT_LIMITS)
    assert_published(fetched, cas, tmp_path / "work", body)
    assert (fetched.codec, fetched.decoded_bytes) == ("zstd", len(RAW))


def test_gzip_is_decoded_and_plain_objects_are_not(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    gz = gzip.compress(RAW, mtime=0)
    for body, codec, decoded in [
        (gz, "gzip", len(RAW)),
        (RAW, "plain", None),
        (b"ab", "plain", None),
    ]:
        _remote, url = serve(body=body)
        fetched = fetch(url, cas, tmp_path / codec, validate=DEFAULT_LIMITS)
        assert_published(fetched, cas, tmp_path / codec, body)
        assert (fetched.codec, fetched.decoded_bytes) == (codec, decoded)


@pytest.mark.parametrize("where", DROPS)
@pytest.mark.parametrize("body", [ZST, FRAMES], ids=["one-frame", "frames"])
def test_a_resumed_download_is_decoded_from_its_first_byte_on_disk(
    serve: Serve, cas: ContentStore, tmp_path: Path, body: bytes, where: str
) -> None:
    """The first attempt drops (see ``DROPS``) and a new call resumes from the checkpoint: the
    prefix on disk is decoded before the rest."""
    at = DROPS[where](body)
    remote, url = serve(body=body, drops=[Drop(at, "fin")])
    work = tmp_path / "work"
    interrupted(remote, url, cas, work, validate=DEFAULT_LIMITS)
    assert json.loads(checkpoint_of(work, url).read_text())["verified_bytes"] == at

    fetched = fetch(url, cas, work, validate=DEFAULT_LIMITS)
    assert_published(fetched, cas, work, body)
    assert fetched.resumed and fetched.bytes_transferred == len(body) - at
    assert (fetched.codec, fetched.decoded_bytes) == ("zstd", len(RAW))
    assert remote.ranges[-1] == f"bytes={at}-"


def test_a_drop_and_resume_within_one_call_keeps_decoding(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    _remote, url = serve(body=ZST, drops=[Drop(100_000, "rst"), Drop(1_000_000, "fin")])
    fetched = fetch(url, cas, tmp_path / "work", validate=DEFAULT_LIMITS)
    assert_published(fetched, cas, tmp_path / "work", ZST)
    assert fetched.decoded_bytes == len(RAW)


def test_a_restart_from_zero_decodes_the_new_bytes_only(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    """A server ignoring Range after a drop sends the object again from byte zero: the decoder
    of the dropped attempt is discarded with its bytes."""
    _remote, url = serve(body=ZST, honor_range=False, drops=[Drop(len(ZST) // 2, "fin")])
    fetched = fetch(url, cas, tmp_path / "work", validate=DEFAULT_LIMITS)
    assert_published(fetched, cas, tmp_path / "work", ZST)
    assert fetched.restarts == 1 and fetched.decoded_bytes == len(RAW)


def test_a_truncated_object_is_refused_and_nothing_is_published(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    body = ZST[:-1000]
    _remote, url = serve(body=body)
    work = tmp_path / "work"
    with pytest.raises(InvalidObject, match=re.escape(url) + r": .*zstd stream is truncated"):
        fetch(url, cas, work, validate=DEFAULT_LIMITS)
    assert _cas_is_empty(cas)
    # the faithful bytes stay checkpointed: the same fetch without validation publishes them
    assert json.loads(checkpoint_of(work, url).read_text())["verified_bytes"] == len(body)
    assert fetch(url, cas, work).digest == "sha256:" + hashlib.sha256(body).hexdigest()


def test_a_resumed_truncated_object_is_still_refused(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    body = ZST[:-1000]
    remote, url = serve(body=body, drops=[Drop(len(body) // 2, "fin")])
    work = tmp_path / "work"
    interrupted(remote, url, cas, work, validate=DEFAULT_LIMITS)
    with pytest.raises(InvalidObject, match="truncated"):
        fetch(url, cas, work, validate=DEFAULT_LIMITS)
    assert remote.ranges[-1] == f"bytes={len(body) // 2}-"
    # the rerun finds the complete checkpoint and refuses it again without the network
    with pytest.raises(InvalidObject, match="truncated"):
        fetch(url, cas, work, validate=DEFAULT_LIMITS)
    assert remote.gets == 3  # the drop, the fruitless attempt that ended the call, the resume
    assert _cas_is_empty(cas)


def test_a_corrupt_object_stops_the_download_early(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    """Corruption near the start is found while the rest is still on its way: past the first
    half the server waits up to a second for the client to close before each further 32 KB,
    so the client's decoding thread has seconds to find the corruption in what it holds,
    however busy the machine (a server paced at 10 ms a piece let more than half through to a
    client slowed by other work)."""
    body = bytearray(ZST)
    for position in range(200_000, 200_064):
        body[position] ^= 0x5A
    remote, url = serve(body=bytes(body), piece=32 << 10, hold_at=len(body) // 2)
    with pytest.raises(InvalidObject, match=re.escape(url) + r": .*corrupt zstd data") as caught:
        fetch(url, cas, tmp_path / "work", validate=DEFAULT_LIMITS)
    assert "so the download stopped" in str(caught.value)
    assert remote.sent < len(body) * 3 // 4  # the client closed, not waiting for the rest
    assert remote.gets == 1
    assert _cas_is_empty(cas)


def test_a_server_stalling_after_a_corrupt_prefix_does_not_hold_the_download(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    """The server sends a prefix holding corruption, then waits up to a minute for the client
    to close before sending more, and the client's read timeout is longer still. The decoder
    finds the corruption in what arrived and shuts the connection down, so the download stops
    with its error while the server still waits: nothing past the prefix was sent, and there
    was no second request. (Before, the read waited for bytes that were not coming, and only
    the next piece, a minute later, let the download see the error.)"""
    body = bytearray(ZST)
    for position in range(200_000, 200_064):
        body[position] ^= 0x5A
    prefix = 400_000
    remote, url = serve(body=bytes(body), piece=32 << 10, hold_at=prefix, hold_seconds=60.0)
    with pytest.raises(InvalidObject, match=re.escape(url) + r": .*corrupt zstd data") as caught:
        fetch(url, cas, tmp_path / "work", validate=DEFAULT_LIMITS, timeout=120.0)
    assert "so the download stopped" in str(caught.value)
    assert remote.sent <= prefix
    assert remote.gets == 1
    assert _cas_is_empty(cas)


def test_a_checksum_mismatch_is_refused(serve: Serve, cas: ContentStore, tmp_path: Path) -> None:
    """The frame's content checksum (its last 4 bytes) is checked too."""
    body = ZST[:-1] + bytes([ZST[-1] ^ 1])
    _remote, url = serve(body=body)
    with pytest.raises(InvalidObject, match=re.escape(url) + ".*(checksum|corrupt)"):
        fetch(url, cas, tmp_path / "work", validate=DEFAULT_LIMITS)
    assert _cas_is_empty(cas)


def test_a_bomb_is_refused_at_the_limits_given(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    bomb = zstandard.compress(bytes(64 << 20))  # 64 MiB of zeros in a few KB
    _remote, url = serve(body=bomb)
    limits = DecompressionLimits(max_output_bytes=32 << 20, max_ratio=1 << 40)
    with pytest.raises(InvalidObject, match=re.escape(url) + ".*max_output_bytes"):
        fetch(url, cas, tmp_path / "work", validate=limits)
    with pytest.raises(InvalidObject, match="max_ratio"):
        fetch(url, cas, tmp_path / "work2", validate=DEFAULT_LIMITS)
    assert _cas_is_empty(cas)


VALIDATING_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from corpus_assets.core.ingest.codecs import DEFAULT_LIMITS
    from corpus_assets.core.ingest.download import fetch_to_cas
    from corpus_assets.core.storage.cas import ContentStore

    url, cas_root, work = sys.argv[1:4]
    fetch_to_cas(url, ContentStore(Path(cas_root)), Path(work), validate=DEFAULT_LIMITS,
                 checkpoint_bytes=128 << 10, checkpoint_seconds=0.05)
    """
)


def test_sigkill_mid_validating_download_then_resume(
    serve: Serve, cas: ContentStore, tmp_path: Path
) -> None:
    """A process decoding its download is killed; a new one resumes from the checkpoint and
    decodes the object from its first byte (the prefix from disk, the rest from the network)."""
    remote, url = serve(body=ZST, piece=32 << 10, delay=0.02)  # ~1.6 MB/s
    work = tmp_path / "work"
    verified = test_download.kill_past_checkpoint(VALIDATING_CHILD, url, cas, work, 256 << 10)
    remote.delay = 0.0

    fetched = fetch(url, cas, work, validate=DEFAULT_LIMITS)
    assert_published(fetched, cas, work, ZST)
    assert fetched.resumed and fetched.restarts == 0
    assert fetched.bytes_transferred <= len(ZST) - verified
    assert (fetched.codec, fetched.decoded_bytes) == ("zstd", len(RAW))
