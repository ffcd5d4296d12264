"""Each layer's own invariants, read from the counts its index already hashes.

The manifest gate (``validation``) re-derives everything at the end; these catch a broken layer
where it was built, so the UI shows which layer went wrong and a blocking check stops the layers
after it in the same run. They read only index counts (this layer's and its inputs'), so they
cost milliseconds and never re-read a table.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from corpus_assets.core.runtime.layer_index import LAYERS, load_index
from corpus_assets.core.runtime.workspace import Workspace

Counts = Mapping[str, int]
ERROR, WARN = "ERROR", "WARN"


@dataclass(frozen=True)
class Finding:
    """One broken invariant, with how much it matters: ERROR blocks, WARN informs."""

    severity: str
    text: str


def _equal(name: str, left: int, right: int, severity: str = ERROR) -> list[Finding]:
    return [] if left == right else [Finding(severity, f"{name}: {left} != {right}")]


def _zero(counts: Counts, name: str, severity: str = ERROR) -> list[Finding]:
    return _equal(f"{name} must be 0", counts.get(name, 0), 0, severity)


def _prefixed_sum(counts: Counts, prefix: str) -> int:
    return sum(v for k, v in counts.items() if k.startswith(prefix))


def raw_snapshot(c: Counts, _up: Mapping[str, Counts]) -> list[Finding]:
    found = [] if c["objects"] > 0 else [Finding(ERROR, "no source object was pinned")]
    return found + _zero(c, "incomplete", WARN)


def canonical_records(c: Counts, _up: Mapping[str, Counts]) -> list[Finding]:
    """Accounting: every input line is a record, quarantined (by reason) or rejected."""
    return (
        _equal(
            "rows_in = records + quarantined + rejected",
            c["rows_in"],
            c["records"] + c["quarantined"] + c["rejected"],
        )
        + _equal(
            "quarantined = sum of its reasons", c["quarantined"], _prefixed_sum(c, "quarantined.")
        )
        + _zero(c, "unexplained")
        + _zero(c, "dead_letters", WARN)
    )


def dedup_clusters(c: Counts, up: Mapping[str, Counts]) -> list[Finding]:
    """Every canonical record gets one verdict; a kept record represents exactly one cluster."""
    return (
        _equal("records = canonical records", c["records"], up["canonical_records"]["records"])
        + _equal(
            "records = kept + removed + tombstoned + duplicate_ids + id_conflicts",
            c["records"],
            c["kept"]
            + c["removed"]
            + c["tombstoned"]
            + c["duplicate_ids"]
            + c.get("id_conflicts", 0),
        )
        + _equal(
            "removed = exact + near", c["removed"], c["exact_duplicates"] + c["near_duplicates"]
        )
        + _equal("clusters = kept", c["clusters"], c["kept"])
    )


def splits(c: Counts, up: Mapping[str, Counts]) -> list[Finding]:
    """Every kept record lands in one split; split conflicts (leakage) are resolved, not left."""
    placed = c["train"] + c["validation"] + c["test"] + c["excluded"]
    return (
        _equal("records = dedup kept", c["records"], up["dedup_clusters"]["kept"])
        + _equal("records = train + validation + test + excluded", c["records"], placed)
        + _zero(c, "conflicts")
    )


def mixed_samples(c: Counts, up: Mapping[str, Counts]) -> list[Finding]:
    """Samples and tokens add up per source; the mix draws only from the train split."""
    found = _equal("samples = sum per source", c["samples"], _prefixed_sum(c, "source."))
    found += _equal("tokens = sum per source", c["tokens"], _prefixed_sum(c, "tokens."))
    if c["samples"] > 0 and up["splits"]["train"] == 0:
        found.append(Finding(ERROR, "samples drawn while the train split is empty"))
    return found


def packed_blocks(c: Counts, up: Mapping[str, Counts]) -> list[Finding]:
    """Blocks are full: content + padding fill them exactly; no sample is lost on the way."""
    return (
        _equal("samples = mixed samples", c["samples"], up["mixed_samples"]["samples"])
        + _equal(
            "input_tokens = content_tokens + dropped_tokens",
            c["input_tokens"],
            c["content_tokens"] + c["dropped_tokens"],
        )
        + _equal(
            "blocks x block_tokens = content_tokens + pad_tokens",
            c["blocks"] * c["block_tokens"],
            c["content_tokens"] + c["pad_tokens"],
        )
        + (
            []
            if c["label_tokens"] <= c["content_tokens"]
            else [Finding(ERROR, "more labels than tokens")]
        )
        + _zero(c, "quarantined_samples", WARN)
    )


RULES: dict[str, Callable[[Counts, Mapping[str, Counts]], list[Finding]]] = {
    "raw_snapshot": raw_snapshot,
    "canonical_records": canonical_records,
    "dedup_clusters": dedup_clusters,
    "splits": splits,
    "mixed_samples": mixed_samples,
    "packed_blocks": packed_blocks,
}
assert set(RULES) < set(LAYERS)


def layer_findings(layer: str, counts: Counts, upstream: Mapping[str, Counts]) -> list[Finding]:
    """What is wrong with ``layer`` given its counts and its inputs' (a missing count is a finding,
    not a crash: an index written by other code names what it lacks)."""
    try:
        return RULES[layer](counts, upstream)
    except KeyError as missing:
        return [Finding(ERROR, f"{layer}: index counts lack {missing}")]


def check_layer(ws: Workspace, partition: str, layer: str) -> list[Finding] | None:
    """The findings for ``layer`` of ``partition`` as built now; None when it is not built (an
    input layer missing under a built one is an ERROR)."""
    if ws.catalog.layer_output(partition, layer) is None:
        return None
    counts: dict[str, Counts] = {}
    for name in LAYERS[: LAYERS.index(layer) + 1]:
        digest = ws.catalog.layer_output(partition, name)
        if digest is None:
            return None if name == layer else [Finding(ERROR, f"input layer {name} is not built")]
        counts[name] = load_index(ws.cas, digest, name).counts
    return layer_findings(layer, counts[layer], counts)
