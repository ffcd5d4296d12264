"""Issue 31, point 8 (audit trail): a forged line in an audit field. ``approve --by`` with a
newline used to write a second, made-up row into ``history``; a tombstone reason or a permit's
run id could do the same to their registries. Each must be refused with one line naming the
field and the character, write nothing, and leave the snapshot as approvable as before."""

from corpus_assets.selftest.case import NO_LOSS, Outcome, fault
from corpus_assets.selftest.evidence import workspace
from corpus_assets.selftest.lab import Home, Lab, Ran

ALIAS = "train"  # the lab's corpus.yaml sets none: the config's default alias
FORGED_ROW = "1999-01-01 00:00:00  sha256:forged  APPROVED -> ACTIVE  mallory"


def _refused(ran: Ran, field: str) -> bool:
    """Exit 1 with the one error line naming ``field`` and a line feed's position."""
    lines = ran.err.strip().splitlines()
    return (
        ran.code == 1
        and len(lines) == 1
        and lines[0].startswith(f"corpus-assets: error: {field}: character ")
        and "U+000A" in lines[0]
    )


def _verified(home: Home, sid: str) -> bool:
    return home.cli("verify", sid).code == 0


@fault(
    "attack.8-approve-forged-newline",
    "031",
    "approve --by with a newline and a made-up history row after it",
    "approve refuses naming --by and the character; history shows no forged row; a proper "
    "approval still succeeds",
)
def approve_forged_newline(lab: Lab) -> Outcome:
    home, built = lab.copy_of_reference("approve-forged")
    forged = home.cli("approve", built.snapshot_id, "--by", f"alice\n{FORGED_ROW}")
    history = home.cli("history", ALIAS)
    shown = FORGED_ROW in history.out or "mallory" in history.out
    approved = home.cli("approve", built.snapshot_id, "--by", "selftest")
    return Outcome(
        observed=f"approve exit {forged.code}: {forged.error_line()}; "
        f"history {'SHOWS' if shown else 'has no'} forged row",
        matched=_refused(forged, "--by") and history.code == 0 and not shown,
        lost=NO_LOSS if approved.code == 0 else f"proper approval refused: {approved.error_line()}",
        digests_equal=_verified(home, built.snapshot_id),
    )


@fault(
    "attack.8-audit-fields-forged",
    "031",
    "a newline in a tombstone reason, a permit's run id and purpose",
    "each command refuses naming its flag; no tombstone, permit or event is written; the "
    "snapshot stays activatable",
)
def audit_fields_forged(lab: Lab) -> Outcome:
    home, built = lab.copy_of_reference("audit-forged")
    sid = built.snapshot_id
    tomb = home.cli("tombstone", "add", "--record", "x/1", "--reason", f"gdpr\n{FORGED_ROW}")
    home.publish(sid)  # after the tombstone attempt: a written tombstone would fence it
    read = home.cli("read", sid, "--run-id", f"run\n{FORGED_ROW}", "--purpose", "selftest")
    purpose = home.cli("read", sid, "--run-id", "run-2", "--purpose", "selftest\nx")
    with workspace(home) as ws, ws.catalog.begin() as conn:
        written = conn.exec_driver_sql(
            "select (select count(*) from tombstones) + (select count(*) from permits)"
        ).scalar_one()
    honest = home.cli("read", sid, "--run-id", "run-3", "--purpose", "selftest")
    refused = [
        _refused(tomb, "--reason"),
        _refused(read, "--run-id"),
        _refused(purpose, "--purpose"),
    ]
    return Outcome(
        observed=f"tombstone exit {tomb.code}, read exit {read.code} and {purpose.code}: "
        f"{read.error_line()}; rows written {written}",
        matched=all(refused) and written == 0,
        lost=NO_LOSS if honest.code == 0 else f"honest read refused: {honest.error_line()}",
        digests_equal=_verified(home, sid),
    )
