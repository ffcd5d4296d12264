"""The ``record_lineage`` job: record-level lineage in the UI (Launchpad -> the run's page).

Launch it with a snapshot digest and a record id (or a shard / block / token range for the
reverse); the op answers with ``core.audit.record_lineage`` / ``span_records`` and shows the
answer as Markdown and JSON metadata on its output (the run page). It records nothing on the
``manifest`` partition: a lookup is a question about the snapshot, not an event of it, and the
partition's newest observation must keep saying where the snapshot stands.
"""

from typing import Any, Optional

import dagster as dg
from pydantic import Field

from corpus_assets.assets.resources import CorpusResource
from corpus_assets.core.audit.record_lineage import record_lineage as trace_record
from corpus_assets.core.audit.record_lineage_render import (
    markdown,
    record_sections,
    record_title,
    span_sections,
    span_title,
)
from corpus_assets.core.audit.span_records import SpanQuery, span_records
from corpus_assets.core.publication.verify import resolve

BLOCK = "A block number (numbered across the pack)."
START = "First token of a range in the block."
END = "Token after the range in the block."


class RecordLineageConfig(dg.Config):
    """A record id, or a shard and/or block (and a token range in the block): not both."""

    digest: str = Field(description="The snapshotId or manifest digest of the snapshot.")
    record_id: str = Field(
        default="",
        description="A record id (e.g. essays/e0004); an excluded row may also be named "
        "SOURCE/OBJECT_NAME#L<line>. Leave empty to list the records of a shard or block.",
    )
    shard: str = Field(default="", description="A packed shard by CAS digest or position.")
    # Optional, not ``int | None``: Dagster's config schema needs it (noqa: UP045)
    block: Optional[int] = Field(default=None, description=BLOCK)  # noqa: UP045
    start: Optional[int] = Field(default=None, description=START)  # noqa: UP045
    end: Optional[int] = Field(default=None, description=END)  # noqa: UP045


@dg.op(
    description="One record's lineage (origin, canonical stages, dedup, split, samples, spans, "
    "runs), or the records in a packed shard/block/token range.",
    out=dg.Out(dg.Nothing),
)
def trace_lineage(
    context: dg.OpExecutionContext, config: RecordLineageConfig, corpus: CorpusResource
) -> dg.Output:
    # the CAS lock, shared: a lookup may write the snapshot's deletion index (``publication.gc``)
    with corpus.workspace() as ws, ws.cas_lock():
        snapshot = resolve(ws.catalog, config.digest.strip())
        if config.record_id.strip():
            answer = trace_record(ws.cas, ws.catalog, snapshot, config.record_id.strip(), ws.config)
            text = markdown(record_title(answer), record_sections(answer))
        else:
            query = SpanQuery(config.shard.strip() or None, config.block, config.start, config.end)
            answer = span_records(ws.cas, ws.catalog, snapshot, query)
            text = markdown(span_title(answer), span_sections(answer))
    metadata = {
        "record_lineage": dg.MetadataValue.md(text),
        "record_lineage_json": dg.MetadataValue.json(answer),
    }
    context.log.info(text.splitlines()[0].removeprefix("### "))
    return dg.Output(None, metadata=metadata)


@dg.job(
    description="Record-level lineage: launch with `digest` and `record_id` (or `shard` / "
    "`block` / `start` / `end` for the records in packed spans); the answer is on the run page."
)
def record_lineage() -> None:
    trace_lineage()


def record_lineage_run_config(digest: str, record_id: str = "", **spans: Any) -> dict[str, Any]:
    """Run config for ``record_lineage`` (the Launchpad takes the same); ``spans``: shard,
    block, start, end."""
    config = {"digest": digest, "record_id": record_id, **spans}
    return {"ops": {"trace_lineage": {"config": config}}}
