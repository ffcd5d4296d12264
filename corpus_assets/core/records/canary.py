"""The canary: a fixed subset of source rows, re-canonicalised from their pinned
versions with this code, must give exactly the rows the snapshot recorded for them.

The subset is fixed and bounded by rows, not by chunks: the first ``lines`` source lines
(``policies.validation.canary_lines``, 1,024 by default; null replays whole objects) of the
first chunk of each source. Whole first chunks grew with the corpus (288k records, a third of
the build's check at 1.1 GB) while proving no more about the transform than a fixed number of
rows of every source. Every column of every kept row and every exclusion of those lines is
compared - the payload and text through ``record_digest`` and ``text_digest``, which hash them
(``verify`` hashes the stored table's bytes), so the snapshot's large columns are never read -
and a changed adapter, normaliser, PII or quality rule, or a different payload shows up as the
first row that differs.
"""

import hashlib
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from corpus_assets.core.ingest.freeze_spec import FreezeSpec
from corpus_assets.core.records.canonical_records import benchmark_index, canonical_tables
from corpus_assets.core.records.canonicalize import Stages
from corpus_assets.core.records.index import (
    RECORD_COLUMNS,
    CanonicalIndex,
    ChunkDescriptor,
    ChunkEntry,
)
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import get_table

ROWS = 1024  # rows per batch read, compared and hashed
HASHED = ("payload", "text")  # compared through record_digest and text_digest
COMPARED = pa.schema([f for f in RECORD_COLUMNS if f.name not in HASHED])


@dataclass(frozen=True)
class CanaryOutcome:
    """One canary chunk: how many source lines were replayed, the digest of the rows the replay
    gave and of the rows the snapshot recorded for the same lines, and the first difference."""

    chunk: str
    lines: int
    replayed: str
    recorded: str
    difference: str | None


Replay = Callable[[CanonicalIndex, FreezeSpec, list[str]], list[CanaryOutcome]]


def canary_replay(ws: Workspace) -> Replay:
    """The replay of this workspace's code and config; bypasses the task table (a replay must
    recompute, not reuse)."""
    lines = ws.config.policies.validation.canary_lines

    def replay(
        canonical: CanonicalIndex, spec: FreezeSpec, chunk_keys: list[str]
    ) -> list[CanaryOutcome]:
        raw = load_index(ws.cas, canonical.index.inputs[0], "raw_snapshot")
        items = {f"{o['source']}/{o['name']}": o for o in raw.output("objects")}
        sources = {s.id: s for s in ws.config.sources}
        entries = {entry.chunk: entry for entry in canonical.entries}
        index = benchmark_index(ws, spec.benchmark_fence)
        outcomes = []
        for key in chunk_keys:
            if key not in items or items[key]["source"] not in sources:
                continue
            source = sources[items[key]["source"]]
            made = canonical_tables(
                ws, source, items[key], Stages.for_config(ws.config, index), lines
            )
            recorded = _recorded(ws, canonical, entries[key], lines)
            outcomes.append(_compare(key, made.rows_in, (made.records, made.excluded), recorded))
        return outcomes

    return replay


def _recorded(
    ws: Workspace, canonical: CanonicalIndex, entry: ChunkEntry, lines: int | None
) -> tuple[pa.Table, pa.Table]:
    """The snapshot's records and exclusions of the chunk's first ``lines`` source lines
    (records are stored in line order, so reading stops at the first batch past them)."""
    descriptor = canonical.descriptor(entry)
    groups = []
    with closing(_batches(ws, descriptor)) as batches:
        for batch in batches:
            groups.append(batch)
            if lines is not None and batch.num_rows and batch.column("line")[-1].as_py() > lines:
                break
    kept = pa.Table.from_batches(groups, COMPARED)
    excluded = get_table(ws.cas, descriptor.excluded, f"exclusions of {entry.chunk}")
    if lines is None:
        return kept, excluded
    within = (pc.less_equal(t.column("line"), lines) for t in (kept, excluded))
    return kept.filter(next(within)), excluded.filter(next(within))


def _batches(ws: Workspace, descriptor: ChunkDescriptor) -> Iterator[pa.RecordBatch]:
    """The compared columns of the object's records, piece after piece (each in line order)."""
    for piece in descriptor.parts():
        with closing(pq.ParquetFile(ws.cas.path(piece.records["digest"]))) as records:
            yield from records.iter_batches(batch_size=ROWS, columns=COMPARED.names)


def _rows(tables: tuple[pa.Table, pa.Table]) -> Iterator[dict[str, Any]]:
    """Every kept row, then every exclusion in (line, reason) order: contamination exclusions
    are appended after the others, so the order is normalised before comparing."""
    kept, excluded = tables
    for batch in kept.select(COMPARED.names).to_batches(max_chunksize=ROWS):
        yield from batch.to_pylist()
    excluded = excluded.sort_by([("line", "ascending"), ("reason", "ascending")])
    for batch in excluded.to_batches(max_chunksize=ROWS):
        yield from ({"excluded": True, **row} for row in batch.to_pylist())


def _compare(
    chunk: str, lines: int, replayed: tuple[pa.Table, pa.Table], recorded: tuple[pa.Table, pa.Table]
) -> CanaryOutcome:
    """Both sides' digests (every column of every row) and the first row where they differ."""
    digests = hashlib.sha256(), hashlib.sha256()
    difference = None
    for mine, theirs in zip_longest(_rows(replayed), _rows(recorded)):
        for digest, row in zip(digests, (mine, theirs), strict=True):
            digest.update(orjson.dumps(row, option=orjson.OPT_SORT_KEYS) + b"\n")
        if difference is None and mine != theirs:
            difference = _describe(mine, theirs)
    replayed_digest, recorded_digest = (f"sha256:{d.hexdigest()}" for d in digests)
    return CanaryOutcome(chunk, lines, replayed_digest, recorded_digest, difference)


def _describe(mine: dict[str, Any] | None, theirs: dict[str, Any] | None) -> str:
    """The first differing row in words: kept by one side and excluded by the other, or which
    columns of the same line differ."""
    if mine is None or theirs is None:
        row = mine or theirs or {}
        side = "the replay" if theirs is None else "the snapshot"
        return f"only {side} has a row for line {row.get('line')}"
    if mine.get("excluded") != theirs.get("excluded") or mine["line"] != theirs["line"]:
        return f"the replay {_verdict(mine)}, the snapshot {_verdict(theirs)}"
    columns = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    return f"line {mine['line']}: {', '.join(columns)} differ"


def _verdict(row: dict[str, Any]) -> str:
    if row.get("excluded"):
        return f"excluded line {row['line']} ({row['reason']})"
    return f"kept line {row['line']} as {row['record_id']}"
