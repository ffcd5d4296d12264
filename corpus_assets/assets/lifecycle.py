"""A snapshot's lifecycle on its partition: an observation of ``manifest`` at every state move.

The manifest's materialization is written while the snapshot is still BUILDING; each later move
(validated by the check, approved, activated, superseded) records an ``AssetObservation`` on the
same partition, so the partition's page shows where the snapshot stands now and how it got there,
and (``alias_history``) the alias's audit table, the one ``corpus-assets history`` prints: its
newest ``UI_HISTORY_ROWS`` moves, so each refresh reads a bounded number of events and manifests
however long the alias has lived (``alias_history_moves`` says how many there are in all).
"""

import time

import dagster as dg

from corpus_assets.core.governance import gate, states
from corpus_assets.core.governance.history import Move, alias_moves, count_moves
from corpus_assets.core.runtime.workspace import Workspace

UI_HISTORY_ROWS = 100


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def summary_markdown(
    snapshot: states.Snapshot, alias: gate.Gate, events: list[states.Event]
) -> str:
    """The current state first, then the audit trail oldest first."""
    serving = alias.active_snapshot == snapshot.snapshot_id
    lines = [
        f"**{snapshot.state}** · alias `{snapshot.alias}` generation {alias.generation}"
        + (" · **serving**" if serving else ""),
        "",
        f"snapshotId `{snapshot.snapshot_id}`",
        "",
        "| when | from | to | by | detail |",
        "|---|---|---|---|---|",
    ]
    for e in events:
        detail = (e.detail or "").replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {_when(e.at)} | {e.from_state or ''} | {e.to_state} | {e.actor} | {detail} |"
        )
    return "\n".join(lines)


HISTORY_COLUMNS = (
    ("when", "string", "UTC"),
    ("snapshot_id", "string", "the snapshot that moved"),
    ("partition", "string", "its partition"),
    ("from_state", "string", "empty: registered"),
    ("to_state", "string", "equal to from_state: a refused or repeated gate move"),
    ("actor", "string", "approver, activating run, rollback user"),
    ("generation", "int", "the alias generation once the move committed"),
    ("tombstone_watermark", "int", "the tombstone watermark the snapshot was built behind"),
    ("benchmark_fence", "int", "the benchmark fence the snapshot was built behind"),
    ("detail", "string", "why, or why refused"),
)


def history_table(moves: list[Move]) -> dg.TableMetadataValue:
    """The alias's history (``core.governance.history``) as a typed table, oldest first: the
    rows ``corpus-assets history ALIAS`` prints."""
    schema = dg.TableSchema(
        columns=[dg.TableColumn(name, kind, description=why) for name, kind, why in HISTORY_COLUMNS]
    )
    records = [
        dg.TableRecord(
            {
                "when": _when(m.at),
                "snapshot_id": m.snapshot_id,
                "partition": m.partition_key,
                "from_state": m.from_state or "",
                "to_state": m.to_state,
                "actor": m.actor,
                "generation": m.generation,
                "tombstone_watermark": m.tombstone_watermark,
                "benchmark_fence": m.benchmark_fence,
                "detail": m.detail,
            }
        )
        for m in moves
    ]
    return dg.MetadataValue.table(records=records, schema=schema)


def alias_history_metadata(ws: Workspace, alias: str) -> dict[str, dg.MetadataValue]:
    """The alias's newest moves as a table, and how many it has in all."""
    moves = alias_moves(ws.cas, ws.catalog, alias, last=UI_HISTORY_ROWS)
    return {
        "alias_history": history_table(moves),
        "alias_history_moves": dg.MetadataValue.int(count_moves(ws.catalog, alias)),
    }


def state_observation(
    ws: Workspace, snapshot_id: str, history: dict[str, dg.MetadataValue] | None = None
) -> dg.AssetObservation:
    """What the UI shows on the snapshot's partition of ``manifest`` after a state move;
    ``history``: the alias's history metadata when the caller already has it."""
    snapshot = states.get(ws.catalog, snapshot_id)
    alias = gate.read_gate(ws.catalog, snapshot.alias)
    events = states.history(ws.catalog, snapshot_id)
    return dg.AssetObservation(
        asset_key="manifest",
        partition=snapshot.partition_key,
        metadata={
            "state": dg.MetadataValue.text(snapshot.state),
            "alias": dg.MetadataValue.text(snapshot.alias),
            "generation": dg.MetadataValue.int(alias.generation),
            "serving": dg.MetadataValue.bool(alias.active_snapshot == snapshot_id),
            "snapshotId": dg.MetadataValue.text(snapshot_id),
            "approved_by": dg.MetadataValue.text(snapshot.approved_by or ""),
            "lifecycle": dg.MetadataValue.md(summary_markdown(snapshot, alias, events)),
            **(history or alias_history_metadata(ws, snapshot.alias)),
        },
    )


def moved_observations(ws: Workspace, snapshot_ids: list[str]) -> list[dg.AssetObservation]:
    """Observations for every snapshot an action moved (activation also supersedes others); the
    alias history table is read once per alias, not once per snapshot."""
    tables: dict[str, dict[str, dg.MetadataValue]] = {}
    found = []
    for sid in dict.fromkeys(snapshot_ids):
        alias = states.get(ws.catalog, sid).alias
        if alias not in tables:
            tables[alias] = alias_history_metadata(ws, alias)
        found.append(state_observation(ws, sid, tables[alias]))
    return found
