"""Verified outcomes of the content rules, reused: the check of an unchanged snapshot runs once.

Most validity rules are functions of the snapshot's content alone - the members table, the layer
indexes and the freeze, all named by digest and re-verified by ``verify`` first - and of the code
and config that apply them: the canary replay, the dedup and packing invariants, lineage. Each
one's passing outcome (with the metrics it showed) is recorded as soon as it passes, under
``rule_key`` (the rule set's ``gate_key`` and the rule's name), and reused: a resumed build whose
check was left, or killed part-way, runs only the rules that had not passed yet, and
an unchanged snapshot in a new partition (the manifest differs only in naming its partition)
runs none of them. The key holds:

- the manifest less what names its partition (``partition``, ``freeze`` ref, ``buildId``,
  ``snapshotId``, ``signature``) and the freeze spec less its partition key - every digest the
  rules read is in one of the two;
- the rule set's code identity: the transform image (every byte of the package, so the rules,
  the canary's transform and this module), and the config less ``execution`` and ``storage``
  (the canary parses with the sources' adapters and the policies);
- the fence state the content reads: count and highest seq of the tombstones at or below the
  snapshot's watermark and of the benchmark items at or below its fence (the canary's
  canonicalisation reads the benchmark index), so a late-committed row below a fence misses.

The canary replay reads far less than the whole snapshot - the first chunk of each source: its
pinned object, its recorded records and exclusions - so its outcome is keyed by exactly those
(``canary_key``: the chunk entries, whose descriptors name the tables by digest, the pinned
objects, the fences, code and config). A child snapshot whose canary chunks are its parent's
(an append adds objects after them) reuses the parent check's pass; a changed chunk, object,
fence, code or config replays.

Only passing outcomes are kept (a failure is re-derived and re-reported every time), and only
when ``verify`` found nothing. The rules that read state that moves after a build - readable
pinned versions, open dead letters, tombstone and benchmark hits, late CDC events, build latency
- are not memoised: ``validation`` runs them every time (they are cheap; the hit queries are
indexed joins on the members table).
"""

from typing import Any

from sqlalchemy import func, select

from corpus_assets.core.ingest.freeze_spec import FreezeSpec
from corpus_assets.core.publication import part_memo
from corpus_assets.core.publication.evidence import Evidence
from corpus_assets.core.publication.part_memo import remember
from corpus_assets.core.publication.rules import canary_chunks
from corpus_assets.core.runtime.layer_index import load_index
from corpus_assets.core.runtime.snapshot_manifest import Manifest
from corpus_assets.core.runtime.transform import transform_image
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.catalog import Catalog, benchmark_items, tombstones
from corpus_assets.core.storage.digests import json_digest

__all__ = ["gate_key", "recall", "remember", "rule_key", "rule_keys"]

PARTITION_FIELDS = ("partition", "freeze", "buildId", "snapshotId", "signature")
CANARY = "canary_reproduces"  # the rule keyed by its own inputs (``canary_key``)


def gate_key(ws: Workspace, manifest: Manifest, spec: FreezeSpec) -> str:
    """The digest of everything the content rules' outcome depends on (module docstring)."""
    frozen = spec.model_dump(mode="json", by_alias=True)
    frozen.pop("partition", None)
    return json_digest(
        {
            "manifest": {k: v for k, v in manifest.document().items() if k not in PARTITION_FIELDS},
            "freeze": frozen,
            "image": transform_image(),
            "config": ws.config.model_dump(mode="json", exclude={"execution", "storage"}),
            "fences": fence_state(ws.catalog, manifest.tombstone_seq, manifest.benchmark_seq),
        }
    )


def rule_keys(ws: Workspace, ev: Evidence, rules: list[str]) -> dict[str, str]:
    """Where each of ``rules``' passing outcome is recorded: the canary under its own inputs,
    every other rule under the rule set's ``gate_key``."""
    key = gate_key(ws, ev.manifest, ev.freeze)
    return {rule: canary_key(ws, ev) if rule == CANARY else rule_key(key, rule) for rule in rules}


def canary_key(ws: Workspace, ev: Evidence) -> str:
    """The digest of everything the canary replay reads (``records.canary``): each canary
    chunk's index entry (its input and the digest of the descriptor naming its records and
    exclusions) and pinned object, the fences it canonicalises behind, the code and config."""
    raw = load_index(ws.cas, ev.canonical.index.inputs[0], "raw_snapshot")
    objects = {f"{o['source']}/{o['name']}": o for o in raw.output("objects")}
    entries = {entry.chunk: entry for entry in ev.canonical.entries}
    spec = ev.freeze
    return json_digest(
        {
            "rule": CANARY,
            "chunks": [
                {"entry": entries[chunk].model_dump(mode="json"), "object": objects.get(chunk)}
                for chunk in canary_chunks(ev.canonical)
            ],
            "fences": [spec.tombstone_watermark, spec.benchmark_fence],
            "fenceState": fence_state(ws.catalog, spec.tombstone_watermark, spec.benchmark_fence),
            "image": transform_image(),
            "config": ws.config.model_dump(mode="json", exclude={"execution", "storage"}),
        }
    )


def fence_state(catalog: Catalog, watermark: int, fence: int) -> dict[str, list[int]]:
    """(count, highest seq) of the tombstones at or below ``watermark`` and of the benchmark
    items at or below ``fence``: two range scans of the primary keys."""
    state = {}
    with catalog.begin() as conn:
        for name, table, bound in (
            ("tombstones", tombstones, watermark),
            ("benchmarks", benchmark_items, fence),
        ):
            count, top = conn.execute(
                select(func.count(), func.max(table.c.seq)).where(table.c.seq <= bound)
            ).one()
            state[name] = [int(count), int(top or 0)]
    return state


def rule_key(key: str, rule: str) -> str:
    """Where one rule's passing outcome under the rule set ``key`` is recorded."""
    return json_digest({"gateKey": key, "rule": rule})


def recall(catalog: Catalog, keys: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The metrics of each rule whose passing outcome is recorded under its key (``keys``:
    rule -> key, from ``rule_keys``)."""
    wanted = {key: rule for rule, key in keys.items()}
    return {
        wanted[key]: metrics for key, metrics in part_memo.recall(catalog, list(wanted)).items()
    }
