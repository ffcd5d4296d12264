"""Jobs the UI launches to revoke data and register benchmarks, with their config checked.

The CLI's ``tombstone add``, ``tombstone lift``, ``benchmark add`` and ``benchmark remove`` as
jobs: the same core calls, so the same fences move (a tombstone or its lift raises every alias's
tombstone watermark, a benchmark change its benchmark fence) and the same refusals apply. The
launchpad refuses a missing field or a kind outside record/object/group before the run starts
(they are the config schema); every free-text field is an audit field, checked when the run
starts, before anything is written. A refusal ends the run with one line (a ``Failure``: no
stack trace to read). The change is recorded as made by the run (``dagster-run:<id>``, plus
``dagster/user`` where Dagster records one), never by a name typed in.
"""

from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

from corpus_assets.assets.jobs import approver_identity
from corpus_assets.assets.refusals import refused_in_one_line
from corpus_assets.assets.resources import CorpusResource
from corpus_assets.core.governance import benchmarks, tombstones
from corpus_assets.core.governance.audit_fields import audit_field
from corpus_assets.core.records.benchmark_file import read_items


class TombstoneConfig(dg.Config):
    """What to revoke and why."""

    kind: Literal["record", "object", "group"] = Field(
        description="record (a record id, e.g. essays/e0001), object (a raw object digest "
        "sha256:...) or group (a group id)."
    )
    target: str = Field(description="The record id, object digest or group id to revoke.")
    reason: str = Field(description="Why (recorded in the tombstone and shown to auditors).")


@dg.op(description="Record a tombstone and fence every alias at its sequence number.")
def record_tombstone(
    context: dg.OpExecutionContext, config: TombstoneConfig, corpus: CorpusResource
) -> int:
    actor = approver_identity(context.run_id, context.run.tags, "")
    with refused_in_one_line():
        target, reason = _text("target", config.target), _text("reason", config.reason)
        with corpus.workspace() as ws:
            seq = tombstones.add_tombstone(ws.catalog, config.kind, target, reason, actor=actor)
    context.log.info(
        f"tombstone {seq}: {config.kind} {target}; every alias is fenced at "
        f"tombstone watermark {seq}"
    )
    return seq


@dg.job(
    description="Revoke a record, source object or group: later builds exclude it and no "
    "snapshot built before it can activate (the CLI's `tombstone add`)."
)
def tombstone_add() -> None:
    record_tombstone()


class TombstoneLiftConfig(dg.Config):
    """Which tombstone to withdraw and why."""

    seq: int = Field(gt=0, description="The tombstone's number (from `tombstone add` or its run).")
    reason: str = Field(description="Why it is lifted (recorded, shown to auditors).")


@dg.op(description="Lift a tombstone and fence every alias at the lift's sequence number.")
def lift_tombstone(
    context: dg.OpExecutionContext, config: TombstoneLiftConfig, corpus: CorpusResource
) -> int:
    actor = approver_identity(context.run_id, context.run.tags, "")
    with refused_in_one_line():
        reason = _text("reason", config.reason)
        with corpus.workspace() as ws:
            seq = tombstones.lift_tombstone(ws.catalog, config.seq, reason, actor=actor)
    context.log.info(tombstones.lift_said(seq, config.seq))
    return seq


@dg.job(
    description="Withdraw a tombstone (the CLI's `tombstone lift`): builds from then on may "
    "hold its target again; snapshots built before never do, and none of them can activate."
)
def tombstone_lift() -> None:
    lift_tombstone()


class BenchmarkConfig(dg.Config):
    """A benchmark file to register (one JSON object per line), readable by the Dagster run."""

    name: str = Field(description="The benchmark's name (item ids become NAME/<id>).")
    file: str = Field(description="Path of the JSONL file on the machine that runs the job.")
    text_field: str = Field(default="text", description="The field holding each item's text.")


@dg.op(description="Read the file, put each text in the CAS, register the items.")
def register_benchmark(
    context: dg.OpExecutionContext, config: BenchmarkConfig, corpus: CorpusResource
) -> int:
    actor = approver_identity(context.run_id, context.run.tags, "")
    # the texts go in the CAS before the registry names them: under the CAS lock, as a build
    with refused_in_one_line(), corpus.workspace() as ws, ws.cas_lock():
        name, file = _text("name", config.name), Path(_text("file", config.file)).expanduser()
        items = read_items(ws.cas, name, file, _text("text_field", config.text_field))
        change = benchmarks.register(ws.catalog, name, items, actor=actor)
    kept = f" ({change.unchanged} already registered)" if change.unchanged else ""
    context.log.info(
        f"benchmark {config.name}: {change.written} items{kept}; benchmark fence now {change.seq}"
    )
    return change.written


@dg.job(
    description="Register a benchmark's items (the CLI's `benchmark add`): every alias's "
    "benchmark fence advances, so snapshots must be checked against them before activation."
)
def benchmark_add() -> None:
    register_benchmark()


class BenchmarkRemovalConfig(dg.Config):
    """A benchmark to withdraw, whole or some items."""

    name: str = Field(description="The benchmark's name.")
    items: list[str] = Field(
        default_factory=list, description="Item ids to withdraw (all of them when empty)."
    )


@dg.op(description="Withdraw a benchmark or some of its items and advance every fence.")
def withdraw_benchmark(
    context: dg.OpExecutionContext, config: BenchmarkRemovalConfig, corpus: CorpusResource
) -> int:
    actor = approver_identity(context.run_id, context.run.tags, "")
    with refused_in_one_line(), corpus.workspace() as ws:
        prefix = f"{_text('name', config.name)}/"
        ids = [i if i.startswith(prefix) else prefix + i for i in config.items] or None
        change = benchmarks.remove(ws.catalog, config.name, ids, actor=actor)
    context.log.info(
        f"benchmark {config.name}: {change.written} items removed; every alias is fenced at "
        f"benchmark fence {change.seq}"
    )
    return change.written


@dg.job(description="Withdraw a benchmark, or some of its items (the CLI's `benchmark remove`).")
def benchmark_remove() -> None:
    withdraw_benchmark()


def _text(field: str, value: str) -> str:
    """A free-text config field, stripped: refused (one line naming it) when empty or when it
    holds a line break or control character (it is written to the audit trail)."""
    if not value.strip():
        raise ValueError(f"config field {field!r} is empty")
    return audit_field(f"config field {field!r}", value.strip())


GOVERNANCE_JOBS = [tombstone_add, tombstone_lift, benchmark_add, benchmark_remove]
