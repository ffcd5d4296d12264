"""Which records realise a mixing plan, and in which order (pure; no workspace).

A record's key for pass r is H = sha256(seed NUL source NUL record_digest NUL r): it depends on
the mix seed, the source and the record's content, never on the snapshot, other sources or the
worker count. Pass r of a source ranks its records by (H, record_id) and keeps a bottom-k prefix:
all of them while whole passes fit the plan, then the first k (documents) or the shortest prefix
whose tokens reach the plan (tokens, so the source overshoots by less than one document). The
stream is every selected (record, pass) ordered by (H, record_id, pass).
"""

import hashlib
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pyarrow as pa

from corpus_assets.core.training_view.mixing_plan import SourcePlan, decimal_text


@dataclass(frozen=True)
class Members:
    """One source's train records: ids, content digests and token counts as Arrow/numpy."""

    record_id: pa.Array
    record_digest: pa.Array
    tokens: np.ndarray


@dataclass
class Selection:
    keys: list[bytes]
    rows: list[int]  # index into the source's members
    repeats: list[int]


def pass_keys(seed: str, source: str, digests: pa.Array, repeat: int) -> list[bytes]:
    prefix = f"{seed}\x00{source}\x00".encode()
    tail = f"\x00{repeat}".encode()
    return [hashlib.sha256(prefix + d.encode() + tail).digest() for d in digests.to_pylist()]


def select_source(seed: str, plan: SourcePlan, members: Members, unit: str) -> Selection:
    """The (record, pass) pairs of one source that realise ``plan.amount`` units."""
    chosen = Selection([], [], [])
    left, ids, repeat = plan.amount, members.record_id.to_pylist(), 0
    while left > 0 and ids:
        keys = pass_keys(seed, plan.source, members.record_digest, repeat)
        ranked = sorted(range(len(ids)), key=lambda i: (keys[i], ids[i]))
        if unit == "documents":
            take = min(left, len(ranked))
        else:
            reach = np.cumsum(members.tokens[ranked])
            take = min(int(np.searchsorted(reach, left)) + 1, len(ranked))
        left -= take if unit == "documents" else int(np.sum(members.tokens[ranked[:take]]))
        chosen.keys.extend(keys[i] for i in ranked[:take])
        chosen.rows.extend(ranked[:take])
        chosen.repeats.extend([repeat] * take)
        repeat += 1
    return chosen


MIX_COLUMNS = pa.schema(
    [
        ("position", pa.int64()),
        ("record_id", pa.string()),
        ("source_id", pa.string()),
        ("repeat", pa.int64()),
        ("weight", pa.string()),
    ]
)


def mix(
    seed: str, unit: str, plans: list[SourcePlan], members: dict[str, Members], weighted: bool
) -> tuple[pa.Table, dict[str, Selection]]:
    """The ordered sample table and each source's selection."""
    picks = {p.source: select_source(seed, p, members[p.source], unit) for p in plans}
    entries = []
    for plan in plans:
        chosen, ids = picks[plan.source], members[plan.source].record_id
        weight = decimal_text(plan.weight) if weighted else "1"
        for key, row, repeat in zip(chosen.keys, chosen.rows, chosen.repeats, strict=True):
            entries.append((key, ids[row].as_py(), repeat, plan.source, weight))
    entries.sort()
    table = pa.Table.from_pydict(
        {
            "position": list(range(len(entries))),
            "record_id": [e[1] for e in entries],
            "source_id": [e[3] for e in entries],
            "repeat": [e[2] for e in entries],
            "weight": [e[4] for e in entries],
        },
        schema=MIX_COLUMNS,
    )
    return table, picks


def report(
    plans: list[SourcePlan], members: dict[str, Members], picks: dict[str, Selection]
) -> list[dict]:
    """Per source: population, target share, selection and realised shares (decimal text)."""
    docs = {p.source: len(picks[p.source].rows) for p in plans}
    tokens = {p.source: int(np.sum(members[p.source].tokens[picks[p.source].rows])) for p in plans}
    all_docs, all_tokens = sum(docs.values()), sum(tokens.values())
    rows = []
    for plan in plans:
        own = members[plan.source]
        rows.append(
            {
                "source": plan.source,
                "population_docs": len(own.record_id),
                "population_tokens": int(np.sum(own.tokens)),
                "target_share": decimal_text(plan.target),
                "selected_docs": docs[plan.source],
                "selected_tokens": tokens[plan.source],
                "doc_share": decimal_text(Fraction(docs[plan.source], all_docs or 1)),
                "token_share": decimal_text(Fraction(tokens[plan.source], all_tokens or 1)),
                "max_epochs": plan.max_epochs,
                "cap_hit": plan.cap_hit,
            }
        )
    return rows
