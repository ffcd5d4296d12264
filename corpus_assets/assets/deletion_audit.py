"""Deletion lineage in the UI: what a tombstone reaches, on the run page and on every snapshot hit.

``corpus-assets tombstone hits SEQ`` answers on the command line; the ``tombstone_hits`` job
answers the same question (``core.governance.deletion_reach.tombstone_hits``, one function for both)
in the UI. Its op's output carries the whole answer as a table, and each snapshot the tombstone
reaches gets an observation on its ``manifest`` partition (with the lifecycle fields, since the
newest observation is where a snapshot stands), so an auditor reading a snapshot's page sees
the revocations that hit it. The ``tombstone_audit`` sensor launches the job for each
new tombstone, so nobody has to remember to.
"""

from typing import Any

import dagster as dg
from sqlalchemy import select

from corpus_assets.assets.lifecycle import state_observation
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.core.governance.deletion_reach import tombstone_hits
from corpus_assets.core.storage.catalog import tombstones

HIT_COLUMNS = (
    ("snapshot_id", "string", "a snapshot holding the target or a duplicate of it"),
    ("partition", "string", "its partition"),
    ("state", "string", "its state now"),
    ("members", "int", "members the tombstone names"),
    ("carried", "int", "removed duplicates whose content a kept member carried"),
    ("spans", "int", "packed spans of those records"),
    ("blocks", "int", "packed blocks holding them"),
    ("runs", "string", "training runs whose permits read the snapshot"),
)


class TombstoneHitsConfig(dg.Config):
    """The tombstone to trace, by the number ``corpus-assets tombstone add`` printed."""

    seq: int


def hits_table(answer: dict[str, Any]) -> dg.TableMetadataValue:
    schema = dg.TableSchema(
        columns=[dg.TableColumn(name, kind, description=why) for name, kind, why in HIT_COLUMNS]
    )
    records = [
        dg.TableRecord(
            {
                "snapshot_id": hit["snapshotId"],
                "partition": hit["partition"],
                "state": hit["state"],
                "members": len(hit["members"]),
                "carried": len(hit["carried_by"]),
                "spans": len(hit["spans"]),
                "blocks": len(hit["blocks"]),
                "runs": ", ".join(hit["runs"]),
            }
        )
        for hit in answer["snapshots"]
    ]
    return dg.MetadataValue.table(records=records, schema=schema)


def hit_markdown(answer: dict[str, Any], hit: dict[str, Any]) -> str:
    """One snapshot's share of a tombstone's lineage, as its partition page shows it."""
    head = f"**tombstone {answer['tombstone']}** ({answer['kind']} `{answer['target']}`)"
    lines = [f"{head}: {answer['reason']}", "", "| what | ids |", "|---|---|"]
    lines.append(f"| members | {', '.join(f'`{m}`' for m in hit['members']) or '-'} |")
    carried = [f"`{c['record_id']}` via `{c['representative_id']}`" for c in hit["carried_by"]]
    lines.append(f"| carried by a kept duplicate | {', '.join(carried) or '-'} |")
    lines.append(f"| packed blocks | {', '.join(map(str, hit['blocks'])) or '-'} |")
    lines.append(f"| training runs that read it | {', '.join(hit['runs']) or '-'} |")
    return "\n".join(lines)


@dg.op(description="Trace a tombstone: every snapshot, member, packed span and run it reaches.")
def trace_tombstone(
    context: dg.OpExecutionContext, config: TombstoneHitsConfig, corpus: CorpusResource
) -> dg.Output[None]:
    with corpus.workspace() as ws, ws.cas_lock():  # shared: the lookup may build an index
        answer = tombstone_hits(ws.cas, ws.catalog, config.seq)
        pages = [state_observation(ws, hit["snapshotId"]) for hit in answer["snapshots"]]
    for hit, page in zip(answer["snapshots"], pages, strict=True):
        shown = {
            "tombstone_hits": dg.MetadataValue.md(hit_markdown(answer, hit)),
            "tombstone": dg.MetadataValue.int(config.seq),
        }
        # the newest observation is where the snapshot stands: it keeps the state fields
        context.log_event(
            dg.AssetObservation(
                asset_key="manifest",
                partition=page.partition,
                metadata={**page.metadata, **shown},
            )
        )
    reached = len(answer["snapshots"])
    context.log.info(f"tombstone {config.seq} reaches {reached} snapshot(s)")
    return dg.Output(
        None,
        metadata={
            "tombstone": dg.MetadataValue.int(config.seq),
            "target": dg.MetadataValue.text(f"{answer['kind']} {answer['target']}"),
            "snapshots_hit": dg.MetadataValue.int(reached),
            "hits": hits_table(answer),
            "lineage": dg.MetadataValue.json(answer),
        },
    )


@dg.job(
    name="tombstone_hits",
    description="Deletion lineage of one tombstone (the UI's `corpus-assets tombstone hits`).",
    executor_def=dg.in_process_executor,
)
def tombstone_hits_job() -> None:
    trace_tombstone()


def hits_run_config(seq: int) -> dict[str, Any]:
    return {"ops": {"trace_tombstone": {"config": {"seq": seq}}}}


@dg.sensor(
    job=tombstone_hits_job,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Traces each new tombstone, so the snapshots it reaches show it in the UI.",
)
def tombstone_audit(context: dg.SensorEvaluationContext, corpus: CorpusResource) -> dg.SensorResult:
    if (waiting := corpus.missing_config()) is not None:
        return dg.SensorResult(skip_reason=waiting)
    after = int(context.cursor or 0)
    with corpus.workspace() as ws, ws.catalog.begin() as conn:
        new = conn.execute(
            select(tombstones.c.seq, tombstones.c.at)
            .where(tombstones.c.seq > after)
            .order_by(tombstones.c.seq)
        ).all()
    if not new:
        return dg.SensorResult(skip_reason=f"no tombstone after {after}")
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(  # at: a fresh catalog's tombstone 1 is another tombstone
                run_key=f"tombstone:{seq}:{at!r}",
                run_config=hits_run_config(seq),
                tags={"corpus/tombstone": str(seq)},
            )
            for seq, at in new
        ],
        cursor=str(new[-1].seq),
    )
