"""What the packed blocks of a valid snapshot must hold, checked on its published tables.

The spans table is the provenance a trainer and an auditor rely on, so it is checked against
the shard index and the members rather than trusted: every span lies inside its block, spans
never overlap, they cover exactly the content tokens the layer counted, each names the shard
holding its block, only train members are packed, and both sequences of every preference pair
start with the same prompt tokens (read from the shards: a pair's prompt is what carries no
label before its first labelled target). ``verify`` re-hashes the shards.
"""

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from corpus_assets.core.publication.block_reader import BlockReader
from corpus_assets.core.runtime.layer_index import LayerIndex
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import registered
from corpus_assets.core.storage.shards import ShardIndex, load_index

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

SHOWN = 5  # findings listed per kind
SPAN_COLUMNS = ["block", "start", "end", "record_id", "sample", "shard", "specials"]  # read
# each packed record that is no train member once, at its first span
STRANGERS = """
SELECT record_id, count(*) OVER () FROM (
    SELECT s.record_id, min(s.n) AS first FROM pk_spans s
    ANTI JOIN (SELECT record_id FROM members WHERE split = 'train') m USING (record_id)
    GROUP BY s.record_id)
ORDER BY first LIMIT ?
"""


def packing_findings(cas: ContentStore, packed: LayerIndex, con: "DuckDBPyConnection") -> list[str]:
    """Every broken packing invariant, one line per kind (with up to ``SHOWN`` examples);
    ``con`` holds the snapshot's ``members`` (record_id, split)."""
    index = load_index(cas, packed.output("shard_index")["digest"])
    spans = get_table(cas, packed.output("spans"), "spans table", SPAN_COLUMNS)
    findings = _index_findings(index, packed.counts)
    findings += _span_bounds(spans, index)
    findings += _overlaps(spans)
    findings += pair_findings(cas, index, spans)
    content = pc.sum(pc.subtract(spans.column("end"), spans.column("start"))).as_py() or 0
    if content != packed.counts.get("content_tokens"):
        findings.append(
            f"spans cover {content} tokens, the layer counts {packed.counts.get('content_tokens')}"
        )
    return findings + _strangers(spans, con)


def _strangers(spans: pa.Table, con: "DuckDBPyConnection") -> list[str]:
    """Packed records that are no train member: how many, and the first ``SHOWN`` in spans
    order (an anti join in DuckDB: no Arrow table of the train members, no hash set of them
    built in Arrow)."""
    numbered = pa.table(
        {"record_id": spans.column("record_id"), "n": np.arange(spans.num_rows, dtype=np.int64)}
    )
    with registered(con, "pk_spans", numbered):
        found = con.execute(STRANGERS, [SHOWN]).fetchall()
    if not found:
        return []
    return [f"{found[0][1]} packed records are not train members, e.g. {[r for r, _ in found]}"]


def _index_findings(index: ShardIndex, counts: dict) -> list[str]:
    if (index.blocks, index.block_tokens) == (counts.get("blocks"), counts.get("block_tokens")):
        return []
    return [
        f"shard index holds {index.blocks} blocks of {index.block_tokens}, the layer counts "
        f"{counts.get('blocks')} of {counts.get('block_tokens')}"
    ]


def _span_bounds(spans: pa.Table, index: ShardIndex) -> list[str]:
    """Each span is non-empty, inside its block, in an existing block, in the shard it names."""
    start, end, block = spans.column("start"), spans.column("end"), spans.column("block")
    shard = pc.divide(block, pa.scalar(index.shard_blocks, pa.int64()))
    bad = pc.or_(
        pc.or_(pc.less(start, 0), pc.greater_equal(start, end)),
        pc.or_(pc.greater(end, index.block_tokens), pc.greater_equal(block, index.blocks)),
    )
    bad = pc.or_(bad, pc.not_equal(pc.cast(spans.column("shard"), pa.int64()), shard))
    wrong = spans.filter(bad)
    if not wrong.num_rows:
        return []
    rows = wrong.select(["record_id", "block", "start", "end", "shard"]).slice(0, SHOWN)
    return [f"{wrong.num_rows} spans lie outside their block or shard, e.g. {rows.to_pylist()}"]


def _overlaps(spans: pa.Table) -> list[str]:
    """Within a block, each span starts at or after the previous one ends."""
    ordered = spans.select(["block", "start", "end", "record_id"])
    if not _in_block_order(ordered):  # the layer writes them in order: a sort only if not
        ordered = ordered.sort_by([("block", "ascending"), ("start", "ascending")])
    if ordered.num_rows < 2:
        return []
    block, start, end = (ordered.column(c).combine_chunks() for c in ("block", "start", "end"))
    same = pc.equal(block.slice(1), block.slice(0, len(block) - 1))
    clash = pc.and_(same, pc.less(start.slice(1), end.slice(0, len(end) - 1)))
    count = pc.sum(clash).as_py() or 0
    if not count:
        return []
    first = pc.index(clash, True).as_py() + 1
    example = ordered.slice(first, 1).to_pylist()
    return [f"{count} spans overlap the previous span of their block, e.g. {example}"]


def _in_block_order(spans: pa.Table) -> bool:
    """Whether the rows already ascend by (block, start) (a stable sort would keep them)."""
    if spans.num_rows < 2:
        return True
    block, start = (spans.column(c).combine_chunks() for c in ("block", "start"))
    n = len(block) - 1
    later, earlier = block.slice(1), block.slice(0, n)
    before = pc.and_(pc.equal(later, earlier), pc.less(start.slice(1), start.slice(0, n)))
    return not pc.any(pc.or_(pc.less(later, earlier), before)).as_py()


def pair_findings(cas: ContentStore, index: ShardIndex, spans: pa.Table) -> list[str]:
    """Preference pairs (a sample with two adjacent spans of one block, from offset 0) whose
    two prompts differ in length or tokens, read from the verified shards."""
    pairs = _pair_spans(spans)
    if not pairs.num_rows:
        return []
    bad = []
    with BlockReader(cas, index) as reader:
        for row in pairs.to_pylist():
            block = reader.block(row["block"])
            first, second = (
                _prompt(block, row["start"], row["middle"]),
                _prompt(block, row["middle"], row["end"]),
            )
            if first.size != second.size or not np.array_equal(first, second):
                bad.append(f"{row['record_id']} (block {row['block']})")
    if not bad:
        return []
    return [f"{len(bad)} preference pairs have different prompts, e.g. {bad[:SHOWN]}"]


def _pair_spans(spans: pa.Table) -> pa.Table:
    """(sample, record_id, block, start, middle, end) of every two-span pair laid out whole."""
    chat = spans.filter(pc.starts_with(spans.column("specials"), "chat."))
    grouped = chat.group_by(["sample", "record_id", "block"]).aggregate(
        [("start", "min"), ("end", "max"), ("start", "max"), ("start", "count")]
    )
    grouped = grouped.filter(pc.equal(grouped.column("start_count"), 2))
    return grouped.rename_columns(
        ["sample", "record_id", "block", "start", "end", "middle", "count"]
    )


def _prompt(block: dict[str, np.ndarray], start: int, end: int) -> np.ndarray:
    """A sequence's prompt tokens: those before its first target (label at t: t + 1 is one)."""
    labels = np.flatnonzero(block["label_mask"][start:end])
    length = int(labels[0]) + 1 if labels.size else end - start
    return block["input_ids"][start : start + length]
