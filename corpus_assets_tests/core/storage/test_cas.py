import hashlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import corpus_assets
from corpus_assets.core.storage.cas import (
    COPY_CHUNK,
    CasError,
    ContentStore,
    CorruptObjectError,
    MissingObjectError,
)
from corpus_assets.core.storage.digests import DigestError, sha256_digest
from corpus_assets.core.storage.hashing import OFFLOAD_MIN, OverlappedHasher

REPO_ROOT = Path(corpus_assets.__file__).resolve().parents[1]

# Shared by the child processes: a deterministic payload and a stream that trickles it out.
CHILD_PRELUDE = textwrap.dedent(
    """
    import io, json, random, sys, time
    from pathlib import Path
    from corpus_assets.core.storage.cas import ContentStore

    class SlowStream(io.RawIOBase):
        def __init__(self, data, delay):
            self._data = memoryview(data)
            self._pos = 0
            self._delay = delay

        def readable(self):
            return True

        def readinto(self, buffer):
            time.sleep(self._delay)
            n = min(len(buffer), 1 << 16, len(self._data) - self._pos)
            buffer[:n] = self._data[self._pos : self._pos + n]
            self._pos += n
            return n

    def payload(seed, size):
        return random.Random(seed).randbytes(size)
    """
)

CRASH_CHILD = CHILD_PRELUDE + textwrap.dedent(
    """
    root, seed, size = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    ContentStore(root).put_stream(SlowStream(payload(seed, size), 0.02))
    print("finished")
    """
)

RACE_CHILD = CHILD_PRELUDE + textwrap.dedent(
    """
    root, seed, size, method = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    ready, go = Path(sys.argv[5]), Path(sys.argv[6])
    data = payload(seed, size)
    store = ContentStore(root)
    ready.touch()
    while not go.exists():
        time.sleep(0.001)
    if method == "bytes":
        digest = store.put_bytes(data)
    else:
        digest, _ = store.put_stream(io.BytesIO(data))
    print(json.dumps({"digest": digest, "created": store.stats.created,
                      "reused": store.stats.reused}))
    """
)


def payload(seed: int, size: int) -> bytes:
    """Same bytes as the children's ``payload``."""
    return random.Random(seed).randbytes(size)


def spawn(script: str, *args: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_put_get_round_trip_and_layout(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    data = b"hello, corpus\n"
    hexd = hashlib.sha256(data).hexdigest()

    digest = store.put_bytes(data)

    assert digest == "sha256:" + hexd
    assert store.path(digest) == tmp_path / "sha256" / hexd[:2] / hexd[2:4] / hexd
    assert files_under(tmp_path / "sha256") == [store.path(digest)]
    assert store.path(digest).read_bytes() == data
    assert store.get_bytes(digest) == data
    assert store.contains(digest)
    assert store.size(digest) == len(data)
    assert store.uri(digest) == "cas://sha256/" + hexd
    assert list(store.iter_digests()) == [digest]
    assert files_under(tmp_path / "tmp") == [], "a finished put leaves no temp file behind"


def test_empty_object_round_trips(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    digest = store.put_bytes(b"")
    assert digest == sha256_digest(b"")
    assert store.get_bytes(digest) == b""
    store.verify(digest)


def test_put_is_put_if_absent_and_never_overwrites(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    data = b"same bytes twice"
    first = store.put_bytes(data)
    before = store.path(first).stat()

    second = store.put_bytes(data)

    assert first == second
    assert (store.stats.created, store.stats.reused) == (1, 1)
    after = store.path(first).stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert files_under(tmp_path / "sha256") == [store.path(first)]
    assert files_under(tmp_path / "tmp") == []


def test_put_stream_of_existing_object_is_reused_and_leaves_no_temp(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    data = payload(1, 3 * COPY_CHUNK + 17)
    digest = store.put_bytes(data)
    inode = store.path(digest).stat().st_ino

    assert store.put_stream(io.BytesIO(data)) == (digest, len(data))

    assert (store.stats.created, store.stats.reused) == (1, 1)
    assert store.path(digest).stat().st_ino == inode
    assert files_under(tmp_path / "tmp") == []


def test_put_stream_multi_megabyte_gives_sha256_of_the_bytes(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    data = payload(2, 5 * COPY_CHUNK + 12345)

    digest, size = store.put_stream(io.BytesIO(data))

    assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert size == len(data)
    assert store.get_bytes(digest) == data
    assert (store.stats.created, store.stats.reused) == (1, 0)
    assert files_under(tmp_path / "tmp") == []


def test_put_file_matches_put_bytes(tmp_path: Path) -> None:
    data = payload(3, COPY_CHUNK + 1)
    source = tmp_path / "input.bin"
    source.write_bytes(data)
    store = ContentStore(tmp_path / "cas")
    assert store.put_file(source) == (sha256_digest(data), len(data))


def test_open_streams_the_exact_bytes(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    data = payload(4, 2 * COPY_CHUNK + 3)
    digest = store.put_bytes(data)
    with store.open(digest) as reader:
        assert reader.read() == data


@pytest.mark.parametrize("offset", [0, 1000, -1])
def test_flipped_byte_is_reported_by_every_reader(tmp_path: Path, offset: int) -> None:
    store = ContentStore(tmp_path)
    data = payload(5, 2 * COPY_CHUNK + 5)
    digest = store.put_bytes(data)
    flip_byte(store.path(digest), offset)

    with pytest.raises(CorruptObjectError, match=f"raw object x \\({digest}\\)") as info:
        store.get_bytes(digest, f"raw object x ({digest})")
    assert info.value.digest == digest
    assert info.value.actual not in (digest, "")
    assert digest in str(info.value)

    with pytest.raises(CorruptObjectError, match=digest):
        store.verify(digest)

    with pytest.raises(CorruptObjectError, match=digest), store.open(digest) as reader:
        while reader.read(4096):
            pass

    with pytest.raises(CorruptObjectError, match=digest), store.open(digest) as reader:
        reader.read()


def test_truncated_object_is_corrupt_not_short(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    data = payload(6, 10_000)
    digest = store.put_bytes(data)
    store.path(digest).write_bytes(data[:-1])
    with pytest.raises(CorruptObjectError, match=digest):
        store.get_bytes(digest)
    with pytest.raises(CorruptObjectError, match=digest):
        store.verify(digest)


def test_missing_object_raises_missing_object_error(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    digest = sha256_digest(b"never stored")
    assert not store.contains(digest)
    for call in (
        lambda: store.get_bytes(digest, "chunk c"),
        lambda: store.open(digest, "chunk c"),
        lambda: store.verify(digest, "chunk c"),
    ):
        with pytest.raises(MissingObjectError, match=f"chunk c {digest} is missing") as info:
            call()
        assert info.value.digest == digest
    with pytest.raises(MissingObjectError, match=digest):
        store.size(digest)


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(str.upper, id="uppercase"),
        pytest.param(lambda d: d[:-1], id="short"),
        pytest.param(lambda d: d + "\n", id="trailing-newline"),
        pytest.param(lambda d: d.replace("sha256:", "sha256:../"), id="path"),
    ],
)
def test_malformed_form_of_a_stored_digest_is_refused(
    tmp_path: Path, mangle: Callable[[str], str]
) -> None:
    store = ContentStore(tmp_path)
    digest = mangle(store.put_bytes(b"a" * 10))
    for call in (store.get_bytes, store.open, store.verify, store.path):
        with pytest.raises(DigestError):
            call(digest)


def test_crash_mid_put_leaves_no_visible_object(tmp_path: Path) -> None:
    root = tmp_path / "cas"
    seed, size = 11, 8 * COPY_CHUNK
    child = spawn(CRASH_CHILD, root, seed, size)
    try:
        deadline = time.monotonic() + 20
        partial: list[Path] = []
        while not partial:
            assert child.poll() is None, f"child ended before writing: {child.communicate()}"
            assert time.monotonic() < deadline, "no temp file appeared under <root>/tmp"
            partial = [p for p in files_under(root / "tmp") if p.stat().st_size > 0]
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
        out, _ = child.communicate(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == -signal.SIGKILL
    assert "finished" not in out
    assert 0 < partial[0].stat().st_size < size, "the kill should land mid-write"

    assert files_under(root / "sha256") == [], "a killed put must not publish anything"
    store = ContentStore(root)
    assert list(store.iter_digests()) == []

    data = payload(seed, size)
    digest, written = store.put_stream(io.BytesIO(data))
    assert (digest, written) == (sha256_digest(data), size)
    assert (store.stats.created, store.stats.reused) == (1, 0)
    store.verify(digest)
    assert store.get_bytes(digest) == data


@pytest.mark.parametrize("method", ["bytes", "stream"])
def test_concurrent_puts_of_same_bytes_make_exactly_one_object(tmp_path: Path, method: str) -> None:
    root = tmp_path / "cas"
    seed, size = 12, 4 * COPY_CHUNK
    go = tmp_path / "go"
    ready = [tmp_path / f"ready-{n}" for n in range(2)]
    children = [spawn(RACE_CHILD, root, seed, size, method, r, go) for r in ready]
    try:
        deadline = time.monotonic() + 20
        while not all(r.exists() for r in ready):
            for child in children:
                assert child.poll() is None, f"child ended early: {child.communicate()}"
            assert time.monotonic() < deadline, "children did not get ready"
            time.sleep(0.005)
        go.touch()
        results = [child.communicate(timeout=20) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.communicate()
    for child, (_, err) in zip(children, results, strict=True):
        assert child.returncode == 0, err

    data = payload(seed, size)
    reports = [json.loads(out) for out, _ in results]
    assert {r["digest"] for r in reports} == {sha256_digest(data)}
    assert sorted((r["created"], r["reused"]) for r in reports) == [(0, 1), (1, 0)]

    store = ContentStore(root)
    digest = sha256_digest(data)
    assert files_under(root / "sha256") == [store.path(digest)]
    assert store.get_bytes(digest) == data
    assert files_under(root / "tmp") == []


def test_adopt_file_links_without_copying_and_removes_the_source(tmp_path: Path) -> None:
    store = ContentStore(tmp_path / "cas")
    finished = tmp_path / "download.partial"
    finished.write_bytes(b"downloaded bytes" * 1000)
    inode = finished.stat().st_ino
    digest, size = store.adopt_file(finished)
    assert (digest, size) == (sha256_digest(b"downloaded bytes" * 1000), 16000)
    assert store.path(digest).stat().st_ino == inode  # linked, not copied
    assert not finished.exists()
    again = tmp_path / "again.partial"
    again.write_bytes(b"downloaded bytes" * 1000)
    assert store.adopt_file(again) == (digest, size)
    assert not again.exists() and (store.stats.created, store.stats.reused) == (1, 1)


def test_adopt_hashed_trusts_the_writers_digest_and_every_read_checks_it(tmp_path: Path) -> None:
    """adopt_hashed does not read the file (the writer hashed it); a file that changed after it
    was hashed is published under the old name, and its first reader reports it corrupt."""
    store = ContentStore(tmp_path / "cas")
    payload = random.Random(7).randbytes(3 * OFFLOAD_MIN + 5)
    finished = tmp_path / "download.partial"
    finished.write_bytes(payload)
    digest = sha256_digest(payload)
    with pytest.raises(CasError, match="not the 10 hashed"):
        store.adopt_hashed(finished, digest, 10)  # the size is checked, the file is kept
    assert finished.exists() and not store.contains(digest)
    flipped = bytearray(payload)
    flipped[OFFLOAD_MIN + 1] ^= 1
    finished.write_bytes(flipped)  # changed on disk after the writer hashed it
    assert store.adopt_hashed(finished, digest, len(payload)) == (digest, len(payload))
    assert not finished.exists() and store.contains(digest)
    with pytest.raises(CorruptObjectError), store.open(digest) as reader:
        while reader.read(OFFLOAD_MIN * 2):
            pass
    with pytest.raises(CorruptObjectError):
        store.get_bytes(digest)


@pytest.mark.parametrize("seed", range(3))
def test_overlapped_hasher_equals_hashlib_at_every_point(seed: int) -> None:
    rng = random.Random(seed)
    blocks = [rng.randbytes(rng.choice([0, 1, 100, OFFLOAD_MIN, 3 << 20])) for _ in range(12)]
    overlapped, reference = OverlappedHasher(), hashlib.sha256()
    try:
        for block in blocks:
            overlapped.update(block)
            reference.update(block)
            assert overlapped.hexdigest() == reference.hexdigest()  # waits for the thread
    finally:
        overlapped.close()
    overlapped.update(b"after close")  # still usable
    reference.update(b"after close")
    assert overlapped.hexdigest() == reference.hexdigest()
    overlapped.close()
