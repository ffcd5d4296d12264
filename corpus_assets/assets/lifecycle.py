"""Where a snapshot stands, derived from the catalog at every move and shown in the UI.

Two places, each written fresh by the code path that moves a state, whatever launched it (a run,
a sensor's run, the CLI: ``observing``):

- the ``alias`` asset, one partition per alias: what the alias serves now (snapshot, partition,
  generation, fences), what ``newest-validated`` would approve and its shadow diff, and the
  alias's audit table (``alias_history``, the one ``corpus-assets history`` prints: its newest
  ``UI_HISTORY_ROWS`` moves, with ``alias_history_moves`` the count of all);
- the ``manifest`` partition of every snapshot whose standing changed: its state, whether it
  serves, the generation it last served at (a fact of the snapshot, never the alias's current
  generation, which every other snapshot's move changes), its audit trail; and, while it is a
  candidate (VALIDATED or APPROVED), its ``review``: the shadow diff against what the alias
  serves now, refreshed whenever that changes, so an approver reads it before approving.

The UI shows each metadata key's newest value on a partition, so a key is either rewritten by
every observation of that partition or describes something that never changes.
"""

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import dagster as dg

from corpus_assets.core.governance import alias_gate, states
from corpus_assets.core.governance.history import (
    Move,
    alias_moves,
    count_moves,
    served_generations,
)
from corpus_assets.core.publication.shadow import shadow_diff
from corpus_assets.core.storage.cas import CasError, ContentStore
from corpus_assets.core.storage.catalog import Catalog

UI_HISTORY_ROWS = 100
ALIAS_ASSET = "alias"
CANDIDATES = (states.VALIDATED, states.APPROVED)  # what an approval or activation may still move


class Store(Protocol):
    """An opened data home (``core.runtime.workspace.Storage``, with or without its config):
    what the observations are derived from."""

    @property
    def cas(self) -> ContentStore: ...

    @property
    def catalog(self) -> Catalog: ...


@dataclass(frozen=True)
class Standing:
    """What the UI says of one snapshot: a move that changes any of it re-observes it."""

    state: str
    serving: bool
    served_generation: int | None  # the newest generation that pointed at it; None: never


def standings(store: Store, alias: str) -> dict[str, Standing]:
    """Every snapshot of ``alias`` and where it stands now."""
    active = alias_gate.read_alias_gate(store.catalog, alias).active_snapshot
    served = served_generations(store.catalog, alias)
    return {
        s.snapshot_id: Standing(s.state, s.snapshot_id == active, served.get(s.snapshot_id))
        for s in states.find(store.catalog)
        if s.alias == alias
    }


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))


def _served_text(standing: Standing) -> str:
    if standing.serving:
        return f"**serving** (since generation {standing.served_generation})"
    if standing.served_generation is not None:
        return (
            f"not serving (last served at generation {standing.served_generation}; the "
            "`alias` asset shows what the alias serves now)"
        )
    return "never served"


def summary_markdown(
    snapshot: states.Snapshot, standing: Standing, events: list[states.Event]
) -> str:
    """Where the snapshot stands first, then its audit trail oldest first."""
    lines = [
        f"**{snapshot.state}** · alias `{snapshot.alias}` · {_served_text(standing)}",
        "",
        f"snapshotId `{snapshot.snapshot_id}`",
        "",
        "| when | from | to | by | detail |",
        "|---|---|---|---|---|",
    ]
    for e in events:
        detail = _cell(e.detail or "")
        lines.append(
            f"| {_when(e.at)} | {e.from_state or ''} | {e.to_state} | {e.actor} | {detail} |"
        )
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def review_markdown(
    diff: dict[str, Any], gate_row: alias_gate.AliasGate, partitions: dict[str, str]
) -> str:
    """The shadow diff as a reviewer reads it: against what, how many members move, and how the
    shares shift."""
    against = diff.get("active")
    if against is None:
        head = f"Approving makes this the **first** snapshot alias `{gate_row.alias}` serves"
    else:
        head = (
            f"Against what alias `{gate_row.alias}` serves now, generation "
            f"{gate_row.generation}: `{against}` (partition {partitions.get(against, '?')})"
        )
    lines = [
        head,
        "",
        f"**+{diff['added']:,} added · −{diff['removed']:,} removed · "
        f"{diff['split_migrations']:,} split migrations**",
        "",
        "| share | now | candidate |",
        "|---|---|---|",
    ]
    new, old = diff["candidate_profile"], diff.get("active_profile") or {}
    for kind in ("source_share", "split_share"):
        for name, share in new[kind].items():
            lines.append(
                f"| {kind.removesuffix('_share')} {_cell(name)} | "
                f"{old.get(kind, {}).get(name, '-')} | {share} |"
            )
    for what, ids in sorted((diff.get("examples") or {}).items()):
        if ids:
            lines.append(f"\n{what}: " + ", ".join(f"`{_cell(i)}`" for i in ids))
    return "\n".join(lines)


Diffs = dict[str, dict[str, Any]]  # snapshotId -> its shadow diff, within one observation


def _diff(store: Store, snapshot_id: str, diffs: Diffs) -> dict[str, Any]:
    if snapshot_id not in diffs:
        diffs[snapshot_id] = shadow_diff(store.cas, store.catalog, snapshot_id, remembered=True)
    return diffs[snapshot_id]


def _review(
    store: Store, snapshot: states.Snapshot, gate_row: alias_gate.AliasGate, diffs: Diffs
) -> dict[str, Any]:
    """``review`` (and ``shadow_diff``) for a candidate; for any other state a line saying the
    snapshot is past review, so no stale diff reads as current."""
    if snapshot.state not in CANDIDATES:
        return {
            "review": dg.MetadataValue.md(
                f"**{snapshot.state}**: not a candidate, nothing to approve. `shadow_diff` is "
                "its last review, against the snapshot it names as `active`."
            )
        }
    try:
        diff = _diff(store, snapshot.snapshot_id, diffs)
    except CasError as e:  # e.g. its manifest gone from the store: the move is still shown
        return {"review": dg.MetadataValue.md(f"**not reviewable**: {e}")}
    partitions = {s.snapshot_id: s.partition_key for s in states.find(store.catalog)}
    return {
        "review": dg.MetadataValue.md(review_markdown(diff, gate_row, partitions)),
        "shadow_diff": dg.MetadataValue.json(diff),
    }


def state_observation(
    store: Store, snapshot_id: str, standing: Standing | None = None, diffs: Diffs | None = None
) -> dg.AssetObservation:
    """What the UI shows on the snapshot's partition of ``manifest``, derived now."""
    snapshot = states.get(store.catalog, snapshot_id)
    standing = standing or standings(store, snapshot.alias)[snapshot_id]
    gate_row = alias_gate.read_alias_gate(store.catalog, snapshot.alias)
    events = states.history(store.catalog, snapshot_id)
    served = standing.served_generation
    return dg.AssetObservation(
        asset_key="manifest",
        partition=snapshot.partition_key,
        metadata={
            "state": dg.MetadataValue.text(snapshot.state),
            "alias": dg.MetadataValue.text(snapshot.alias),
            "serving": dg.MetadataValue.bool(standing.serving),
            # the generation this snapshot last served at (0: never), not the alias's current
            "generation": dg.MetadataValue.int(served or 0),
            "snapshotId": dg.MetadataValue.text(snapshot_id),
            "approved_by": dg.MetadataValue.text(snapshot.approved_by or ""),
            "lifecycle": dg.MetadataValue.md(summary_markdown(snapshot, standing, events)),
            **_review(store, snapshot, gate_row, {} if diffs is None else diffs),
        },
    )


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


def alias_history_metadata(store: Store, alias: str) -> dict[str, dg.MetadataValue]:
    """The alias's newest moves as a table, and how many it has in all."""
    moves = alias_moves(store.cas, store.catalog, alias, last=UI_HISTORY_ROWS)
    return {
        "alias_history": history_table(moves),
        "alias_history_moves": dg.MetadataValue.int(count_moves(store.catalog, alias)),
    }


def _newest_validated(store: Store, alias: str) -> states.Snapshot | None:
    """What the approval launchpad's default (``newest-validated``) resolves to now."""
    order = states.positions(store.catalog, alias)
    found = [s for s in states.find(store.catalog, states.VALIDATED) if s.alias == alias]
    return max(found, key=lambda s: order[s.snapshot_id]) if found else None


ALIAS_COLUMNS = (
    ("alias", "string", "the alias a training run names"),
    ("serving", "string", "the snapshotId it serves now (empty: nothing yet)"),
    ("partition", "string", "that snapshot's partition of manifest"),
    ("generation", "int", "the alias's current generation"),
    ("tombstone_watermark", "int", "no snapshot built behind it can activate"),
    ("benchmark_fence", "int", "likewise for benchmark changes"),
    ("newest_validated", "string", "what approve_snapshot's default config would approve"),
)


def _alias_text(
    store: Store, row: alias_gate.AliasGate, partitions: dict[str, str], diffs: Diffs
) -> list[str]:
    """One alias as a reader of the catalog page wants it: what it serves, what is next."""
    serving = row.active_snapshot
    text = [
        f"### Alias `{row.alias}`",
        "",
        (
            f"Serves `{serving}` (partition {partitions.get(serving, '?')})"
            if serving
            else "Serves nothing yet"
        )
        + f" at **generation {row.generation}**; tombstone watermark "
        f"{row.tombstone_watermark}, benchmark fence {row.benchmark_fence}.",
        "",
    ]
    candidate = _newest_validated(store, row.alias)
    if candidate is None:
        return [*text, "No VALIDATED snapshot waits for approval.", ""]
    diff = _diff(store, candidate.snapshot_id, diffs)
    return [
        *text,
        f"`approve_snapshot` with `partition: newest-validated` would approve "
        f"`{candidate.snapshot_id}` (partition {candidate.partition_key}); its `review`, also "
        "on that `manifest` partition:",
        "",
        review_markdown(diff, row, partitions),
        "",
    ]


def alias_observation(store: Store, diffs: Diffs | None = None) -> dg.AssetObservation:
    """Every alias as one place, each observation complete (the page shows each key's newest
    value): what each serves, at which generation, what approval would pick, its history."""
    snapshots = states.find(store.catalog)
    partitions = {s.snapshot_id: s.partition_key for s in snapshots}
    rows = [
        alias_gate.read_alias_gate(store.catalog, a) for a in sorted({s.alias for s in snapshots})
    ]
    text: list[str] = []
    records = []
    history: dict[str, dg.MetadataValue] = {}
    for row in rows:
        text += _alias_text(store, row, partitions, {} if diffs is None else diffs)
        candidate = _newest_validated(store, row.alias)
        serving = row.active_snapshot or ""
        records.append(
            dg.TableRecord(
                {
                    "alias": row.alias,
                    "serving": serving,
                    "partition": partitions.get(serving, ""),
                    "generation": row.generation,
                    "tombstone_watermark": row.tombstone_watermark,
                    "benchmark_fence": row.benchmark_fence,
                    "newest_validated": candidate.snapshot_id if candidate else "",
                }
            )
        )
        history.update(
            {f"{k}.{row.alias}": v for k, v in alias_history_metadata(store, row.alias).items()}
        )
    schema = dg.TableSchema(
        columns=[dg.TableColumn(name, kind, description=why) for name, kind, why in ALIAS_COLUMNS]
    )
    return dg.AssetObservation(
        asset_key=ALIAS_ASSET,
        metadata={
            "summary": dg.MetadataValue.md("\n".join(text) or "No snapshot yet."),
            "aliases": dg.MetadataValue.table(records=records, schema=schema),
            **history,
        },
    )


def moved_observations(
    store: Store, alias: str, before: dict[str, Standing], also: Iterable[str] = ()
) -> list[dg.AssetObservation]:
    """The alias's observation, and one per snapshot whose standing changed since ``before``
    (or in ``also``); when the served snapshot changed, every candidate too: its review was
    against the old one."""
    after = standings(store, alias)
    moved_active = {s for s, x in before.items() if x.serving} != {
        s for s, x in after.items() if x.serving
    }
    chosen = [
        sid
        for sid, now in after.items()
        if before.get(sid) != now or sid in also or (moved_active and now.state in CANDIDATES)
    ]
    diffs: Diffs = {}  # one shadow diff per candidate, however many views show it
    partitions = [state_observation(store, sid, after[sid], diffs) for sid in chosen]
    return [*partitions, alias_observation(store, diffs)]


Emit = Callable[[dg.AssetObservation], None]


@contextmanager
def observing(store: Store, alias: str, emit: Emit, also: Iterable[str] = ()) -> Iterator[None]:
    """Around a move of ``alias``'s snapshots: afterwards (also when the move was refused, which
    leaves an event in the history) observe the alias and every snapshot whose standing
    changed, in the code path that moved it."""
    before = standings(store, alias)
    try:
        yield
    finally:
        for observation in moved_observations(store, alias, before, also):
            emit(observation)


def runless(instance: dg.DagsterInstance) -> Emit:
    """``emit`` outside a run (the CLI): the observation lands on the instance directly."""
    return instance.report_runless_asset_event


alias_asset = dg.AssetSpec(
    ALIAS_ASSET,
    group_name="corpus",
    description="Each alias as it stands: the snapshot it serves, its generation and "
    "fences, what `approve_snapshot` would approve by default with its shadow diff, and the "
    "alias's history. Observed by every move, never materialized.",
    deps=[dg.AssetDep("manifest", partition_mapping=dg.AllPartitionMapping())],
    owners=["team:corpus-data"],
)
