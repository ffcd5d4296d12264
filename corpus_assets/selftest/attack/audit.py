"""The audit trail: a forged line in an audit field. ``approve --by`` with a
newline used to write a second, made-up row into ``history``; a tombstone reason or a permit's
run id could do the same to their registries. Each must be refused with one line naming the
field and the character, write nothing, and leave the snapshot as approvable as before."""

import json

from corpus_assets.selftest.case import NO_LOSS, Outcome, fault
from corpus_assets.selftest.corpus import write_zstd_jsonl
from corpus_assets.selftest.evidence import workspace
from corpus_assets.selftest.lab import Home, Lab, Ran

ALIAS = "train"  # the lab's corpus.yaml sets none: the config's default alias
FORGED_ROW = "1999-01-01 00:00:00  sha256:forged  APPROVED -> ACTIVE  mallory"


def _refused(ran: Ran, field: str) -> bool:
    """Exit 1 with the one error line naming ``field`` and a line feed's position."""
    return ran.refused_in_one_line(1, f"error: {field}: character ", "U+000A")


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


SECRET_ROWS = [  # (id, text, the secret that must not reach a canonical record)
    ("cfg", "db:\n  host: db.internal\n  password: hunter2-Zq9\n", "hunter2-Zq9"),
    ("env", "export API_KEY=AbC123xyz987 && ./deploy.sh --prod", "AbC123xyz987"),
    ("url", "DATABASE_URL=postgresql://app:s3cr3t-Pw@db.example.com/shop", "s3cr3t-Pw"),
]
PROSE = ("prose", "Forgot the password field again? The secret garden is open on Sundays.")


@fault(
    "attack.8-secrets-in-key-value-lines",
    "031",
    "source lines holding password: ..., API_KEY=... and a URL's user:password@host",
    "each value is redacted to [SECRET] (the key kept), counted as a secret in the record's "
    "lineage; a prose line about passwords keeps every word",
    catalog=False,
)
def secrets_in_key_value_lines(lab: Lab) -> Outcome:
    home = lab.home("pii-secrets")
    rows = [{"id": i, "text": text} for i, text, _ in SECRET_ROWS] + [
        {"id": PROSE[0], "text": PROSE[1]}
    ]
    write_zstd_jsonl(home.sources / "part-000.jsonl.zst", rows)
    home.configure([{"id": "cfg", "kind": "objects", "path": str(home.sources)}])
    built = home.build("--partition", "p1")
    counts: dict[str, dict[str, int]] = {}
    leaked = []
    for record, _text, secret in [*SECRET_ROWS, (*PROSE, None)]:
        ran = home.cli(
            "lineage", built.snapshot_id, "--record", f"cfg/{record}", "--format", "json"
        )
        counts[record] = _pii_counts(json.loads(ran.out)) if ran.code == 0 else {"?": 1}
        if secret is not None and secret in ran.out:
            leaked.append(record)
    redacted = [r for r, _t, _s in SECRET_ROWS if counts[r].get("secret") == 1]
    return Outcome(
        observed=f"secrets counted in {len(redacted)} of {len(SECRET_ROWS)} records "
        f"{counts}; prose redactions {counts[PROSE[0]] or 'none'}; leaked in lineage {leaked}",
        matched=len(redacted) == len(SECRET_ROWS) and not counts[PROSE[0]] and not leaked,
        lost=NO_LOSS,
        digests_equal=_verified(home, built.snapshot_id),
    )


def _pii_counts(lineage: object) -> dict[str, int]:
    """The record lineage's ``pii_redacted`` counts, wherever the document nests them."""
    if isinstance(lineage, dict):
        if isinstance(lineage.get("pii_redacted"), dict):
            return lineage["pii_redacted"]
        lineage = list(lineage.values())
    for item in lineage if isinstance(lineage, list) else []:
        if found := _pii_counts(item):
            return found
    return {}
