"""Token arrays cached per canonical chunk: a new snapshot only tokenises records it never saw.

A chunk's tokens are a chunk task keyed by the chunk's records-table digest, the
tokenizer (by digest, with its specials, dtype and chat template: ``TokenizerSpec.token_key``)
and the code identity of this module (its closure holds the encoders and the file layout): the
same records under the same tokenizer and code are never tokenised twice, whichever snapshot or
layer asks.

Layout: the task's output is a small JSON descriptor (``corpus.tokens.v2``: tokenizer and chat
template digests, dtype, record and token counts) with refs to four ``.npy`` files in the CAS, so
``verify`` walks from a layer index to all of them: ``ids``, every record's tokens back to back
(``tokens.chat``: a document is ``[BOS] + content + [EOS]``, a ``messages`` record its chat
render, a ``preference`` record its two sequences; little-endian uint16, or uint32 above 65,536
ids); ``targets``, uint8, one per id (1 = a training target), absent (null) when the chunk holds
documents only, every token of which is a target; ``offsets``, int64, records + 1 of
them: record ``i`` is ``ids[offsets[i]:offsets[i + 1]]``; and ``pair_split``, int64 per record,
the length of a preference record's first sequence (0 for every other record). All are written
batch by batch (``storage.npy_stream``) and read memory-mapped (``TokenArrays``), verified once
when opened. A chunk whose ``kind`` column is all ``document`` never reads ``payload`` and writes
no targets file (it would be a byte of 1 per token, half again the bytes of uint16 ids, to write
and hash).
"""

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corpus_assets.core.records.index import RECORD_COLUMNS, ChunkRecords
from corpus_assets.core.runtime.code_identity import code_identity
from corpus_assets.core.runtime.workspace import Workspace, cached_then_pooled
from corpus_assets.core.storage.artifacts import JSON, Ref, get_json, make_ref, put_json
from corpus_assets.core.storage.digests import json_digest
from corpus_assets.core.storage.npy_stream import NpyStream
from corpus_assets.core.storage.tasks import ChunkOutcome, ChunkTask, preload, run_chunk
from corpus_assets.core.tokens.chat import DOCUMENT, encode_records
from corpus_assets.core.tokens.spec import HUGGINGFACE, TokenizerSpec, load_hf

LAYER = "tokens"
TOKENS_SCHEMA = "corpus.tokens.v2"
BATCH_RECORDS = 1024  # records per Parquet read
SLICE_BYTES = 4 << 20  # text bytes per encode call (one longer text alone): bounds the memory
_IDENTITY = code_identity(__name__)  # hashed at import, from the source this process loaded


class TokensDescriptor(BaseModel):
    """The cached tokens of one chunk: what they were made with and where the arrays are."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    descriptor_schema: Literal["corpus.tokens.v2"] = Field(TOKENS_SCHEMA, alias="schema")
    tokenizer: str
    chat_template: str = Field(alias="chatTemplate")
    dtype: str
    records: int
    tokens: int
    ids: Ref
    targets: Ref | None  # None: documents only, every token a target
    offsets: Ref
    pair_split: Ref = Field(alias="pairSplit")


@dataclass(frozen=True)
class ChunkTokens:
    chunk: str
    records: int
    digest: str  # the descriptor
    tokenized: bool  # computed in this run (False: reused from the cache)


def code_version() -> str:
    """``tokens.v2@<code identity>``: a fix to an encoder or the layout tokenises again."""
    return f"tokens.v2@{_IDENTITY}"


def _task(chunk_key: str, records_digest: str, spec: TokenizerSpec) -> ChunkTask:
    return ChunkTask(
        layer=LAYER,
        chunk_key=chunk_key,
        input_digest=json_digest({"records": records_digest, "tokenizer": spec.token_key()}),
        code_version=code_version(),
    )


def tokenize_chunk(ws: Workspace, chunk: ChunkRecords, spec: TokenizerSpec) -> str:
    """Tokenise one chunk a batch at a time into the CAS; returns the descriptor's digest."""
    tokenizer = load_hf(ws.cas, spec.digest) if spec.kind == HUGGINGFACE else None
    parquet = chunk.parquet(ws.cas)
    structured = _has_structured_rows(parquet)
    columns = ["kind", "payload", "text"] if structured else ["text"]
    counts, splits = [np.zeros(1, np.int64)], []
    with ExitStack() as stack:
        ids = stack.enter_context(NpyStream(ws.cas, spec.dtype))
        targets = stack.enter_context(NpyStream(ws.cas, np.uint8)) if structured else None
        for batch in parquet.iter_batches(BATCH_RECORDS, columns=columns, use_threads=False):
            for encoded in encode_records(spec, batch, tokenizer, SLICE_BYTES):
                ids.write(encoded.ids)
                if targets is not None:
                    marks = encoded.targets
                    targets.write(np.ones(len(encoded.ids), np.uint8) if marks is None else marks)
                counts.append(encoded.counts)
                splits.append(encoded.pair_split)
    with NpyStream(ws.cas, "<i8") as offsets:
        offsets.write(np.cumsum(np.concatenate(counts)))
    with NpyStream(ws.cas, "<i8") as pair_split:
        pair_split.write(np.concatenate(splits) if splits else np.empty(0, np.int64))
    assert ids.ref and offsets.ref and pair_split.ref
    if offsets.length != chunk.count + 1:
        raise ValueError(f"{chunk.what}: {offsets.length - 1} texts read, {chunk.count} expected")
    descriptor = TokensDescriptor(
        tokenizer=spec.digest,
        chat_template=spec.chat_template.digest,
        dtype=spec.dtype_name,
        records=chunk.count,
        tokens=ids.length,
        ids=ids.ref,
        targets=targets.ref if targets is not None else None,
        offsets=offsets.ref,
        pair_split=pair_split.ref,
    )
    return put_json(ws.cas, descriptor.model_dump(by_alias=True))["digest"]


def _has_structured_rows(parquet: pq.ParquetFile) -> bool:
    """Whether any row is not a document (only the small ``kind`` column is read)."""
    if "kind" not in parquet.schema_arrow.names:
        return False
    kinds = parquet.read(columns=["kind"], use_threads=False).column("kind")
    return len(kinds) > 0 and not pc.all(pc.equal(kinds, DOCUMENT)).as_py()


def _chunk_task(chunk: ChunkRecords, spec: Any) -> ChunkTask:
    return _task(chunk.key, chunk.records["digest"], spec)


def _compute(ws: Workspace, chunk: ChunkRecords, spec: TokenizerSpec, done: Any) -> ChunkOutcome:
    task = _chunk_task(chunk, spec)
    return run_chunk(ws.catalog, ws.cas, task, lambda: tokenize_chunk(ws, chunk, spec), done=done)


def ensure_tokens(
    ws: Workspace,
    chunks: list[ChunkRecords],
    spec: TokenizerSpec,
    workers: int,
) -> list[ChunkTokens]:
    """The tokens of every chunk, tokenising only the missing ones.

    ``workers > 1`` (a spawn pool) or ``execution.engine: ray`` tokenises chunks in other
    processes; the local engine keeps them here when the missing chunks' records tables hold at
    most ``execution.in_process_bytes`` (a child's few new chunks: cheaper than starting
    workers). Each chunk's bytes do not depend on where.
    """
    done = preload(ws.catalog, LAYER, code_version())
    outcomes = cached_then_pooled(
        ws, chunks, spec, _chunk_task, _compute, done, workers, ChunkRecords.stored_bytes
    )
    out = []
    for chunk, outcome in zip(chunks, outcomes, strict=True):
        if outcome.output_digest is None:
            raise RuntimeError(f"tokens of chunk {chunk.key} failed: {outcome.error}")
        out.append(ChunkTokens(chunk.key, chunk.count, outcome.output_digest, not outcome.skipped))
    return out


@dataclass
class TokenArrays:
    """One chunk's cached tokens, memory-mapped: per-record counts, pair splits, and a
    record's tokens and targets."""

    chunk: str
    offsets: np.ndarray
    ids: np.ndarray | None  # None when opened for counts only
    target_mask: np.ndarray | None = None  # uint8 per id (None: counts only, or all_targets)
    pair_splits: np.ndarray | None = None  # int64 per record
    all_targets: bool = False  # documents only: every token is a target, no file stored
    ids_path: Path | None = None  # the verified ids .npy, for readers that pread samples

    def counts(self) -> np.ndarray:
        """Tokens per record (int64), in the chunk's record order."""
        return np.diff(self.offsets)

    def record(self, row: int) -> np.ndarray:
        """The tokens of the chunk's ``row``-th record: a read-only view of the mapped file."""
        if self.ids is None:
            raise ValueError(f"tokens of chunk {self.chunk} were opened for counts only")
        return self.ids[self.offsets[row] : self.offsets[row + 1]]

    def targets(self, row: int) -> np.ndarray:
        """The ``row``-th record's targets (uint8, 1 = training target), aligned with
        ``record(row)``: a read-only view of the mapped file."""
        if self.all_targets:
            return np.ones(int(self.offsets[row + 1] - self.offsets[row]), np.uint8)
        if self.target_mask is None:
            raise ValueError(f"targets of chunk {self.chunk} were opened for counts only")
        return self.target_mask[self.offsets[row] : self.offsets[row + 1]]

    def pair_split(self, row: int) -> int:
        """Length of the first sequence of a preference pair record, 0 for any other record."""
        if self.pair_splits is None:
            raise ValueError(f"pair splits of chunk {self.chunk} were not opened")
        return int(self.pair_splits[row])


def open_tokens(
    ws: Workspace, item: ChunkTokens, spec: TokenizerSpec, ids: bool = True, verify: bool = True
) -> TokenArrays:
    """A chunk's cached tokens, verified against their digests and checked for shape.

    ``ids=False`` maps the offsets and pair splits alone (counts and pairs need no token);
    ``verify=False`` is for a worker whose caller verified these very files a moment ago."""
    what = f"tokens of chunk {item.chunk}"
    try:
        descriptor = TokensDescriptor.model_validate(get_json(ws.cas, item.digest, what))
    except ValidationError as error:
        raise ValueError(f"{what} ({item.digest}): malformed descriptor: {error}") from None
    made = (descriptor.tokenizer, descriptor.dtype, descriptor.chat_template)
    wanted = (spec.digest, spec.dtype_name, spec.chat_template.digest)
    if made != wanted:
        raise ValueError(
            f"{what} ({item.digest}) were made by {made[0]} as {made[1]} with chat template "
            f"{made[2]}, not by {wanted[0]} as {wanted[1]} with chat template {wanted[2]}"
        )
    offsets = _mapped(ws, descriptor.offsets, f"{what}: offsets", np.dtype("<i8"), verify)
    if len(offsets) != item.records + 1 or int(offsets[-1]) != descriptor.tokens:
        raise ValueError(f"{what}: {len(offsets)} offsets up to {offsets[-1]} for {item.records}")
    splits = _mapped(ws, descriptor.pair_split, f"{what}: pair_split", np.dtype("<i8"), verify)
    if len(splits) != item.records:
        raise ValueError(f"{what}: {len(splits)} pair splits for {item.records} records")
    if not ids:
        return TokenArrays(item.chunk, offsets, None, None, splits)
    mapped = _mapped(ws, descriptor.ids, f"{what}: ids", spec.dtype, verify)
    ids_path = ws.cas.path(descriptor.ids["digest"])
    if len(mapped) != descriptor.tokens:
        raise ValueError(f"{what}: {len(mapped)} ids, the descriptor says {descriptor.tokens}")
    if descriptor.targets is None:
        return TokenArrays(item.chunk, offsets, mapped, None, splits, True, ids_path)
    targets = _mapped(ws, descriptor.targets, f"{what}: targets", np.dtype("u1"), verify)
    if len(targets) != descriptor.tokens:
        raise ValueError(f"{what}: {len(targets)} targets, the descriptor says {descriptor.tokens}")
    return TokenArrays(item.chunk, offsets, mapped, targets, splits, False, ids_path)


def _mapped(ws: Workspace, ref: Ref, what: str, dtype: np.dtype, verify: bool) -> np.ndarray:
    if verify:
        ws.cas.verify(ref["digest"], what)
    array = np.load(ws.cas.path(ref["digest"]), mmap_mode="r", allow_pickle=False)
    if array.dtype != dtype or array.ndim != 1:
        raise ValueError(f"{what} ({ref['digest']}): {array.dtype} {array.shape}, not 1-D {dtype}")
    return array


@dataclass(frozen=True)
class TokenCache:
    """A layer's view of the cache: the spec, every chunk's tokens, and what to list."""

    spec: TokenizerSpec
    chunks: list[ChunkTokens] = field(default_factory=list)

    def refs(self, ws: Workspace) -> list[dict[str, Any]]:
        """Per chunk, the descriptor ref a layer index lists in its outputs (``verify`` walks
        it to both arrays)."""
        return [
            {"chunk": c.chunk, "tokens": make_ref(c.digest, JSON, ws.cas.size(c.digest))}
            for c in self.chunks
        ]

    def tokenizer_ref(self, ws: Workspace) -> Ref:
        """The spec document in the CAS: a layer lists it among its inputs, so its build spec
        (and ``verify``, through the file ref inside) covers the tokenizer."""
        return put_json(ws.cas, self.spec.document())

    def run_stats(self) -> dict[str, int]:
        return {
            "tokens_tokenized": sum(c.records for c in self.chunks if c.tokenized),
            "tokens_reused": sum(c.records for c in self.chunks if not c.tokenized),
        }


def token_cache(ws: Workspace, chunks: list[ChunkRecords], spec: TokenizerSpec) -> TokenCache:
    """Ensure the tokens of ``chunks`` under ``spec`` with the configured worker count."""
    return TokenCache(spec, ensure_tokens(ws, chunks, spec, ws.config.execution.workers))


def token_counts(
    ws: Workspace,
    chunks: list[ChunkRecords],
    cache: TokenCache,
    columns: tuple[str, ...] = ("record_id", "object", "line"),
    located: bool = False,
) -> pa.Table:
    """``columns`` and the token count (``tokens``) of every canonical row, one chunk read at a
    time (object and line tell a repeated record id's rows apart). ``located`` adds where the
    row's tokens are (``chunk`` index, ``row`` in it) and its ``pair_split``."""
    parts = []
    for n, (chunk, cached) in enumerate(zip(chunks, cache.chunks, strict=True)):
        table = chunk.table(ws.cas, list(columns))
        arrays = open_tokens(ws, cached, cache.spec, ids=False)
        table = table.append_column("tokens", pa.array(arrays.counts(), pa.int64()))
        if located:
            rows = table.num_rows
            table = (
                table.append_column("chunk", pa.array(np.full(rows, n, np.int32)))
                .append_column("row", pa.array(np.arange(rows, dtype=np.int64)))
                .append_column("pair_split", pa.array(np.asarray(arrays.pair_splits), pa.int64()))
            )
        parts.append(table)
    if parts:
        return pa.concat_tables(parts)
    fields = [RECORD_COLUMNS.field(name) for name in columns] + [("tokens", pa.int64())]
    if located:
        fields += [("chunk", pa.int32()), ("row", pa.int64()), ("pair_split", pa.int64())]
    return pa.schema(fields).empty_table()
