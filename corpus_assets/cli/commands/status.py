"""``corpus-assets status``: aliases, snapshots, and partitions whose build has not ended in a
snapshot (running, or killed before its manifest and waiting to be resumed)."""

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url

from corpus_assets.cli.common import opened
from corpus_assets.core.governance import alias_gate, states
from corpus_assets.core.runtime.layer_index import LAYERS
from corpus_assets.core.storage.catalog import Catalog

if TYPE_CHECKING:
    from dagster import DagsterInstance, DagsterRun

BUILD_JOB = "build_snapshot"
ENDED = (states.INCOMPLETE, states.REJECTED, states.SUPERSEDED, states.EXPIRED)  # terminal


def unfinished(catalog: Catalog, built: set[str]) -> list[dict[str, Any]]:
    """Partitions frozen, or with a build run, that have no snapshot: how far each got and what
    its last run did (a run whose worker died is marked failed first)."""
    runs = _last_build_runs()
    keys = [k for k in catalog.partition_keys() if k not in built]
    keys += sorted(k for k in runs if k not in built and k not in keys)
    return [
        {
            "partition": key,
            "layersBuilt": sum(catalog.layer_output(key, layer) is not None for layer in LAYERS),
            "run": runs.get(key, "no run in this Dagster instance"),
        }
        for key in keys
    ]


def _last_build_runs() -> dict[str, str]:
    """One line per partition on its newest build run; nothing without a Dagster instance (the
    command never creates one)."""
    from corpus_assets.cli.instance import dagster_home, dagster_instance

    if not (dagster_home() / "dagster.yaml").is_file():
        return {}
    from corpus_assets.assets.run_workers import last_runs

    instance = dagster_instance()
    return {
        key: _describe(instance, key, run) for key, run in last_runs(instance, BUILD_JOB).items()
    }


def _describe(instance: "DagsterInstance", key: str, run: "DagsterRun") -> str:
    from corpus_assets.assets.run_workers import failure_message, run_worker

    worker = run_worker(run)
    line = f"last run {run.run_id} {run.status.value}"
    if not run.is_finished:
        return line + (f" ({worker.describe()})" if worker else "")
    if run.is_success:
        return line
    why = failure_message(instance, run)
    return f"{line}{': ' + why if why else ''}; `corpus-assets build --partition {key}` resumes it"


def status_payload() -> dict[str, Any]:
    """What ``status`` prints, as data (``--json`` prints it as is)."""
    with opened() as home:
        return _payload(home.home, home.catalog)


def _payload(home: Path, catalog: Catalog) -> dict[str, Any]:
    snaps = states.find(catalog)
    gates = [alias_gate.read_alias_gate(catalog, a) for a in sorted({s.alias for s in snaps})]
    current = {row.active_snapshot for row in gates}
    ended = states.last_events(catalog, [s.snapshot_id for s in snaps if s.state in ENDED])
    reasons = {sid: event.detail for sid, event in ended.items()}
    return {
        "home": str(home),
        "catalog": make_url(catalog.url).render_as_string(hide_password=True),
        "aliases": [
            {
                "alias": row.alias,
                "generation": row.generation,
                "active": row.active_snapshot,
                "tombstoneWatermark": str(row.tombstone_watermark),
                "benchmarkFence": str(row.benchmark_fence),
            }
            for row in gates
        ],
        "snapshots": [
            {
                "snapshotId": s.snapshot_id,
                "partition": s.partition_key,
                "alias": s.alias,
                "state": s.state,
                "current": s.snapshot_id in current,
                "approvedBy": s.approved_by,
                "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(s.created_at)),
                "reason": reasons.get(s.snapshot_id),  # why it ended INCOMPLETE, REJECTED, ...
            }
            for s in snaps
        ],
        "unfinished": unfinished(catalog, {s.partition_key for s in snaps}),
    }


ENDED_SHOWN = 10  # ended snapshots listed by default, newest first; older ones are counted


def cmd_status(args: argparse.Namespace) -> int:
    payload = status_payload()
    if args.json:
        print(json.dumps(payload, indent=2))
        return 0
    print("\n".join(status_lines(payload, show_all=args.all)))
    return 0


def status_lines(payload: dict[str, Any], show_all: bool = False) -> list[str]:
    """The text view: aliases, then every snapshot still in play and the newest ``ENDED_SHOWN``
    ended ones (a daily build with retention ends one a day: the rest become one count line,
    so the view stays a screen long after a year), then unfinished partitions."""
    lines = [f"home {payload['home']}  catalog {payload['catalog']}"]
    for a in payload["aliases"]:
        lines.append(
            f"alias {a['alias']}: generation {a['generation']} -> {a['active'] or '(none)'} "
            f"(tombstone {a['tombstoneWatermark']}, benchmark fence {a['benchmarkFence']})"
        )
    if not payload["snapshots"]:
        lines.append("no snapshots yet")
    snapshots, hidden = _shown(payload["snapshots"], show_all)
    for s in snapshots:
        mark = "*" if s["current"] else " "
        lines.append(
            f"{mark} {s['createdAt']}  {s['partition']:<24} {s['state']:<10} {s['snapshotId']}"
        )
        if s["reason"]:
            reason = s["reason"] if len(s["reason"]) <= 160 else s["reason"][:159] + "…"
            lines.append(f"    {reason}")
    if hidden:
        counts = ", ".join(f"{state} {n}" for state, n in sorted(hidden.items()))
        lines.append(
            f"  ... and {sum(hidden.values())} older ended snapshots ({counts}): "
            "`corpus-assets status --all` (or --json) lists every one"
        )
    if any(s["current"] for s in snapshots):
        lines.append("(* = what its alias points at now)")
    for u in payload["unfinished"]:
        built = f"{u['layersBuilt']}/{len(LAYERS)} layers built"
        lines.append(f"partition {u['partition']}: no snapshot yet, {built}; {u['run']}")
    return lines


def _shown(snapshots: list[dict[str, Any]], show_all: bool) -> tuple[list[dict], Counter[str]]:
    """Every snapshot not ended, and the newest ``ENDED_SHOWN`` ended ones (``snapshots`` come
    oldest first), in their order; the states of the ended ones left out."""
    ended = [n for n, s in enumerate(snapshots) if s["state"] in ENDED and not s["current"]]
    left = set() if show_all else set(ended[:-ENDED_SHOWN])
    shown = [s for n, s in enumerate(snapshots) if n not in left]
    return shown, Counter(snapshots[n]["state"] for n in left)
