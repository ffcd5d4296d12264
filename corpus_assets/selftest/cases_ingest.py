"""Faults at the freeze and on what a snapshot is bound to: objects added or deleted
during the scan, an object name reused with other bytes, a CDC offset gap, a late CDC event, a
transform image retagged with other code, one record id in two splits.

Each drives ``corpus-assets build`` (the ``build_snapshot`` job) and the gate's commands as CLI
processes; the fault is a change to the source folder, the code or the stored manifest made
between or during those processes. What was pinned is read back from the freeze spec in the CAS.
"""

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from corpus_assets.core.governance import alias_gate, states
from corpus_assets.core.ingest.freeze_spec import FreezeSpec, ObjectsSourceSpec
from corpus_assets.core.publication.identity import snapshot_id
from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.publication.signing import sign_snapshot
from corpus_assets.core.runtime.transform import PACKAGE_ROOT
from corpus_assets.core.storage.artifacts import put_table
from corpus_assets.core.storage.digests import canonical_json
from corpus_assets.selftest.case import NO_LOSS, Outcome, fault
from corpus_assets.selftest.corpus import row_text, write_objects, write_zstd_jsonl
from corpus_assets.selftest.evidence import intact, workspace
from corpus_assets.selftest.lab import PARTITION, Home, Lab, Ran, SelftestError, parse_built

NEXT = "p2"  # the partition key of the build after the fault
PAUSE = "pin/docs/listed"  # the failpoint after the objects source's first listing
WAIT = 300.0  # seconds a case waits for a paused build to reach its point


def _small_home(lab: Lab, name: str) -> Home:
    """A home whose source ``docs`` is its own small, writable copy of a standard-like corpus."""
    home = lab.home(name)
    write_objects(home.sources, objects=4, lines=80)
    home.configure([{"id": "docs", "kind": "objects", "path": str(home.sources)}])
    return home


def _spec(home: Home, partition: str) -> FreezeSpec:
    with workspace(home) as ws:
        digest = ws.catalog.freeze_digest(partition)
        if digest is None:
            raise SelftestError(f"partition {partition} has no freeze")
        return FreezeSpec.load(ws.cas, digest)


def _objects(spec: FreezeSpec) -> dict[str, str]:
    """Pinned name -> sha256 of the freeze's objects source(s)."""
    return {o.name: o.sha256 for s in spec.sources for o in s.objects}


def _finish(proc: "subprocess.Popen[str]", args: tuple[str, ...]) -> Ran:
    out, err = proc.communicate(timeout=600)
    return Ran(args, proc.returncode, out, err)


def _cli(home: Home, *args: str, env: dict[str, str]) -> Ran:
    """``home.cli`` with extra environment (a failpoint, another code path)."""
    return _finish(home.start(*args, env=env), args)


def _reference_at(lab: Lab, name: str, source: Path) -> "subprocess.Popen[str]":
    """An undisturbed build of ``source`` at ``NEXT`` in a fresh home, started (runs alongside
    the case's own build: same source path and partition key, so the snapshotIds compare)."""
    home = lab.home(name)
    home.configure([{"id": "docs", "kind": "objects", "path": str(source)}])
    return home.start("build", "--partition", NEXT)


def _reference_id(proc: "subprocess.Popen[str]") -> str:
    ran = _finish(proc, ("build", "--partition", NEXT))
    if ran.code != 0:
        raise SelftestError(f"reference build failed: {ran.error_line()}")
    return parse_built(ran.out).snapshot_id


def _paused_build(home: Home) -> tuple["subprocess.Popen[str]", Path]:
    """``build --partition p1`` held at ``PAUSE``: the process and the file that releases it."""
    points = home.dir / "failpoints"
    points.mkdir()
    env = {"CORPUS_FAILPOINTS": f"{PAUSE}=pause@1", "CORPUS_FAILPOINT_DIR": str(points)}
    proc = home.start("build", "--partition", PARTITION, env=env)
    slug = PAUSE.replace("/", "_")
    deadline = time.monotonic() + WAIT
    while not (points / f"{slug}.paused").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _out, err = proc.communicate()
            raise SelftestError(f"the build never paused at {PAUSE}: {err[-300:]!r}")
        time.sleep(0.05)
    return proc, points / f"{slug}.go"


@fault(
    "001.scan-add-delete",
    "001",
    "an object added and another deleted while the freeze lists the source",
    "the object deleted before its copy fails the freeze in one line naming it (its records "
    "never silently vanish) and nothing is frozen; the next build pins the added object "
    "and drops the deleted one, as a fresh build of that folder does",
    catalog=False,
)
def scan_add_delete(lab: Lab) -> Outcome:
    home = _small_home(lab, "scan-add-delete")
    listed = sorted(p.name for p in home.sources.iterdir())
    proc, go = _paused_build(home)
    added, deleted = "part-900.jsonl.zst", listed[0]
    write_zstd_jsonl(home.sources / added, [{"id": "late-1", "text": "added during the scan"}])
    (home.sources / deleted).unlink()
    go.touch()
    first = _finish(proc, ("build", "--partition", PARTITION))
    with workspace(home) as ws:
        frozen = ws.catalog.freeze_digest(PARTITION)
    reference = _reference_at(lab, "scan-add-delete-ref", home.sources)
    second = home.build("--partition", NEXT)
    expected_id = _reference_id(reference)
    later = _spec(home, NEXT)
    now = _objects(later)
    refused = first.error_line()
    matched = (
        first.code == 1
        and deleted in refused
        and "deleted before" in refused
        and frozen is None
        and set(now) == set(listed) - {deleted} | {added}
        and not [s for s in later.sources if isinstance(s, ObjectsSourceSpec) and s.deferred]
    )
    return Outcome(
        observed=f"{PARTITION} build exit {first.code}: {refused}; {PARTITION} frozen: "
        f"{frozen is not None}; {NEXT} {second.state} pins {len(now)} "
        f"({'with' if added in now else 'without'} {added}, "
        f"{'with' if deleted in now else 'without'} {deleted}); {NEXT} "
        f"{'==' if second.snapshot_id == expected_id else '!='} a fresh build of that folder",
        matched=matched,
        lost=_lost_pins(home, now),
        digests_equal=second.snapshot_id == expected_id,
    )


def _lost_pins(home: Home, pinned: dict[str, str]) -> str:
    """Pinned objects whose CAS copy is missing or damaged (``none`` when all are intact)."""
    with workspace(home) as ws:
        bad = [name for name, digest in pinned.items() if not intact(ws, digest)]
    return NO_LOSS if not bad else f"pinned objects damaged: {', '.join(bad)}"


@fault(
    "001.name-reused",
    "001",
    "an object name reused with other bytes after a snapshot was built",
    "the next snapshot pins the new digest; the earlier snapshot still verifies and reads its "
    "own pinned bytes from the CAS; nothing is lost",
    catalog=False,
)
def name_reused(lab: Lab) -> Outcome:
    home = _small_home(lab, "name-reused")
    first = home.build("--partition", PARTITION)
    name = sorted(p.name for p in home.sources.iterdir())[1]
    original = (home.sources / name).read_bytes()
    rows = [{"id": f"reused-{i}", "text": row_text(lab.rng)} for i in range(80)]
    write_zstd_jsonl(home.sources / name, rows)  # same name, other bytes
    fresh = f"sha256:{hashlib.sha256((home.sources / name).read_bytes()).hexdigest()}"
    reference = _reference_at(lab, "name-reused-ref", home.sources)
    second = home.build("--partition", NEXT)
    expected_id = _reference_id(reference)
    old, new = _objects(_spec(home, PARTITION))[name], _objects(_spec(home, NEXT))[name]
    verify = home.cli("verify", first.snapshot_id)
    with workspace(home) as ws:
        kept = intact(ws, old) and ws.cas.get_bytes(old) == original
    same = old == f"sha256:{hashlib.sha256(original).hexdigest()}"
    return Outcome(
        observed=f"{name}: {PARTITION} pinned {old[:19]}…, {NEXT} pins {new[:19]}… "
        f"({'the new bytes' if new == fresh else 'not the new bytes'}); verify {PARTITION} "
        f"exit {verify.code}; its pinned bytes {'read back' if kept else 'NOT readable'}",
        matched=new == fresh and same and verify.code == 0 and kept,
        lost=NO_LOSS if kept and verify.code == 0 else f"{PARTITION}'s pinned {name} ({old})",
        digests_equal=second.snapshot_id == expected_id,
    )


def _event(lsn: int, op: str, key: int, body: str | None = None) -> dict[str, Any]:
    """A Debezium-style change event (``core/ingest/changelog/events.py``)."""
    after = None if body is None else {"id": key, "body": body}
    before = {"id": key, "body": "old"} if op in ("u", "d") else None
    return {"op": op, "before": before, "after": after, "source": {"lsn": lsn}}


def _segment(folder: Path, name: str, events: list[dict[str, Any]]) -> None:
    (folder / name).write_text("".join(json.dumps(e) + "\n" for e in events))


def _cdc_home(lab: Lab, name: str, segments: dict[str, list[int]]) -> Home:
    """A home whose one source is a change log: per segment file, the lsns of its events (each
    creates ticket ``lsn`` with its own text)."""
    home = lab.home(name)
    for segment, lsns in segments.items():
        events = [_event(n, "c", n, f"ticket {n}: {row_text(lab.rng, 30)}") for n in lsns]
        _segment(home.sources, segment, events)
    source = {"id": "tickets", "kind": "changelog", "path": str(home.sources)}
    home.configure([{**source, "key_field": "id", "text_field": "body"}])
    return home


def _partition_state(home: Home, partition: str) -> tuple[str, str]:
    """(snapshotId, state) of the partition's newest snapshot, from the catalog."""
    with workspace(home) as ws:
        built = states.for_partition(ws.catalog, partition)
        if not built:
            raise SelftestError(f"partition {partition} registered no snapshot")
        newest = max(built, key=lambda s: s.created_at)
        return newest.snapshot_id, newest.state


def _active(home: Home) -> str | None:
    with workspace(home) as ws:
        return alias_gate.read_alias_gate(ws.catalog, ws.config.alias).active_snapshot


@fault(
    "001.cdc-gap",
    "001",
    "a changelog (CDC) source whose offsets 4-6 are missing",
    "the build does not publish silently: the snapshot is INCOMPLETE naming the missing "
    "offsets, and approval refuses it",
)
def cdc_gap(lab: Lab) -> Outcome:
    home = _cdc_home(lab, "cdc-gap", {"000.jsonl": [1, 2, 3], "001.jsonl": [7, 8]})
    build = home.cli("build", "--partition", PARTITION)
    sid, state = _partition_state(home, PARTITION)
    approve = home.cli("approve", sid, "--by", "selftest")
    missing = "CDC offsets missing lsn 4-6"
    matched = (
        build.code != 0
        and missing in build.err
        and state == states.INCOMPLETE
        and approve.code != 0
        and _active(home) is None
    )
    return Outcome(
        observed=f"build exit {build.code}: {build.error_line()}; state {state}; "
        f"approve exit {approve.code}: {approve.error_line()}",
        matched=matched,
        digests_equal=None,  # nothing publishable to compare
    )


@fault(
    "001.cdc-late-event",
    "001",
    "a CDC event at lsn 2 (below the frozen watermark 5) arriving after the snapshot was "
    "built and approved",
    "the late event is not folded into the signed set: verify fails naming the source, the "
    "offset and the watermark; the snapshot becomes INCOMPLETE and activation refuses it; a "
    "later approve refuses it too",
)
def cdc_late_event(lab: Lab) -> Outcome:
    home = _cdc_home(lab, "cdc-late-event", {"000.jsonl": [1, 2, 3, 4, 5]})
    built = home.build("--partition", PARTITION)
    home.must("approve", built.snapshot_id, "--by", "selftest")
    _segment(home.sources, "001.jsonl", [_event(2, "u", 2, "ticket 2, rewritten late")])
    verify = home.cli("verify", built.snapshot_id)
    activate = home.cli("activate", built.snapshot_id)
    _sid, state = _partition_state(home, PARTITION)
    approve = home.cli("approve", built.snapshot_id, "--by", "selftest")
    named = "source 'tickets': late CDC events at or below watermark 5: lsn 2"
    refused = activate.code != 0 and "INCOMPLETE" in activate.err and "lsn 2" in activate.err
    matched = refused and state == states.INCOMPLETE and _active(home) is None
    return Outcome(
        observed=f"verify exit {verify.code}: {verify.first_failure()}; activate exit "
        f"{activate.code}: {activate.error_line()}; state {state}; approve exit "
        f"{approve.code}: {approve.error_line()}",
        matched=matched
        and verify.code == 1
        and named in verify.err
        and approve.code != 0
        and "late CDC" in approve.err,
        digests_equal=None,  # no second build to compare
    )


def _retagged_code(root: Path) -> Path:
    """A copy of this package (and its lock file) with one line appended to one module: the
    same version tag, another image digest. Returns the folder to put on PYTHONPATH."""
    folder = root / "retagged-code"
    if not folder.is_dir():
        shutil.copytree(
            PACKAGE_ROOT,
            folder / PACKAGE_ROOT.name,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        lock = PACKAGE_ROOT.parent / "uv.lock"
        if lock.is_file():
            shutil.copy2(lock, folder / "uv.lock")
        with open(folder / PACKAGE_ROOT.name / "core" / "dedup" / "layer.py", "a") as handle:
            handle.write("# a one-line change, released under the same version tag\n")
    return folder


@fault(
    "001.image-retag",
    "001",
    "a transform image with the same tag and another digest (this package with one line "
    "changed) approves and activates a built snapshot",
    "the replay with other code is named (same tag, another digest) and the snapshot is not "
    "activated",
    catalog=False,
)
def image_retag(lab: Lab) -> Outcome:
    home, built = lab.copy_of_reference("image-retag")
    env = {"PYTHONPATH": str(_retagged_code(lab.root))}
    approve = _cli(home, "approve", built.snapshot_id, "--by", "selftest", env=env)
    activate = _cli(home, "activate", built.snapshot_id, env=env)
    _sid, state = _partition_state(home, PARTITION)
    named = "(same tag, another digest)"
    matched = (
        approve.code != 0
        and named in approve.err
        and activate.code != 0
        and named in activate.err
        and _active(home) is None
    )
    return Outcome(
        observed=f"approve exit {approve.code}: {approve.error_line()}; activate exit "
        f"{activate.code} ({'names' if named in activate.err else 'does not name'} it too); "
        f"state {state}; alias active {_active(home)}",
        matched=matched,
        lost=NO_LOSS if state == states.VALIDATED else f"snapshot moved to {state}",
        digests_equal=None,  # no build of its own: it replays the reference's
    )


def _forge_twin(home: Home) -> tuple[str, str]:
    """Store a re-signed copy of p1's manifest whose members table repeats its first row in
    another split, registered as a new snapshot: (its snapshotId, the twinned record id)."""
    with workspace(home) as ws:
        manifest = json.loads(ws.cas.get_bytes(ws.catalog.layer_output(PARTITION, "manifest")))
        members = read_members(ws.cas, manifest["members"])
        row = members.slice(0, 1).to_pylist()[0]
        twin = {**row, "split": "test" if row["split"] != "test" else "train"}
        forged = pa.concat_tables([members, pa.Table.from_pylist([twin], schema=members.schema)])
        ref = put_table(ws.cas, forged)
        uri = ws.cas.uri(ref["digest"])
        manifest["members"] = {**manifest["members"], **ref, "uri": uri, "count": len(forged)}
        manifest.pop("signature")
        manifest["snapshotId"] = sid = snapshot_id(manifest)
        manifest["signature"] = sign_snapshot(ws.home, sid)
        stored = ws.cas.put_bytes(canonical_json(manifest))
        states.register(ws.catalog, sid, PARTITION, stored, ws.config.alias)
        return sid, str(row["record_id"])


@fault(
    "001.same-id-two-splits",
    "001",
    "the same record id in two splits (a forged members table with a twin row, re-signed)",
    "validation names the duplicate id and the snapshot is refused (not approved, not activated)",
    catalog=False,
)
def same_id_two_splits(lab: Lab) -> Outcome:
    home, built = lab.copy_of_reference("same-id-two-splits")
    sid, record = _forge_twin(home)
    verify = home.cli("verify", sid)
    approve = home.cli("approve", sid, "--by", "selftest")
    activate = home.cli("activate", sid)
    with workspace(home) as ws:
        state = states.get(ws.catalog, sid).state
    named = f"record_id {record!r} appears 2 times in members"
    matched = (
        approve.code != 0
        and named in approve.err
        and activate.code != 0
        and state == states.REJECTED
        and _active(home) is None
    )
    original = home.cli("verify", built.snapshot_id)
    return Outcome(
        observed=f"verify exit {verify.code}; approve exit {approve.code}: "
        f"{approve.error_line()}; activate exit {activate.code}; state {state}",
        matched=matched,
        lost=NO_LOSS if original.code == 0 else f"the built snapshot {built.snapshot_id}",
        digests_equal=None,  # no build of its own: it forges the reference's
    )
