"""Against a built home: a source folder holding a link to the home's
private signing key, and an object deleted between the freeze's listing and its copy.

Each starts from a copy of the reference home with a source folder of its own (a few objects of
the standard corpus, copied in, not linked) and drives ``corpus-assets build`` processes; the
second holds its build at the ``pin/docs/listed`` failpoint while the object is deleted. The
reference snapshot must be untouched by either: its manifest still the catalog's, still intact.
"""

import shutil
import time

from corpus_assets.core.ingest.freeze_spec import FreezeSpec
from corpus_assets.core.publication.signing import key_paths
from corpus_assets.selftest.case import NO_LOSS, Outcome, fault
from corpus_assets.selftest.evidence import intact, workspace
from corpus_assets.selftest.lab import PARTITION, Home, Lab, Ran, SelftestError

NEXT = "p2"  # the partition the attacked build uses (the reference holds PARTITION)
PAUSE = "pin/docs/listed"
WAIT = 300.0


def _own_sources(lab: Lab, name: str, objects: int = 3) -> Home:
    """A copy of the reference home whose source ``docs`` is a folder of its own."""
    home, _built = lab.copy_of_reference(name)
    for path in sorted(lab.standard_sources.iterdir())[:objects]:
        shutil.copyfile(path, home.sources / path.name)
    home.configure([{"id": "docs", "kind": "objects", "path": str(home.sources)}])
    return home


def _reference_manifest(home: Home) -> str | None:
    with workspace(home) as ws:
        return ws.catalog.layer_output(PARTITION, "manifest")


def _reference_kept(home: Home, manifest: str | None) -> tuple[bool, str]:
    """(the reference's manifest is still the catalog's, what was lost: ``none`` or what)."""
    with workspace(home) as ws:
        now = ws.catalog.layer_output(PARTITION, "manifest")
        whole = manifest is not None and intact(ws, manifest)
    return now == manifest, NO_LOSS if whole else f"reference manifest {manifest} damaged"


def _stored_in_cas(home: Home, needle: bytes) -> int:
    """CAS files holding ``needle`` (the home's CAS, read here, not through the build)."""
    cas = home.dir / "data" / "cas"
    return sum(1 for p in cas.rglob("*") if p.is_file() and needle in p.read_bytes())


@fault(
    "attack.3-key-link",
    "031",
    "zz-key.jsonl in the source folder is a symlink to the data home's private signing key",
    "the build refuses in one line naming the link and its target; the key is nowhere in the "
    "CAS; the reference snapshot is untouched",
    catalog=False,
)
def key_link(lab: Lab) -> Outcome:
    home = _own_sources(lab, "key-link")
    private, _public = key_paths(home.dir / "data")
    if not private.is_file():
        raise SelftestError(f"the reference home has no private key at {private}")
    (home.sources / "zz-key.jsonl").symlink_to(private)
    before = _reference_manifest(home)
    ran = home.cli("build", "--partition", NEXT)
    secret = private.read_bytes().splitlines()[1]  # the key's base64 body
    copies = _stored_in_cas(home, secret)
    line = ran.error_line()
    lines = [each for each in ran.err.splitlines() if each.strip()]
    same, lost = _reference_kept(home, before)
    return Outcome(
        observed=f"build exit {ran.code}: {line}; stderr lines {len(lines)}; "
        f"CAS files holding the key: {copies}",
        matched=ran.code == 1
        and len(lines) == 1
        and "zz-key.jsonl" in line
        and str(private) in line
        and copies == 0,
        lost=lost if copies == 0 else f"the private key copied into {copies} CAS file(s)",
        digests_equal=same,
    )


def _paused_build(home: Home) -> tuple[Ran, str]:
    """``build --partition NEXT`` held after listing ``docs``; the first listed object deleted
    meanwhile. The finished build and the deleted name."""
    points = home.dir / "failpoints"
    points.mkdir()
    env = {"CORPUS_FAILPOINTS": f"{PAUSE}=pause@1", "CORPUS_FAILPOINT_DIR": str(points)}
    args = ("build", "--partition", NEXT)
    proc = home.start(*args, env=env)
    slug = PAUSE.replace("/", "_")
    deadline = time.monotonic() + WAIT
    while not (points / f"{slug}.paused").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SelftestError(f"the build never paused at {PAUSE}: {proc.communicate()[1]!r}")
        time.sleep(0.05)
    deleted = sorted(p.name for p in home.sources.iterdir())[0]
    (home.sources / deleted).unlink()
    (points / f"{slug}.go").touch()
    out, err = proc.communicate(timeout=600)
    return Ran(args, proc.returncode, out, err), deleted


@fault(
    "attack.4-deleted-before-copy",
    "031",
    "an object deleted after the freeze listed it and before it was copied",
    "the freeze fails in one line naming the object (its records never silently vanish); "
    "nothing is frozen; a rerun freezes the folder as it now is and validates; the reference "
    "snapshot is untouched",
    catalog=False,
)
def deleted_before_copy(lab: Lab) -> Outcome:
    home = _own_sources(lab, "deleted-before-copy")
    before = _reference_manifest(home)
    first, deleted = _paused_build(home)
    with workspace(home) as ws:
        frozen = ws.catalog.freeze_digest(NEXT)
    rerun = home.build("--partition", NEXT)
    with workspace(home) as ws:
        spec = FreezeSpec.load(ws.cas, ws.catalog.freeze_digest(NEXT) or "")
    pinned = sorted(o.name for s in spec.sources for o in s.objects)
    present = sorted(p.name for p in home.sources.iterdir())
    line = first.error_line()
    same, lost = _reference_kept(home, before)
    if frozen is not None and deleted not in pinned:  # the first build froze without it
        lost = f"the records of {deleted}, listed but missing from {NEXT}'s freeze"
    return Outcome(
        observed=f"build exit {first.code}: {line}; {NEXT} frozen: {frozen is not None}; "
        f"rerun {rerun.state} pins {len(pinned)} of {len(present)} objects now present",
        matched=first.code == 1
        and deleted in line
        and "deleted before" in line
        and frozen is None
        and rerun.state == "VALIDATED"
        and pinned == present,
        lost=lost,
        digests_equal=same,
    )
