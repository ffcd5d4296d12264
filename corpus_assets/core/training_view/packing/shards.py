"""packed_blocks' shards, built a shard per job on the task runner (``execution``: the local
spawn pool or Ray), then put together in block order.

A block's arrays depend only on the plan and the token cache, and a shard is a fixed run of
``shard_blocks`` blocks, so a job that builds blocks ``[first, last)`` of whole shards writes
exactly the shard files one writer would have written; the index lists them in block order.
Bytes never depend on the engine or the worker count. The caller verifies once the token-cache
chunks the jobs read (each worker re-hashing them would multiply that cost): a chunk only reused
shards hold is not read, one unchanged on disk since it last hashed right is trusted
(``storage.trust``, as the build's check does: a child does not re-hash its parent's chunks). A
job reads the plan's rows for its blocks (sent with it) and each sample's place in the cache
from the located columns (``packing.samples.SampleRows``: ``.npy`` files under the home's ``tmp``),
memory-mapped (on Ray the data home is a shared filesystem already, ``runtime.runners``).
Memory per worker: one shard buffer and one batch of blocks.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from corpus_assets.core.runtime.workspace import Workspace, pooled
from corpus_assets.core.storage.artifacts import Ref, get_json
from corpus_assets.core.storage.shards import (
    SHARD_BYTES,
    ShardEntry,
    ShardIndex,
    ShardWriter,
    put_shard_index,
    shard_blocks,
)
from corpus_assets.core.storage.trust import StatTrust
from corpus_assets.core.tokens.cache import TokenCache, TokensDescriptor, open_tokens
from corpus_assets.core.tokens.spec import TokenizerSpec
from corpus_assets.core.training_view.packing.blocks import BuildAccounting, build_batch
from corpus_assets.core.training_view.packing.checks import check_pair_prompts
from corpus_assets.core.training_view.packing.locate import local_when_small
from corpus_assets.core.training_view.packing.plan import PackPlan
from corpus_assets.core.training_view.packing.samples import SampleRows, SampleTokens

BATCH_BLOCKS = 256
# Blocks build at tens of millions of tokens per CPU-second, so a child's few new shards cost
# less here than a spawn worker's imports (``execution.in_process_bytes`` is sized for
# tokenising, hundreds of times slower per byte): at most this many tokens run here.
LOCAL_TOKENS = 1 << 24
LOOKUP = ("chunk", "row", "pair_split")  # per sample, memory-mapped by every job
KINDS = ("label", "special")  # the tokens counted per shard


@dataclass(frozen=True)
class ShardJob:
    """Blocks ``[first, last)`` (whole shards from ``first``) and what building them needs."""

    first: int
    last: int
    plan: PackPlan  # only the rows of these blocks
    lookup: str  # directory of the per-sample ``LOOKUP`` arrays
    cache: TokenCache
    fields: dict[str, str]
    pairs: bool
    shard_bytes: int
    prefix: "KeptPrefix | None" = None  # the shard's first blocks, copied from the parent's


@dataclass
class ShardOutcome:
    """A job's shards, its label and special-token counts, and any broken preference pair."""

    entries: tuple[ShardEntry, ...] = ()
    accounting: dict[str, int] = field(default_factory=dict)
    broken: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class KeptPrefix:
    """A parent's shard whose every block the child keeps at its own number while its own shard
    of that number goes on with new blocks (the parent's last, short shard, when blocks are
    added): the child's shard begins with exactly the parent shard's bytes of each field, so
    they are copied from it (``path``, verified by the caller) instead of being built again
    from the token cache (a +1% child re-read ~16k sample pieces for it at 122 MB).
    ``offsets``: each field's byte offset in that file; ``accounting``: its recorded counts."""

    digest: str
    path: str
    blocks: int
    offsets: dict[str, int]
    accounting: dict[str, int]


def build_shards(
    ws: Workspace,
    plan: PackPlan,
    rows: SampleRows,
    cache: TokenCache,
    fields: dict[str, str],
    shard_bytes: int = SHARD_BYTES,
    workers: int | None = None,
    *,
    reused: Callable[[int], dict[int, ShardOutcome]] | None = None,
) -> tuple[ShardIndex, Ref, dict[str, Any], list[str]]:
    """Every block of the plan in shards: (index, its ref, accounting, broken pairs); the
    accounting has the label and special-token sums, ``shards``: those counts per shard, and
    ``reused``: how many shards were not rebuilt.
    ``workers``: as ``execution.workers`` (None: the config's). ``reused``: the shards (by number)
    already written with exactly these blocks (a parent's, ``.incremental``), given the blocks
    per shard: not rebuilt."""
    per_shard = shard_blocks(plan.block_tokens, fields, shard_bytes)
    kept = reused(per_shard) if reused else {}
    whole = {n: o for n, o in kept.items() if isinstance(o, ShardOutcome)}
    prefixes = {n * per_shard: p for n, p in kept.items() if isinstance(p, KeptPrefix)}
    firsts = [f for f in range(0, plan.blocks, per_shard) if f // per_shard not in whole]
    bounds = plan.block_bounds()
    copied = {f: prefixes[f].blocks for f in firsts if f in prefixes}
    verify_tokens(ws, cache, chunks_read(plan, bounds, firsts, per_shard, rows.chunk, copied))
    # the parent shards copied from: re-hashed unless unchanged since they last hashed right
    StatTrust(ws.cas, ws.catalog).verify_all(
        {prefixes[f].digest: f"parent shard of blocks from {f}" for f in copied}
    )
    pairs = bool((rows.pair_split > 0).any())
    lookup = str(rows.folder)  # the located columns, memory-mapped by every job
    jobs = []
    for first in firsts:
        last = min(first + per_shard, plan.blocks)
        piece = _plan_rows(plan, bounds, first + copied.get(first, 0), last)
        prefix = prefixes.get(first)
        job = ShardJob(first, last, piece, lookup, cache, fields, pairs, shard_bytes, prefix)
        jobs.append(job)
    small = sum(int(job.plan.length.sum()) for job in jobs) <= LOCAL_TOKENS
    done = pooled(ws, _build, jobs, workers=local_when_small(ws, workers, small)) if jobs else []
    built = dict(zip(firsts, done, strict=True))
    outcomes = [
        built.get(first) or whole[first // per_shard] for first in range(0, plan.blocks, per_shard)
    ]
    broken = [problem for outcome in outcomes for problem in outcome.broken]
    entries = [entry for outcome in outcomes for entry in outcome.entries]
    index, ref = put_shard_index(ws.cas, plan.block_tokens, fields, entries, per_shard)
    shards = [[o.accounting.get(key, 0) for key in KINDS] for o in outcomes]
    totals = {f"{key}_tokens": sum(s[n] for s in shards) for n, key in enumerate(KINDS)}
    stats = {"reused": len(whole), "blocks_copied": sum(copied.values())}
    return index, ref, {**totals, "shards": shards, **stats}, broken


def chunks_read(
    plan: PackPlan,
    bounds: np.ndarray,
    firsts: list[int],
    per_shard: int,
    chunk: np.ndarray,
    copied: dict[int, int] | None = None,
) -> list[int]:
    """The token-cache chunks the shards from ``firsts`` read: only those are verified (a
    child keeping its parent's shards reads, and re-hashes, the chunks of its new blocks);
    ``copied``: blocks at the start of a shard copied from a parent's, which read none."""
    read = np.zeros(max(int(chunk.max()) + 1 if chunk.size else 0, 0), dtype=bool)
    for first in firsts:
        start = first + (copied or {}).get(first, 0)
        lo, hi = int(bounds[start]), int(bounds[min(first + per_shard, plan.blocks)])
        read[chunk[plan.sample[lo:hi]]] = True
    return np.flatnonzero(read).tolist()


def verify_tokens(ws: Workspace, cache: TokenCache, numbers: list[int]) -> None:
    """The token-cache chunks ``numbers`` checked (descriptor, maker, shapes) and their arrays
    verified here, once, for every job: re-hashed unless unchanged on disk since they last
    hashed right (``storage.trust``: a parent's chunks its build's check hashed are not read
    again by its child; a new or touched chunk is)."""
    objects: dict[str, str] = {}
    for n in numbers:
        item = cache.chunks[n]
        open_tokens(ws, item, cache.spec, verify=False)
        what = f"tokens of chunk {item.chunk}"
        descriptor = TokensDescriptor.model_validate(get_json(ws.cas, item.digest, what))
        for name in ("offsets", "pair_split", "ids", "targets"):
            ref = getattr(descriptor, name)
            if ref is not None:
                objects[ref["digest"]] = f"{what}: {name}"
    StatTrust(ws.cas, ws.catalog).verify_all(objects)


def _plan_rows(plan: PackPlan, bounds: np.ndarray, first: int, last: int) -> PackPlan:
    """The plan's rows of blocks ``[first, last)``, block numbers kept."""
    lo, hi = int(bounds[first]), int(bounds[last])
    return PackPlan(
        mode=plan.mode,
        block_tokens=plan.block_tokens,
        blocks=plan.blocks,
        block=plan.block[lo:hi],
        start=plan.start[lo:hi],
        sample=plan.sample[lo:hi],
        offset=plan.offset[lo:hi],
        length=plan.length[lo:hi],
        quarantined=plan.quarantined[:0],
        input_tokens=0,
        dropped_tokens=0,
    )


def _build(ws: Workspace, job: ShardJob, _spec: None, _done: None) -> ShardOutcome:
    """One job: its blocks a batch at a time into its shards (module-level: a worker runs it)."""
    spec: TokenizerSpec = job.cache.spec
    lookup = {n: np.load(Path(job.lookup) / f"{n}.npy", mmap_mode="r") for n in LOOKUP}
    specials = [s.id for s in (spec.bos, spec.eos) if s is not None]
    accounting = BuildAccounting(special_ids=specials)
    writer = ShardWriter(
        ws.cas, job.plan.block_tokens, job.fields, job.shard_bytes, first_block=job.first
    )
    start, kept = job.first, {kind: 0 for kind in KINDS}
    if job.prefix is not None:  # the parent's blocks this shard begins with, as they are
        writer.copy_blocks(job.prefix.path, job.prefix.blocks, job.prefix.offsets)
        start, kept = job.first + job.prefix.blocks, job.prefix.accounting
    with SampleTokens(ws, job.cache, lookup["chunk"], lookup["row"], verify=False) as fetch:
        for first in range(start, job.last, BATCH_BLOCKS):
            last = min(first + BATCH_BLOCKS, job.last)
            batch = build_batch(job.plan, first, last, fetch, spec.pad.id, fetch.targets_fetch)
            broken = job.pairs and check_pair_prompts(batch, lookup["pair_split"], fetch.targets)
            if broken:
                return ShardOutcome(broken=broken)
            writer.write({name: getattr(batch, name) for name in job.fields})
            accounting.add(batch)
    sums = {
        "label": accounting.label_tokens + kept["label"],
        "special": accounting.special_tokens + kept["special"],
    }
    return ShardOutcome(entries=writer.finish(), accounting=sums)
