"""The ``scrub`` job and its weekly ``scrub_servable`` schedule (stopped until started).

Builds trust unchanged files by stat; only a full re-hash finds corruption beneath the
filesystem. The job re-hashes every snapshot the aliases can serve (``core.publication.scrub``) and
fails naming each damaged snapshot and object, so a corrupt snapshot is seen before a training
run reads it. Launch it from the Launchpad (``alias`` narrows it) or start the schedule.
"""

import dagster as dg
from pydantic import Field

from corpus_assets.assets.resources import CorpusResource
from corpus_assets.core.publication.scrub import scrub

WEEKLY = "0 3 * * 0"


class ScrubConfig(dg.Config):
    alias: str = Field(default="", description="Only this alias's snapshots (empty: every alias).")


@dg.op(
    description="Re-hash every byte of every ACTIVE and APPROVED snapshot; fail naming what is "
    "damaged.",
    out=dg.Out(dg.Nothing),
)
def scrub_servable(
    context: dg.OpExecutionContext, config: ScrubConfig, corpus: CorpusResource
) -> dg.Output:
    with corpus.workspace() as ws, ws.cas_lock():  # gc must not remove what is being read
        report = scrub(ws.cas, ws.catalog, config.alias.strip() or None)
    rows = [
        f"| `{s.snapshot_id}` | {s.alias} | {s.state} | {s.objects} | "
        f"{'; '.join(s.findings) or 'ok'} |"
        for s in report.snapshots
    ]
    header = ["| snapshot | alias | state | objects | findings |", "|---|---|---|---|---|"]
    metadata = {
        "snapshots": dg.MetadataValue.int(len(report.snapshots)),
        "bytes_hashed": dg.MetadataValue.int(report.bytes_hashed),
        "report": dg.MetadataValue.md("\n".join([*header, *rows])),
    }
    damaged = [f"{s.snapshot_id}: {f}" for s in report.snapshots for f in s.findings]
    if damaged:
        raise dg.Failure(description=f"{len(damaged)} finding(s): {damaged[0]}", metadata=metadata)
    context.log.info(f"scrubbed {len(report.snapshots)} snapshot(s), nothing damaged")
    return dg.Output(None, metadata=metadata)


@dg.job(description="Re-hash everything the aliases can serve (core.publication.scrub).")
def scrub_job() -> None:
    scrub_servable()


scrub_schedule = dg.ScheduleDefinition(
    name="scrub_servable",
    job=scrub_job,
    cron_schedule=WEEKLY,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Weekly full re-hash of every servable snapshot; stopped until you start it.",
)
