"""dedup_clusters: one row per canonical record with its verdict, and the dedup report.

The layer wires the parts: the canonical records of the partition (only the columns dedup
needs, text replaced by its length), tombstones at or below the freeze's watermark, cached
MinHash signatures per canonical chunk, the near-dedup stage, then the verdicts of
:mod:`corpus_assets.core.dedup.clusters`. The signatures are inputs of this layer: their refs
are listed with its outputs, so ``verify`` covers them.
"""

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from corpus_assets.core.dedup.band_index import Banding
from corpus_assets.core.dedup.band_runner import BandInputs, BandRunner, distributed
from corpus_assets.core.dedup.carried_codes import Carried, carried_codes
from corpus_assets.core.dedup.cluster_parts import gathered_parts, put_cluster_parts
from corpus_assets.core.dedup.cluster_tasks import cluster_parts_on_runner, gather_rows
from corpus_assets.core.dedup.clusters import (
    Decided,
    Decisions,
    cluster_batches,
    decide,
    join_clusters,
    write_decisions,
)
from corpus_assets.core.dedup.coding import ID_CONFLICT, Coding, DriverCoding
from corpus_assets.core.dedup.edges import EdgeIds
from corpus_assets.core.dedup.fingerprint_store import TextLookup
from corpus_assets.core.dedup.minhash import SignatureSpec
from corpus_assets.core.dedup.near_dedup import LshParams
from corpus_assets.core.dedup.near_stage import NearStage
from corpus_assets.core.dedup.pair_cache import (
    FULL,
    INCREMENTAL,
    Mode,
    PairLookup,
    parent_mode,
    store_pairs,
)
from corpus_assets.core.dedup.partition_db import PartitionDb, chunk_lengths
from corpus_assets.core.dedup.report import DedupReport
from corpus_assets.core.dedup.reuse import (
    Reuse,
    RowDecisions,
    put_decisions,
    reused_parts,
    row_maps,
)
from corpus_assets.core.dedup.signature_blocks import opened_signatures
from corpus_assets.core.dedup.signature_cache import (
    ChunkSignatures,
    ensure_signatures,
    signature_spec,
)
from corpus_assets.core.dedup.task_coding import TaskCoding
from corpus_assets.core.dedup.verdicts import EXACT, EXCLUDED, KEEP, NEAR
from corpus_assets.core.governance.deletion_reach import revoked_targets, tombstone_matches
from corpus_assets.core.ingest.freeze import freeze
from corpus_assets.core.records.index import CanonicalIndex, ChunkRecords
from corpus_assets.core.runtime.code_identity import stage_code
from corpus_assets.core.runtime.layer_index import LayerResult, publish_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import NPY, Ref, make_ref, put_json, put_table
from corpus_assets.core.storage.memory import release_memory
from corpus_assets.core.storage.table_lookup import TrustedFiles

CODE = stage_code("dedup_clusters.v3", __name__)  # this module's closure, hashed at import


def build_dedup_clusters(ws: Workspace, partition_key: str) -> LayerResult:
    canonical_ref, canonical = CanonicalIndex.read(ws, partition_key)
    chunks = canonical.chunks()
    _, spec = freeze(ws, partition_key)
    order = _source_ranks(ws)
    policy = ws.config.policy_digest("dedup")
    mode = parent_mode(ws, spec.parents, CODE, policy)
    with tempfile.TemporaryDirectory(dir=_tmp(ws)) as tmp:
        db, length_refs = _opened(ws, chunks, mode)
        with db:
            revoked = _revoked(ws, db, spec.tombstone_watermark)
            near, signature_refs, run_stats = _near_stage(ws, chunks, db, mode, Path(tmp))
            chunk_rows = [(c.records["digest"], c.count) for c in chunks]
            coding = _coding(ws, chunks, _carried(ws, mode, chunk_rows, db), length_refs, Path(tmp))
            starts = np.cumsum([0, *(c.count for c in chunks)])[:-1]
            decided = decide(db, order, revoked, near, coding, starts)
            run_stats |= _coding_work(coding)
            del coding
            bands = _put_bands(ws, near.banding) if near and near.banding else []
            pairs = store_pairs(ws, db, *near.verified_arrays()) if near else None
            run_stats |= _near_work(near, mode, chunks)
            del near
            report = DedupReport(near=decided.report, per_source=decided.per_source)
            counts = _counts(decided, report, tombstoned=len(revoked))
            edge_ids = EdgeIds(decided.take_edges(), decided.positions)
            by_row = _row_decisions(decided)
            decision_ref = put_decisions(ws, by_row, _tmp(ws))
            reuse = reused_parts(ws, mode, chunk_rows, by_row)
            fresh = reuse.fresh_rows if isinstance(reuse, Reuse) else None
            named = (fresh, by_row.named(fresh)) if fresh is not None else None
            del by_row
            by_tasks = fresh is None and distributed(ws.config.execution)
            decisions = _decisions(decided, fresh, by_tasks, Path(tmp))
            del decided  # the per-row arrays: the joins read the decisions from their file
            release_memory(collect=True)
            unsorted = None if by_tasks else join_clusters(db, decisions, Path(tmp), few=named)
        release_memory(collect=True)
        names_written = "code_run_tasks" in run_stats  # the coding's tasks wrote them in tmp
        clusters, work = _put_clusters(
            ws, chunks, decisions, unsorted, reuse, edge_ids, Path(tmp), names_written
        )
        run_stats |= _reuse_stats(reuse) | work
        edges = put_table(ws.cas, edge_ids.table())
        del edge_ids
    out: dict[str, Any] = {
        "clusters": clusters,
        "edges": edges,
        "report": put_json(ws.cas, report.document()),
        "signatures": signature_refs,
        "lengths": length_refs,
        "decisions": decision_ref,
        **({"pairs": pairs} if pairs is not None else {}),
        **({"bands": bands} if bands else {}),
    }
    inputs = [canonical_ref]
    ref = publish_index(ws, partition_key, "dedup_clusters", CODE, policy, inputs, out, counts)
    modes = {"near_mode": {"mode": mode.mode, "reason": mode.reason}}
    modes["clusters_mode"] = _reuse_mode(reuse)
    return _result(ref["digest"], counts, report, out, run_stats, modes)


def _put_clusters(
    ws: Workspace,
    chunks: list[ChunkRecords],
    decisions: Decisions,
    unsorted: Path | None,
    reuse: Reuse | str,
    edge_ids: EdgeIds,
    tmp: Path,
    named: bool,
) -> tuple[Ref, dict[str, int]]:
    """The clusters parts from the joined rows (``unsorted``; None: joined and put by tasks
    on the runner, where the stages run; ``named``: the chunks' names are in ``tmp``), the
    parent's parts kept when reused, the edges' record ids taken as they pass; and the join
    tasks' work figures."""
    work = Counter[str]()
    if unsorted is None:  # a full join (no part kept), each chunk's part put by its task
        gathered = cluster_parts_on_runner(ws, chunks, decisions, edge_ids, tmp, work, named)
        return gathered_parts(ws.cas, CODE, chunks, gathered, _tmp(ws)), dict(work)
    kept = reuse if isinstance(reuse, Reuse) else None
    batches = cluster_batches(unsorted)
    ref = put_cluster_parts(ws.cas, CODE, chunks, batches, kept, edge_ids, _tmp(ws))
    return ref, dict(work)


def _result(
    digest: str,
    counts: dict[str, int],
    report: DedupReport,
    out: dict[str, Any],
    run_stats: dict[str, int],
    modes: dict[str, Any],
) -> LayerResult:
    """What the layer returns: its counts, per-source preview, report figures and modes."""
    return LayerResult(
        layer="dedup_clusters",
        digest=digest,
        counts=counts,
        preview=[{"source": s, **c} for s, c in report.per_source.items()],
        digests={name: out[name]["digest"] for name in ("clusters", "report")},
        run_stats=run_stats,
        details={**{k: v for k, v in report.document().items() if k != "per_source"}, **modes},
    )


def _decisions(decided: Decided, fresh: np.ndarray | None, by_tasks: bool, tmp: Path) -> Decisions:
    """The decisions file the clusters join reads, by row: of ``fresh`` only, when given, for
    DuckDB here; in row groups of :func:`.cluster_tasks.gather_rows` for the runner's tasks."""
    if by_tasks:
        return write_decisions(decided, tmp, gather_rows())
    return write_decisions(decided, tmp, only=fresh)


def _row_decisions(decided: Decided) -> RowDecisions:
    return RowDecisions(
        decided.state,
        decided.leakage.rows,
        decided.positions,
        decided.excluded,
    )


def _reuse_stats(reuse: Reuse | str) -> dict[str, int]:
    """Clusters rows copied from the parent's table and rows joined in this run (nothing when
    every row was joined)."""
    if isinstance(reuse, Reuse):
        return {
            "clusters_copied": reuse.copied,
            "clusters_joined": len(reuse.fresh_rows),
            "clusters_parts_kept": len(reuse.parts),
        }
    return {}  # the details say why


def _reuse_mode(reuse: Reuse | str) -> dict[str, str]:
    if isinstance(reuse, Reuse):
        return {"mode": INCREMENTAL, "reason": "parts of chunks with unchanged decisions kept"}
    return {"mode": FULL, "reason": reuse}


def _tmp(ws: Workspace) -> Path:
    path = ws.home / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _revoked(ws: Workspace, db: PartitionDb, watermark: int) -> dict[int, str]:
    """Rows revoked by a tombstone at or below the watermark, matched a batch at a time."""
    found: dict[int, str] = {}
    if not revoked_targets(ws.catalog, watermark):
        return found  # no tombstone at or below the watermark: no scan of the records
    for batch in db.batches("SELECT row, record_id, object, group_id FROM recs"):
        rows = batch.column(0).to_numpy()
        table = pa.Table.from_batches([batch])
        for row, reason in tombstone_matches(ws.catalog, watermark, table).items():
            found[int(rows[row])] = reason
    db.flush()
    return found


def _near_stage(
    ws: Workspace, chunks: list[ChunkRecords], db: PartitionDb, mode: Mode, tmp: Path
) -> tuple[NearStage | None, list[dict[str, Any]], dict[str, int]]:
    """The near-dedup stage over cached signatures (None when switched off), the signature
    refs this layer lists, and how many records were hashed or reused in this run. When
    ``mode`` is incremental the stage first looks pairs up in the parent's verified pairs and
    bands the classes its parent's band index holds from that index."""
    policy = ws.config.policies.dedup.near
    if not policy.enabled:
        return None, [], {}
    sig_spec = signature_spec(policy)
    cached = ensure_signatures(ws, chunks, sig_spec, ws.config.execution.workers)
    on_runner = distributed(ws.config.execution)
    arrays, modes = opened_signatures(ws, cached, sig_spec, on_runner)
    content = _source_contents(ws)
    texts = TextLookup(ws, chunks, verified=True)  # PartitionDb verified the same files
    pairs = PairLookup(db, mode.pairs_sql) if mode.pairs_sql is not None else None
    fresh = _fresh_rows(chunks, mode) if pairs is not None else None
    band = None
    if on_runner:  # banding and verification on the workers
        band = BandRunner(ws, _band_inputs(chunks, cached, sig_spec, mode))
    banding = _banding(ws, chunks, cached, arrays, mode, tmp / "bands")
    near = NearStage(
        policy, arrays, texts, content, ws.home / "tmp", modes, pairs, fresh, band, banding
    )
    refs = [
        {"chunk": c.chunk, "signatures": make_ref(c.digest, NPY, ws.cas.size(c.digest))}
        for c in cached
    ]
    run_stats = {
        "signatures_hashed": sum(c.records for c in cached if c.hashed),
        "signatures_reused": sum(c.records for c in cached if not c.hashed),
    }
    return near, refs, run_stats


def _banding(
    ws: Workspace,
    chunks: list[ChunkRecords],
    cached: list[ChunkSignatures],
    arrays: list[Any],
    mode: Mode,
    folder: Path,
) -> Banding:
    """The band index's source and sink: the parent's index (verified) mapped onto this
    partition's rows when incremental, files in ``folder`` (in the layer's temporary
    directory, gone with it whatever happens) for this run's."""
    starts = np.cumsum([0, *(c.records for c in cached)], dtype=np.int64)
    params = LshParams.of(ws.config.policies.dedup.near)
    folder.mkdir(parents=True, exist_ok=True)
    if mode.mode != INCREMENTAL or not mode.bands:
        return Banding(arrays, starts, params, folder)
    files = TrustedFiles(ws.cas, ws.catalog)
    parent = {
        name: Path(files.path(ref["digest"], f"parent band index ({name})"))
        for name, ref in mode.bands.items()
    }
    _, parent_to_child = row_maps(mode.chunks, [(c.records["digest"], c.count) for c in chunks])
    return Banding(arrays, starts, params, folder, parent, parent_to_child)


def _carried(
    ws: Workspace, mode: Mode, chunk_rows: list[tuple[str, int]], db: PartitionDb
) -> Carried | None:
    """The record codes carried from the parent's clusters and decisions (verified) when it
    ran this code and both are at hand; None: the coding sorts."""
    if not _may_carry(mode):
        return None
    tables = (mode.decisions["digest"], mode.clusters["digest"])
    if not all(ws.cas.contains(digest) for digest in tables):
        return None
    files = TrustedFiles(ws.cas, ws.catalog)
    decisions = files.path(tables[0], "parent dedup decisions")
    parted = PartedTable.read(ws.cas, mode.clusters, "parent dedup clusters")
    if not all(ws.cas.contains(ref["digest"]) for ref in parted.refs):
        return None
    clusters = parted.paths(files, "parent dedup clusters")
    child_to_parent, _ = row_maps(mode.chunks, chunk_rows)
    carried = carried_codes(db, child_to_parent, decisions, clusters)
    db.flush()  # what reading the parent's tables freed goes back before the verdicts
    return carried


def _opened(
    ws: Workspace, chunks: list[ChunkRecords], mode: Mode
) -> tuple[PartitionDb, list[dict[str, Any]]]:
    """The partition database and each chunk's lengths ref: the lengths read and tabled only
    where the driver may sort the total order itself."""
    by_tasks = _coded_by_tasks(ws, mode)
    lengths, refs = chunk_lengths(ws, chunks, mode.lengths, read=not by_tasks)
    return PartitionDb.from_chunks(ws, chunks, lengths, with_lengths=not by_tasks), refs


def _coded_by_tasks(ws: Workspace, mode: Mode) -> bool:
    """Whether the records are surely coded by tasks (:func:`_coding`: on the runner, with no
    parent whose codes a child could carry), so the driver needs no text lengths."""
    return distributed(ws.config.execution) and not _may_carry(mode)


def _may_carry(mode: Mode) -> bool:
    """Whether a child may carry its parent's record codes (its tables are named)."""
    return mode.mode == INCREMENTAL and mode.decisions is not None and mode.clusters is not None


def _coding(
    ws: Workspace,
    chunks: list[ChunkRecords],
    carried: Carried | None,
    length_refs: list[dict[str, Any]],
    scratch: Path,
) -> Coding:
    """Where ``decide`` takes its codes, repeated ids and exact copies from: the codes carried
    from the parent, or tasks on the runner where the stages run there (:mod:`.task_coding`,
    which leave the chunks' names in ``scratch``), or else the partition database's sorts."""
    order = _source_ranks(ws)
    content = _source_contents(ws) if ws.config.policies.dedup.near.enabled else None
    if carried is not None or not distributed(ws.config.execution):
        return DriverCoding(carried, order, content)
    lengths = [ref["lengths"]["digest"] for ref in length_refs]
    return TaskCoding(ws, chunks, lengths, order, scratch, content)


def _source_ranks(ws: Workspace) -> dict[str, int]:
    """Each source's rank in the config: the total order's first key."""
    return {s.id: n for n, s in enumerate(ws.config.sources)}


def _source_contents(ws: Workspace) -> dict[str, str]:
    """Each source's content, which names its records' near-dedup classes."""
    return {s.id: s.content for s in ws.config.sources}


def _coding_work(coding: Coding) -> dict[str, int]:
    """The coding's run figures: carried codes, or the tasks it ran (never hashed)."""
    if isinstance(coding, TaskCoding):
        return dict(coding.work)
    if isinstance(coding, DriverCoding) and coding.carried is not None:
        return {"codes_carried": 1}
    return {}


def _put_bands(ws: Workspace, banding: Banding) -> list[dict[str, Any]]:
    """This run's band index in the store, one file per class, sorted by class name."""
    out = []
    for name, path in sorted(banding.written.items()):
        digest, size = ws.cas.adopt_file(path)
        out.append({"class": name, "index": make_ref(digest, NPY, size)})
    return out


def _band_inputs(
    chunks: list[ChunkRecords], cached: list[ChunkSignatures], spec: SignatureSpec, mode: Mode
) -> BandInputs:
    """What band tasks read: signature chunks with their first rows, the canonical chunks, and
    the parent's verified pairs when incremental."""
    starts = np.cumsum([0, *(c.records for c in cached)]).tolist()
    signatures = tuple((c.digest, starts[i], c.records) for i, c in enumerate(cached))
    parent = mode.pairs if mode.pairs_sql is not None else None
    return BandInputs(signatures, tuple(chunks), spec, parent)


def _fresh_rows(chunks: list[ChunkRecords], mode: Mode) -> np.ndarray:
    """Per row, whether its chunk is new since the parent (not one the parent listed)."""
    return np.repeat(
        np.array([c.records["digest"] not in mode.lengths for c in chunks], dtype=bool),
        np.array([c.count for c in chunks], dtype=np.int64),
    )


def _near_work(near: NearStage | None, mode: Mode, chunks: list[ChunkRecords]) -> dict[str, int]:
    """What near-dedup did in this run (never hashed: an incremental and a full build of the
    same sources publish the same bytes): the mode, pairs reused, computed, texts shingled,
    chunks whose text lengths were the parent's; nothing when near-dedup is off."""
    if near is None:
        return {}
    band = near.band_work()
    reused = band.pop("pairs_reused", 0)
    work = {**near.work, **band, "near_incremental": int(mode.mode == INCREMENTAL)}
    if near.banding is not None:
        work |= near.banding.work
    if near.pairs is not None:
        work["pairs_reused"] = near.pairs.found + reused
        work["lengths_reused"] = sum(c.records["digest"] in mode.lengths for c in chunks)
    return work


def _counts(decided: Decided, report: DedupReport, tombstoned: int) -> dict[str, int]:
    verdicts = Counter[str]()
    for per_verdict in report.per_source.values():
        verdicts.update(per_verdict)
    conflicts = sum(reason.startswith(ID_CONFLICT) for reason in decided.excluded.values())
    return {
        "records": decided.n,
        "kept": verdicts[KEEP],
        "removed": verdicts[EXACT] + verdicts[NEAR],
        "exact_duplicates": verdicts[EXACT],
        "near_duplicates": verdicts[NEAR],
        "tombstoned": tombstoned,
        "duplicate_ids": verdicts[EXCLUDED] - tombstoned - conflicts,
        "id_conflicts": conflicts,
        # a kept row stands for itself, every removed one behind a kept row (an exact copy's
        # representative is kept or near, a near one's match kept): a cluster per kept row
        "clusters": verdicts[KEEP],
        "leakage_groups": decided.leakage.groups,
    }
