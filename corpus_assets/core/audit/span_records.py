"""The reverse of record lineage: a packed shard, block or token range -> the records in it.

A shard is named by its CAS digest or its position in the pack; blocks are the pack's global
block numbers (those of the spans table and of a training reader). The spans whose [start, end)
overlaps the asked range are listed with their record, its offset in the record's tokens, the
sample (and its repeat) they pack, and the record's origin: source, object digest and name,
line and byte offset. Spans are read by block (the table's order), samples by position,
members by record id and canonical rows by line, so only the rows named are decoded.
"""

from dataclasses import dataclass
from typing import Any

from corpus_assets.core.audit.snapshot_tables import SnapshotTables
from corpus_assets.core.governance import states
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.catalog import Catalog
from corpus_assets.core.storage.digests import DIGEST_RE


class SpanQueryError(ValueError):
    """A shard, block or token range the pack does not have; the message names what it has."""


@dataclass(frozen=True)
class SpanQuery:
    """What to list: a shard (digest or position), a block, a token range within the block."""

    shard: str | None = None
    block: int | None = None
    start: int | None = None
    end: int | None = None


def span_records(
    cas: ContentStore, catalog: Catalog, snapshot: states.Snapshot, query: SpanQuery
) -> dict[str, Any]:
    """The records whose spans overlap ``query`` in ``snapshot``, with where each came from."""
    tables = SnapshotTables(cas, catalog, snapshot)
    shard, first, last = _blocks(tables, query)
    low, high = _tokens(tables, query)
    spans = [s for s in tables.spans_between(first, last) if s["start"] < high and s["end"] > low]
    samples = tables.samples_at(sorted({s["sample"] for s in spans}))
    origins = _origins(tables, sorted({s["record_id"] for s in spans}))
    rows = [
        {
            **span,
            "repeat": samples.get(span["sample"], {}).get("repeat"),
            **origins.get(span["record_id"], {"member": False}),
        }
        for span in spans
    ]
    return {
        **tables.head(),
        "shard": shard,
        "blocks": [first, last],
        "tokens": [low, high] if query.start is not None or query.end is not None else None,
        "records": sorted({r["record_id"] for r in rows}),
        "spans": rows,
    }


def _shard(tables: SnapshotTables, named: str) -> dict[str, Any]:
    """The shard index entry a digest or a position names, with its position."""
    shards = tables.shard_index["shards"]
    for position, entry in enumerate(shards):
        if named in (entry["digest"], str(position)):
            keep = ("digest", "first_block", "blocks")
            return {"index": position, **{k: entry[k] for k in keep}}
    what = "digest" if DIGEST_RE.fullmatch(named) else "shard"
    raise SpanQueryError(
        f"snapshot {tables.snapshot.snapshot_id} has no shard {named!r} ({what}); its pack has "
        f"{len(shards)} shard(s), positions 0-{len(shards) - 1}"
    )


def _blocks(tables: SnapshotTables, query: SpanQuery) -> tuple[dict[str, Any] | None, int, int]:
    """(shard or None, first block, last block) the query covers, checked against the pack."""
    if query.shard is None and query.block is None:
        raise SpanQueryError("name a shard (--shard), a block (--block) or both")
    total = tables.shard_index["blocks"]
    shard = _shard(tables, query.shard) if query.shard is not None else None
    if query.block is None:
        assert shard is not None
        return shard, shard["first_block"], shard["first_block"] + shard["blocks"] - 1
    if not 0 <= query.block < total:
        raise SpanQueryError(f"block {query.block} is not in the pack: it has blocks 0-{total - 1}")
    if shard is not None and not (
        shard["first_block"] <= query.block < shard["first_block"] + shard["blocks"]
    ):
        last = shard["first_block"] + shard["blocks"] - 1
        raise SpanQueryError(
            f"block {query.block} is not in shard {shard['index']} ({shard['digest']}), which "
            f"holds blocks {shard['first_block']}-{last}; blocks are numbered across the pack"
        )
    return shard, query.block, query.block


def _tokens(tables: SnapshotTables, query: SpanQuery) -> tuple[int, int]:
    """[low, high) token positions within a block; the whole block by default."""
    size = tables.shard_index["block_tokens"]
    if (query.start is not None or query.end is not None) and query.block is None:
        raise SpanQueryError("a token range (--start/--end) needs a block (--block)")
    low = 0 if query.start is None else query.start
    high = size if query.end is None else query.end
    if not 0 <= low < high <= size:
        raise SpanQueryError(
            f"token range [{low}, {high}) is not within a block of {size} tokens "
            "(0 <= start < end <= block size)"
        )
    return low, high


def _origins(tables: SnapshotTables, record_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Per record: member facts (source, object, line, split) and the object's name and the
    line's byte offset from the canonical row."""
    members = tables.members(record_ids)
    by_object: dict[tuple[str, str], dict[int, str]] = {}
    for rid, m in members.items():
        by_object.setdefault((m["source_id"], m["object"]), {})[m["line"]] = rid
    found: dict[str, dict[str, Any]] = {}
    for (source_id, digest), lines in by_object.items():
        ids = set(lines.values())
        for row in tables.canonical_rows(source_id, digest, sorted(lines), ids):
            if lines.get(row["line"]) == row["record_id"]:
                member = members[row["record_id"]]
                found[row["record_id"]] = {
                    "member": True,
                    "source_id": source_id,
                    "object": digest,
                    "name": row["name"],
                    "line": row["line"],
                    "byte_offset": row["byte_offset"],
                    "split": member["split"],
                }
    return found
