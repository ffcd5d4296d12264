"""Faults on resumable downloads, through a real CLI build of an ``objects`` source
whose objects are URLs on a loopback server (``http_server``) that this process starts and stops:
connections dropped at many offsets, a corrupted partial file, a server that ignores Range, an
object rewritten mid-download. The server counts the body bytes it sends; what the build pinned
is read back from the catalog and compared with the bytes served and with an undisturbed build
of the same URLs (one per lab, on the same port, so the URLs and hence the snapshotId match)."""

import hashlib
import json
import os
import random
import signal
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import zstandard

from corpus_assets.core.ingest.download import TRANSFER_BUDGET
from corpus_assets.core.publication.verify import verify
from corpus_assets.selftest.case import NO_LOSS, Outcome, fault
from corpus_assets.selftest.evidence import intact, stray_temps, workspace
from corpus_assets.selftest.http_server import (
    LAST_MODIFIED,
    Drop,
    LoopbackServer,
    Remote,
    content_etag,
)
from corpus_assets.selftest.lab import PARTITION, Built, Home, Lab, Ran, SelftestError, parse_built

SEED = "003"


@dataclass(frozen=True)
class _Reference:
    """The undisturbed build of the standard objects served at ``port``."""

    port: int
    built: Built


_REFERENCES: "weakref.WeakKeyDictionary[Lab, _Reference]" = weakref.WeakKeyDictionary()


def _rng(case: str) -> random.Random:
    """The case's own seeded generator (the same offsets whichever cases run before it)."""
    return random.Random(f"{os.environ.get('CORPUS_SELFTEST_SEED', '17')}/{case}")


def _bodies(lab: Lab) -> dict[str, bytes]:
    """The standard corpus objects, by URL path."""
    return {f"/{p.name}": p.read_bytes() for p in sorted(lab.standard_sources.glob("*.zst"))}


def _digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def _server(lab: Lab, port: int = 0) -> LoopbackServer:
    """A server of the standard objects (ETags from their bytes), not yet started."""
    bodies = _bodies(lab)
    remotes = {path: Remote(body=body, etag=content_etag(body)) for path, body in bodies.items()}
    return LoopbackServer(objects=remotes, port=port)


def _web_home(lab: Lab, name: str, server: LoopbackServer) -> Home:
    """A fresh home whose one source ``web`` lists the server's objects by URL."""
    home = lab.home(name)
    urls = [server.url(path) for path in sorted(server.objects)]
    home.configure([{"id": "web", "kind": "objects", "urls": urls}])
    return home


def _reference(lab: Lab) -> _Reference:
    """Built once per lab; each case then serves the same URLs on the same port."""
    known = _REFERENCES.get(lab)
    if known is None:
        with _server(lab) as server:
            built = _web_home(lab, "download-reference", server).build("--partition", PARTITION)
            known = _Reference(server.port, built)
        _REFERENCES[lab] = known
    return known


def _pinned(home: Home, server: LoopbackServer) -> dict[str, str]:
    """URL path -> sha256 the build's freeze pinned (empty if no freeze was written)."""
    with workspace(home) as ws:
        freeze = ws.catalog.freeze_digest(PARTITION)
        if freeze is None:
            return {}
        spec = json.loads(ws.cas.get_bytes(freeze))
        objects = [o for source in spec["sources"] for o in source["objects"]]
        pinned = {o["name"].removeprefix(server.url("")): o["sha256"] for o in objects}
        kept = all(intact(ws, digest) for digest in pinned.values())
    if not kept:
        raise SelftestError("a pinned object's bytes in the CAS do not hash to its name")
    return pinned


@dataclass(frozen=True)
class _Pins:
    """How the freeze's pins compare with the bytes the server ends up serving."""

    corrupt: list[str]  # pinned, but under another sha256 than the served bytes'
    missing: list[str]  # not pinned at all (no freeze, or the object left out)

    @property
    def right(self) -> bool:
        return not (self.corrupt or self.missing)

    def summary(self) -> str:
        if self.right:
            return "every pinned sha256 equals the served bytes'"
        return f"{len(self.corrupt)} pinned with other bytes, {len(self.missing)} not pinned"


def _pins(home: Home, server: LoopbackServer) -> _Pins:
    pinned = _pinned(home, server)
    served = {path: _digest(remote.body) for path, remote in sorted(server.objects.items())}
    return _Pins(
        corrupt=[p for p, digest in served.items() if pinned.get(p, digest) != digest],
        missing=[p for p in served if p not in pinned],
    )


def _build(home: Home) -> tuple[Ran, Built | None]:
    ran = home.cli("build", "--partition", PARTITION)
    return ran, parse_built(ran.out) if ran.code == 0 else None


def _verdict(home: Home, built: Built | None) -> str:
    """What ``corpus-assets verify`` reports for the build (its code, in this process: the
    same re-hash of every reachable object without a CLI start-up)."""
    if built is None:
        return "not built"
    with workspace(home) as ws:
        report = verify(ws.cas, ws.catalog, built.snapshot_id)
    if report.ok:
        return f"verify ok ({report.objects_checked} objects re-hashed)"
    return f"verify failed: {report.findings[0]}"


def _lost(home: Home, pins: _Pins, built: Built | None) -> str:
    """Corrupt bytes pinned; after a successful build, also partial files left behind."""
    parts = [f"pinned with corrupt bytes: {', '.join(pins.corrupt)}"] if pins.corrupt else []
    if built is not None:
        parts += [f"stray temp {path.name}" for path in stray_temps(home)[:3]]
    return "; ".join(parts) or NO_LOSS


def _drops_at(remote: Remote, offsets: list[int], rng: random.Random) -> None:
    """Arm drops at these object offsets, each a FIN or (after the bytes reached the client)
    an RST, as the seeded ``rng`` picks."""
    remote.drops = [
        Drop(offset=offset, how=rng.choice(("fin", "rst")), pause=0.02) for offset in offsets
    ]


@fault(
    "003.network-drops",
    SEED,
    "the loopback server drops the connection at >= 20 random offsets (seeded) of the objects",
    "the build completes with the same snapshotId as an undisturbed build of the same URLs and "
    "partition key; bytes transferred <= 1.5x the objects' bytes (counted by the server)",
    catalog=False,
)
def network_drops(lab: Lab) -> Outcome:
    reference = _reference(lab)
    rng = _rng("003.network-drops")
    with _server(lab, reference.port) as server:
        size = sum(len(remote.body) for remote in server.objects.values())
        # >= 20 distinct offsets spread over the objects, at least 3 in each
        for remote in server.objects.values():
            count = max(3, 24 // len(server.objects))
            _drops_at(remote, sorted(rng.sample(range(1, len(remote.body)), count)), rng)
        armed = sum(len(remote.drops) for remote in server.objects.values())
        home = _web_home(lab, "network-drops", server)
        ran, built = _build(home)
        left = sum(len(remote.drops) for remote in server.objects.values())
        sent = server.sent()
    pins = _pins(home, server)
    ratio = sent / size
    equal = built is not None and built.snapshot_id == reference.built.snapshot_id
    return Outcome(
        observed=(
            f"build exit {ran.code}"
            + (f" ({ran.error_line()})" if ran.code else f", state {built.state if built else '?'}")
            + f"; {armed - left} of {armed} drops struck; server sent {sent} body bytes for"
            f" {size} ({ratio:.2f}x); {pins.summary()}"
        ),
        matched=ran.code == 0 and left == 0 and armed >= 20 and ratio <= 1.5 and pins.right,
        lost=_lost(home, pins, built),
        digests_equal=None if built is None else equal,
    )


def _killed_mid_download(home: Home, server: LoopbackServer, path: str) -> tuple[Path, int]:
    """Run the build until ``path`` has a checkpoint of verified bytes and its next request
    stalls, then SIGKILL the build's process group; the partial file and its verified bytes."""
    process = home.start("build", "--partition", PARTITION)
    key = hashlib.sha256(server.url(path).encode()).hexdigest()
    checkpoint = home.dir / "data" / "downloads" / f"{key}.partial.json"
    deadline = time.monotonic() + 30
    verified, remote = 0, server.objects[path]
    try:
        while not (verified and remote.gets >= 2):  # checkpointed, and stalled in the retry
            if process.poll() is not None or time.monotonic() > deadline:
                raise SelftestError(f"the build ended or hung before {path} was checkpointed")
            time.sleep(0.02)
            try:
                verified = int(json.loads(checkpoint.read_bytes())["verified_bytes"])
            except (FileNotFoundError, ValueError, KeyError):
                continue
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)  # reaped: the catalog sees its tasks' owner is gone
    return checkpoint.with_suffix(""), verified


def _flip(partial: Path, verified: int, rng: random.Random) -> list[int]:
    """Flip a few bytes inside the verified prefix, in place (the size stays)."""
    data = bytearray(partial.read_bytes())
    where = sorted(rng.sample(range(verified), min(4, verified)))
    for offset in where:
        data[offset] ^= 0x5A
    partial.write_bytes(bytes(data))
    return where


@fault(
    "003.corrupt-partial",
    SEED,
    "a build SIGKILLed mid-download, then bytes flipped inside the verified prefix of its "
    ".partial file",
    "the sha256 prefix check discards the partial and the download restarts from zero; "
    "the build completes and verifies; no corrupt byte is published",
    catalog=False,
)
def corrupt_partial(lab: Lab) -> Outcome:
    reference = _reference(lab)
    rng = _rng("003.corrupt-partial")
    with _server(lab, reference.port) as server:
        path = sorted(server.objects)[0]
        remote = server.objects[path]
        half = len(remote.body) // 2
        remote.drops = [Drop(offset=half, how="fin"), Drop(how="stall", stall_seconds=60)]
        home = _web_home(lab, "corrupt-partial", server)
        partial, verified = _killed_mid_download(home, server, path)
        flipped = _flip(partial, verified, rng)
        remote.drops, before, sent = [], remote.gets, remote.sent
        ran, built = _build(home)
        asked, resent = remote.ranges[before:], remote.sent - sent
    verdict = _verdict(home, built)
    pins = _pins(home, server)
    # the first request after the kill asks for the whole object, and gets it
    restarted = bool(asked) and asked[0] is None and resent == len(remote.body)
    return Outcome(
        observed=(
            f"killed with {verified} bytes verified of {len(remote.body)}, flipped bytes at"
            f" {flipped}; rerun asked {(asked[0] or 'no Range') if asked else 'nothing'} first"
            f" and was sent {resent} bytes of it;"
            f" build exit {ran.code}; {verdict}; {pins.summary()}"
        ),
        matched=ran.code == 0 and restarted and verdict.startswith("verify ok") and pins.right,
        lost=_lost(home, pins, built),
        digests_equal=None if built is None else built.snapshot_id == reference.built.snapshot_id,
    )


@fault(
    "003.ignores-range",
    SEED,
    "after a dropped connection the server ignores Range (answers 200 with the whole body)",
    "the download still completes correctly (restarted from zero), verified, within the"
    f" download byte budget ({TRANSFER_BUDGET:g}x the objects' bytes, counted by the server)",
    catalog=False,
)
def ignores_range(lab: Lab) -> Outcome:
    reference = _reference(lab)
    with _server(lab, reference.port) as server:
        for remote in server.objects.values():
            remote.honor_range = False
            remote.drops = [Drop(offset=len(remote.body) // 2, how="fin")]
        home = _web_home(lab, "ignores-range", server)
        size = sum(len(remote.body) for remote in server.objects.values())
        ran, built = _build(home)
        sent = server.sent()
        ignored = sum(
            1
            for remote in server.objects.values()
            for method, asked, status in remote.log
            if method == "GET" and asked is not None and status == 200
        )
    verdict = _verdict(home, built)
    pins = _pins(home, server)
    return Outcome(
        observed=(
            f"{ignored} ranged resumes answered 200 with the whole body; server sent {sent} body"
            f" bytes for {size} ({sent / size:.2f}x); build exit {ran.code}; {verdict};"
            f" {pins.summary()}"
        ),
        matched=ran.code == 0
        and ignored == len(server.objects)
        and sent <= TRANSFER_BUDGET * size
        and verdict.startswith("verify ok")
        and pins.right,
        lost=_lost(home, pins, built),
        digests_equal=None if built is None else built.snapshot_id == reference.built.snapshot_id,
    )


def _stale_version(body: bytes) -> bytes:
    """Other valid bytes for the object before it is rewritten: the same rows, re-compressed."""
    return zstandard.ZstdCompressor(level=1).compress(zstandard.decompress(body))


def _trail(log: list[tuple[str, str | None, int]]) -> str:
    """Requests as ``METHOD [Range] status``, in order."""
    return ", ".join(" ".join(filter(None, (m, r, str(status)))) for m, r, status in log)


@fault(
    "003.etag-changes",
    SEED,
    "an object is rewritten (new ETag, Last-Modified and bytes) while the build downloads it",
    "not appended to the old bytes: the download pinned to the listed version refuses the "
    "changed object, which is listed again (HEAD) and its new version fetched from byte zero; "
    "the snapshot pins the new bytes (as an undisturbed build of them)",
    catalog=False,
)
def etag_changes(lab: Lab) -> Outcome:
    reference = _reference(lab)
    with _server(lab, reference.port) as server:
        path = sorted(server.objects)[-1]
        remote = server.objects[path]
        current = remote.body  # the version the reference build pinned
        old = _stale_version(current)
        remote.change(old, content_etag(old), "Tue, 31 Dec 2024 00:00:00 GMT")
        cut = len(old) // 2
        remote.drops = [Drop(offset=cut, how="fin")]
        remote.after_drop = lambda r: r.change(current, content_etag(current), LAST_MODIFIED)
        home = _web_home(lab, "etag-changes", server)
        ran, built = _build(home)
        log = list(remote.log)
    pins = _pins(home, server)
    stale_pinned = _digest(old) in _pinned(home, server).values()
    gets = [(asked, status) for method, asked, status in log if method == "GET"]
    # the resume's If-Range no longer matched, so the new version came back whole (200)
    expected_gets = [(None, 200), (f"bytes={cut}-", 200), (None, 200)]
    at = [i for i, (method, _, _) in enumerate(log) if method == "GET"]
    relisted = len(at) == 3 and any(method == "HEAD" for method, _, _ in log[at[1] : at[2]])
    return Outcome(
        observed=(
            f"{path}: {_trail(log)}; build exit {ran.code}; {pins.summary()}"
            f" (the old version {'IS' if stale_pinned else 'is not'} pinned)"
        ),
        matched=ran.code == 0
        and gets == expected_gets
        and relisted
        and pins.right
        and not stale_pinned,
        lost=_lost(home, pins, built),
        digests_equal=None if built is None else built.snapshot_id == reference.built.snapshot_id,
    )
