"""The training entry point: a run names a snapshot by digest, takes a permit, reads verified bytes.

The training API accepts only a manifest digest. An alias is resolved once, explicitly
(``resolve_alias``); nothing else here accepts an alias or "latest". ``take_permit`` checks the
snapshot in the same gate that activation uses (ACTIVE, purpose, tombstone watermark and benchmark
fence equal to the alias gate row) and records a permit bound to the digest and the run id, in one
transaction with the gate row read. A run that resumes gets its original permit back (even if the
alias moved on or a fence advanced since: its pinned inputs do not change); the same run id with
another digest is refused, since changed data means a new run. ``TrainingReader`` opens exactly the
CAS objects the manifest names, verifies every digest before handing out a byte, and reports what
it read. Both check the manifest's signature against the trust root first (``_manifest``): a
snapshot re-signed or unsigned gets no permit and no read.
"""

import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
from sqlalchemy import Connection, insert, select
from sqlalchemy.exc import IntegrityError

from corpus_assets.core.governance import states
from corpus_assets.core.governance.audit_fields import audit_field
from corpus_assets.core.publication.block_reader import (
    BlockReader,
    BlockStream,
    ReaderState,
    load_state,
)
from corpus_assets.core.publication.signing import SignatureError
from corpus_assets.core.publication.verify import resolve, signed_manifest
from corpus_assets.core.runtime.layer_index import LayerIndex, load_index
from corpus_assets.core.runtime.snapshot_manifest import Manifest, ManifestError
from corpus_assets.core.storage.artifacts import PARQUET, decode_table
from corpus_assets.core.storage.cas import CasError, ContentStore
from corpus_assets.core.storage.catalog import Catalog, gate, permits
from corpus_assets.core.storage.digests import DIGEST_RE, json_digest
from corpus_assets.core.storage.shards import ShardIndex
from corpus_assets.core.storage.shards import load_index as load_shard_index


class TrainingError(RuntimeError):
    """A training request refused; the message names the digest, the run id and the rule."""


@dataclass(frozen=True)
class Permit:
    """A run's recorded right to read one snapshot, at the fences it was granted under."""

    permit_id: str
    run_id: str
    snapshot_id: str
    alias: str
    purpose: str
    tombstone_watermark: int
    benchmark_fence: int
    generation: int | None
    resumed: bool


def resolve_alias(catalog: Catalog, alias: str) -> str:
    """The alias's active snapshot id, read once from the gate row. Record it: it is the run's."""
    with catalog.begin() as conn:
        active = conn.scalar(select(gate.c.active_snapshot).where(gate.c.alias == alias))
    if active is None:
        raise TrainingError(f"alias {alias!r} has no active snapshot; nothing to train on")
    return active


def take_permit(
    cas: ContentStore, catalog: Catalog, snapshot_id: str, run_id: str, purpose: str
) -> Permit:
    """A permit for ``run_id`` to train on ``snapshot_id`` (snapshotId or manifest CAS digest).

    Rules, each refusal naming it: the argument is a digest (never an alias or "latest"); the run
    id is not empty; a run that already holds a permit gets it back (``resumed``) if it names the
    same snapshot and purpose, and is refused otherwise; the snapshot is ACTIVE; its manifest
    verifies and its purpose equals ``purpose``; its tombstone watermark and benchmark fence equal
    the alias gate row's current values; run id and purpose are audit fields (no control
    characters or line breaks: ``audit_fields``).
    """
    audit_field("purpose", purpose, permits.c.purpose)
    snapshot = _requested(catalog, snapshot_id, run_id)
    existing = _permit_for_run(catalog, run_id)
    if existing is not None:
        return _resume(existing, snapshot.snapshot_id, purpose)
    manifest = _trainable(cas, catalog, snapshot, run_id, purpose)
    request = _Request(
        run_id=run_id,
        snapshot_id=snapshot.snapshot_id,
        alias=snapshot.alias,
        purpose=purpose,
        tombstone_watermark=manifest.tombstone_seq,
        benchmark_fence=manifest.benchmark_seq,
    )
    try:
        return _record_permit(catalog, request)
    except IntegrityError:  # the same run id committed concurrently: resume it
        again = _permit_for_run(catalog, run_id)
        if again is None:
            raise
        return _resume(again, snapshot.snapshot_id, purpose)


def _requested(catalog: Catalog, snapshot_id: str, run_id: str) -> states.Snapshot:
    """The snapshot a request names, refused unless it names one by digest for a named run."""
    if not isinstance(snapshot_id, str) or not DIGEST_RE.fullmatch(snapshot_id):
        raise TrainingError(
            f"run {run_id!r}: training accepts only a snapshot digest (sha256:<64 hex>), not "
            f"{snapshot_id!r}; resolve an alias once with resolve_alias and record the digest"
        )
    if not isinstance(run_id, str) or not run_id.strip():
        raise TrainingError(f"snapshot {snapshot_id}: a permit needs a non-empty run id")
    audit_field("run_id", run_id, permits.c.run_id)
    try:
        return resolve(catalog, snapshot_id)
    except states.StateError:
        raise TrainingError(
            f"run {run_id!r}: no snapshot with id or manifest digest {snapshot_id} in the catalog"
        ) from None


def _trainable(
    cas: ContentStore, catalog: Catalog, snapshot: states.Snapshot, run_id: str, purpose: str
) -> Manifest:
    """The verified manifest of an ACTIVE snapshot built for ``purpose`` and its own alias."""
    sid = snapshot.snapshot_id
    if snapshot.state != states.ACTIVE:
        raise TrainingError(
            f"run {run_id!r}: snapshot {sid} is {snapshot.state}; only a snapshot activated "
            "through the gate (ACTIVE) can be trained on"
        )
    manifest = _manifest(cas, catalog, snapshot, run_id)
    if manifest.purpose != purpose:
        raise TrainingError(
            f"run {run_id!r}: snapshot {sid} was built for purpose {manifest.purpose!r}, "
            f"the run asks for {purpose!r}; purposes must match"
        )
    if manifest.alias != snapshot.alias:
        raise TrainingError(
            f"run {run_id!r}: snapshot {sid} manifest names alias {manifest.alias!r}, "
            f"the catalog {snapshot.alias!r}"
        )
    _check_members(cas, manifest, run_id, sid)
    return manifest


def _check_members(cas: ContentStore, manifest: Manifest, run_id: str, sid: str) -> None:
    """The members table (the record of what the run reads) must be intact before a run is
    bound to the snapshot: the reader verifies each shard it reads, never this table."""
    members = manifest.members
    try:
        cas.verify(members.digest, "manifest.members")
        if members.media != PARQUET:  # a parts document: each part too
            for ref in members.part_refs(cas):
                cas.verify(ref["digest"], f"manifest.members part of {members.digest}")
    except (CasError, ManifestError) as error:
        raise TrainingError(f"run {run_id!r}: snapshot {sid} is damaged: {error}") from None


@dataclass(frozen=True)
class _Request:
    """What a permit is asked for: a run, a snapshot, and the fences the snapshot was built at."""

    run_id: str
    snapshot_id: str
    alias: str
    purpose: str
    tombstone_watermark: int
    benchmark_fence: int

    @property
    def permit_id(self) -> str:
        """The same request always names the same permit."""
        return json_digest(
            {
                "runId": self.run_id,
                "snapshotId": self.snapshot_id,
                "purpose": self.purpose,
                "tombstoneWatermark": str(self.tombstone_watermark),
                "benchmarkFence": str(self.benchmark_fence),
            }
        )


def _record_permit(catalog: Catalog, request: _Request) -> Permit:
    """Insert the permit in one transaction with the locked gate row it was checked against."""
    run_id, sid, alias = request.run_id, request.snapshot_id, request.alias
    watermark, fence = request.tombstone_watermark, request.benchmark_fence
    with catalog.begin() as conn:
        row = _lock_gate_row(conn, alias)
        raced = _permit_row(conn, run_id)
        if raced is not None:  # another process permitted this run after our first look
            return _resume(_to_permit(raced, resumed=True), sid, request.purpose)
        if row is None:
            raise TrainingError(
                f"run {run_id!r}: alias {alias!r} of snapshot {sid} has no gate row"
            )
        if (row["tombstone_watermark"], row["benchmark_fence"]) != (watermark, fence):
            raise TrainingError(
                f"run {run_id!r}: snapshot {sid} was built at tombstone watermark {watermark} "
                f"and benchmark fence {fence}, but alias {alias!r} is now at tombstone watermark "
                f"{row['tombstone_watermark']} and benchmark fence {row['benchmark_fence']}: it "
                "may hold revoked or benchmark data; build and activate a new snapshot"
            )
        values = {
            **asdict(request),
            "permit_id": request.permit_id,
            "generation": row["generation"],
        }
        conn.execute(insert(permits).values(**values, at=time.time()))
    return Permit(**values, resumed=False)


def _lock_gate_row(conn: Connection, alias: str) -> Any:
    """Read the alias gate row so that no fence advance or activation can commit until we do.

    PostgreSQL: ``SELECT ... FOR UPDATE`` row-locks the gate row; a concurrent fence advance (an
    UPDATE of that row) waits for our commit, and if it committed first we read its new values
    (READ COMMITTED re-reads the latest version after the lock wait). SQLite has no row locks and
    SQLAlchemy renders no FOR UPDATE there; instead the transaction starts with ``BEGIN
    IMMEDIATE``, which takes the database write lock before the read. pysqlite only begins
    implicitly before DML, so this is the transaction's first statement and ``commit``/``rollback``
    end it as usual. A writer that committed before we got the lock is visible to our read (the
    WAL read snapshot starts with this transaction); one that comes after waits for us
    (busy_timeout). Either way the check and the permit INSERT see the same gate values that are
    current at commit.
    """
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    return (
        conn.execute(select(gate).where(gate.c.alias == alias).with_for_update()).mappings().first()
    )


def _permit_row(conn: Connection, run_id: str) -> Any:
    return conn.execute(select(permits).where(permits.c.run_id == run_id)).mappings().first()


def _permit_for_run(catalog: Catalog, run_id: str) -> Permit | None:
    with catalog.begin() as conn:
        row = _permit_row(conn, run_id)
    return _to_permit(row, resumed=True) if row is not None else None


def _to_permit(row: Any, resumed: bool) -> Permit:
    fields = [f for f in Permit.__dataclass_fields__ if f != "resumed"]
    return Permit(**{f: row[f] for f in fields}, resumed=resumed)


def _resume(existing: Permit, snapshot_id: str, purpose: str) -> Permit:
    """Resuming keeps the original digest; asking for anything else is a new run."""
    if existing.snapshot_id != snapshot_id:
        raise TrainingError(
            f"run {existing.run_id!r} holds permit {existing.permit_id} for snapshot "
            f"{existing.snapshot_id}, not {snapshot_id}: changed data means a new run"
        )
    if existing.purpose != purpose:
        raise TrainingError(
            f"run {existing.run_id!r} holds permit {existing.permit_id} for purpose "
            f"{existing.purpose!r}, not {purpose!r}: purposes must match"
        )
    return existing


def _manifest(
    cas: ContentStore, catalog: Catalog, snapshot: states.Snapshot, run_id: str
) -> Manifest:
    """The one door of every permit and reader (read, exports, the torch and HF loaders):
    ``verify.signed_manifest``, before any byte."""
    try:
        return signed_manifest(cas, catalog, snapshot)[0]
    except SignatureError as error:
        raise TrainingError(f"run {run_id!r}: manifest signature: {error}") from None
    except ManifestError as error:
        raise TrainingError(f"run {run_id!r}: {error}") from None


class TrainingReader:
    """Reads a permitted snapshot's exact CAS objects, verifying every digest it reads.

    Opening checks the permit against the catalog (a Permit object alone grants nothing) and
    loads the manifest and the packed_blocks index, both verified. It does not re-check the gate:
    a run's pinned inputs stay readable after a fence advance (new permits are refused instead).
    """

    def __init__(self, cas: ContentStore, catalog: Catalog, permit: Permit) -> None:
        self.cas = cas
        self.catalog = catalog
        self.permit = permit
        self._read: dict[tuple[str, str], int] = {}
        with catalog.begin() as conn:
            row = _permit_row(conn, permit.run_id)
        if row is None or (row["permit_id"], row["snapshot_id"]) != (
            permit.permit_id,
            permit.snapshot_id,
        ):
            raise TrainingError(
                f"run {permit.run_id!r}: permit {permit.permit_id} for snapshot "
                f"{permit.snapshot_id} is not recorded in the catalog; take_permit first"
            )
        snapshot = states.get(catalog, permit.snapshot_id)
        self.manifest = _manifest(cas, catalog, snapshot, permit.run_id)
        self._note("manifest", snapshot.manifest_digest, cas.size(snapshot.manifest_digest))
        self.packed = self._index(self.manifest.layers["packed_blocks"], "packed_blocks")
        self.block_tokens = int(self.packed.counts["block_tokens"])
        self.block_count = int(self.packed.counts["blocks"])
        self.tokenizer = self.packed.output("tokenizer")
        self.eos, self.pad = self.packed.output("eos"), self.packed.output("pad")
        self.shard_index = self._shard_index(self.packed.output("shard_index"))
        self._blocks = BlockReader(cas, self.shard_index)

    def _shard_index(self, ref: dict[str, Any]) -> ShardIndex:
        """The shard index the packed_blocks index names, checked against its counts."""
        self._checked(ref, "shard index", self.cas.size(ref["digest"]))
        index = load_shard_index(self.cas, ref["digest"])
        if (index.blocks, index.block_tokens) != (self.block_count, self.block_tokens):
            raise TrainingError(
                f"snapshot {self.permit.snapshot_id}: shard index {ref['digest']} holds "
                f"{index.blocks} blocks of {index.block_tokens} tokens, the packed_blocks index "
                f"says {self.block_count} of {self.block_tokens}"
            )
        return index

    @property
    def block_reader(self) -> BlockReader:
        """The verified reader of this snapshot's shards, for exports and loaders that read the
        whole pack through it: every shard is noted as read in the run's report."""
        for entry in self.shard_index.shards:
            self._note("shard", entry.digest, entry.size)
        return self._blocks

    @property
    def pack_digest(self) -> str:
        """The shard index digest: what a reader state binds a resumed run to."""
        return self.packed.output("shard_index")["digest"]

    def blocks(self, start: int = 0, fields: bool = False) -> Iterator[tuple[int, Any]]:
        """(block index, its ``input_ids``) from ``start`` on; ``fields=True`` gives every field
        (``input_ids``, ``segment_ids``, ``positions``, ``label_mask``) as a dict instead.

        Every block is verified before it is handed out, and only the 1 MiB chunks of its shard
        that it touches are hashed (once per open), so a run that starts mid-pack reads and hashes
        only what it uses. A corrupt byte raises ``ShardCorruptError`` naming shard and chunk.
        """
        if not 0 <= start <= self.block_count:
            raise TrainingError(
                f"run {self.permit.run_id!r}: block {start} is outside 0..{self.block_count}"
            )
        number = start
        for batch in self._blocks.batches(start):
            entry = self.shard_index.shards[self._blocks.locate(number)[0]]
            self._note("shard", entry.digest, entry.size)
            for row in range(len(batch["input_ids"])):
                if fields:
                    yield number, {name: values[row] for name, values in batch.items()}
                else:
                    yield number, batch["input_ids"][row]
                number += 1

    def stream(
        self, seed: int, shuffle: bool = True, saved: Mapping[str, Any] | None = None
    ) -> BlockStream:
        """One epoch of this snapshot's blocks in the order every rank and worker agrees on.

        ``saved`` is a ``state_dict`` from an earlier stream; it resumes only if it names this
        snapshot, pack (shard index), mix (mixed_samples index), tokenizer, seed and order, and
        is refused with ``ReaderStateError`` naming the field before any block is read."""
        expected = ReaderState(
            snapshot_id=self.permit.snapshot_id,
            pack_digest=self.pack_digest,
            mix_digest=self.manifest.layers["mixed_samples"]["digest"],
            tokenizer_digest=self.tokenizer["digest"],
            seed=seed,
            shuffle=shuffle,
        )
        state = expected if saved is None else load_state(saved, expected, self.block_count)
        return BlockStream(self._blocks, state)

    def close(self) -> None:
        self._blocks.close()

    def __enter__(self) -> "TrainingReader":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def members(self) -> pa.Table:
        """The manifest's members table, verified, with the row count the manifest states."""
        members = self.manifest.members
        if members.media != PARQUET:
            self._get(members.ref(), "members parts")  # re-hashed and noted, as each part
        parts = members.part_refs(self.cas)
        table = pa.concat_tables([decode_table(self._get(ref, "members")) for ref in parts])
        if table.num_rows != members.count:
            raise TrainingError(
                f"snapshot {self.permit.snapshot_id}: members {members.digest} has "
                f"{table.num_rows} rows, the manifest says {members.count}"
            )
        return table

    def spans(self) -> pa.Table:
        """The packed_blocks spans table (block, start, end, record_id, record_offset), verified."""
        return decode_table(self._get(self.packed.output("spans"), "spans"))

    def report(self) -> dict[str, Any]:
        """What this run read: every object with its digest and size, for the run's record."""
        return {
            "snapshotId": self.permit.snapshot_id,
            "runId": self.permit.run_id,
            "permitId": self.permit.permit_id,
            "read": [
                {"what": what, "digest": digest, "bytes": size}
                for (what, digest), size in self._read.items()
            ],
        }

    def _get(self, ref: dict[str, Any], what: str) -> bytes:
        data = self.cas.get_bytes(ref["digest"], what)  # re-hashes; CorruptObjectError names it
        self._checked(ref, what, len(data))
        return data

    def _index(self, ref: dict[str, Any], layer: str) -> LayerIndex:
        """A layer index (re-hashed and schema-checked on read), size-checked and noted too."""
        index = load_index(self.cas, ref["digest"], layer)  # errors name it "<layer> index"
        self._checked(ref, f"{layer} index", self.cas.size(ref["digest"]))
        return index

    def _checked(self, ref: dict[str, Any], what: str, size: int) -> None:
        """Every object read must have the size its ref states; it is noted for the report."""
        if size != ref["size"]:
            raise TrainingError(
                f"snapshot {self.permit.snapshot_id}: {what} {ref['digest']} is {size} "
                f"bytes, its ref says {ref['size']}"
            )
        self._note(what, ref["digest"], size)

    def _note(self, what: str, digest: str, size: int) -> None:
        self._read[(what, digest)] = size
