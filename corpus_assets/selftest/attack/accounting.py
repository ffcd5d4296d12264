"""No row vanishes: a row repeating a record id with another text
is quarantined as ``id.conflict`` and counted, never one of two silently lost, and a snapshot
whose counts do not add up per source (a members row dropped, re-signed consistently) is refused
by the gate every approval runs."""

import json
import shutil

from corpus_assets.core.governance import states
from corpus_assets.core.publication.identity import snapshot_id
from corpus_assets.core.publication.member_parts import read_members
from corpus_assets.core.publication.signing import sign_snapshot
from corpus_assets.core.runtime.snapshot_manifest import read_manifest
from corpus_assets.core.storage.artifacts import put_table
from corpus_assets.core.storage.digests import canonical_json
from corpus_assets.selftest.case import NO_LOSS, Outcome, fault
from corpus_assets.selftest.evidence import intact, workspace
from corpus_assets.selftest.lab import PARTITION, Home, Lab, Ran, parse_built

TARGET = "docs/0-7"  # a member of the standard corpus whose id the attack reuses


def _member_rows(home: Home, sid: str, record_id: str) -> list[tuple[str, int]]:
    """(object, line) of every members row of ``record_id`` in snapshot ``sid``."""
    with workspace(home) as ws:
        digest = states.get(ws.catalog, sid).manifest_digest
        manifest = read_manifest(ws.cas, digest)
        table = read_members(ws.cas, manifest.members)
    rows = table.select(["record_id", "object", "line"]).to_pylist()
    return [(r["object"], r["line"]) for r in rows if r["record_id"] == record_id]


def _counts(ran: Ran) -> dict[str, int]:
    """The manifest counts ``corpus-assets show`` printed (empty when it failed)."""
    return json.loads(ran.out).get("counts", {}) if ran.code == 0 else {}


@fault(
    "attack.4-id-conflict",
    "031",
    "a new object repeats a member's record id with another, longer text",
    "the build validates; the later row is quarantined as id.conflict and counted "
    "(counts.id_conflicts 1, records = members + duplicates + id counts); the original row "
    "stays the member; the reference snapshot is unchanged",
    catalog=False,
)
def id_conflict(lab: Lab) -> Outcome:
    home, built = lab.copy_of_reference("id-conflict")
    for path in sorted(lab.standard_sources.iterdir()):
        shutil.copy2(path, home.sources / path.name)
    longer = "an attacker's replacement text for a record id already in use " * 8
    (home.sources / "zz-conflict.jsonl").write_text(
        json.dumps({"id": "0-7", "text": longer}) + "\n"
    )
    home.configure([{"id": "docs", "kind": "objects", "path": str(home.sources)}])
    with workspace(home) as ws:
        reference_manifest = states.get(ws.catalog, built.snapshot_id).manifest_digest
    ran = home.cli("build", "--partition", "p2")
    sid = parse_built(ran.out).snapshot_id if ran.code == 0 else ""
    counts = _counts(home.cli("show", sid)) if sid else {}
    before, after = _member_rows(home, built.snapshot_id, TARGET), []
    if counts:
        after = _member_rows(home, sid, TARGET)
    accounted = sum(
        counts.get(k, 0) for k in ("members", "duplicates_removed", "duplicate_ids", "id_conflicts")
    )
    matched = (
        ran.code == 0
        and counts.get("id_conflicts") == 1
        and counts.get("records") == accounted
        and after == before
        and "1 record quarantined as id.conflict" in ran.out
    )
    verify = home.cli("verify", built.snapshot_id)
    with workspace(home) as ws:
        kept = intact(ws, reference_manifest)
        unchanged = states.get(ws.catalog, built.snapshot_id).manifest_digest == reference_manifest
    return Outcome(
        observed=(
            f"build exit {ran.code} ({ran.error_line() if ran.code else 'ok'}); "
            f"counts records {counts.get('records')} members {counts.get('members')} "
            f"id_conflicts {counts.get('id_conflicts')}; member {TARGET} at {after} "
            f"(reference {before})"
        ),
        matched=matched,
        lost=NO_LOSS if kept and verify.code == 0 else "reference snapshot no longer verifies",
        digests_equal=unchanged,
    )


@fault(
    "attack.4-members-row-dropped",
    "031",
    "a members row dropped and the manifest re-signed consistently (count and signature right)",
    "approve refuses: the gate counts_add_up names the source whose canonical records are no "
    "longer all accounted for; the signed original is intact",
    catalog=False,
)
def members_row_dropped(lab: Lab) -> Outcome:
    home, _built = lab.copy_of_reference("members-row-dropped")
    with workspace(home) as ws:
        signed = ws.catalog.layer_output(PARTITION, "manifest")
        manifest = json.loads(ws.cas.get_bytes(signed))
        members = read_members(ws.cas, manifest["members"])
        ref = put_table(ws.cas, members.slice(1))
        manifest["members"] = {**manifest["members"], **ref, "count": members.num_rows - 1}
        manifest["counts"] = {**manifest["counts"], "members": members.num_rows - 1}
        manifest.pop("signature")
        manifest["snapshotId"] = forged = snapshot_id(manifest)
        manifest["signature"] = sign_snapshot(ws.home, forged)
        stored = ws.cas.put_bytes(canonical_json(manifest))
        states.register(ws.catalog, forged, PARTITION, stored, ws.config.alias)
    approve = home.cli("approve", forged, "--by", "selftest")
    with workspace(home) as ws:
        kept = intact(ws, signed)
        state = states.get(ws.catalog, forged).state
        why = [e.detail or "" for e in states.history(ws.catalog, forged) if e.to_state == state]
    # approve's one line shows the first failed rule; the REJECTED event names each of them
    found = [f for f in "; ".join(why).split("; ") if f.startswith("counts_add_up: ")]
    named = any("canonical records !=" in f and "accounted for" in f for f in found)
    return Outcome(
        observed=(
            f"approve exit {approve.code}: {approve.error_line()}; forged snapshot {state}; "
            f"{found[0] if found else 'counts_add_up not among the failed rules'}"
        ),
        matched=approve.code == 1 and named and state == states.REJECTED,
        lost=NO_LOSS if kept else f"signed manifest {signed} damaged",
        digests_equal=None,  # no build of its own: it forges a copy of the reference's
    )
