"""Fit a tokenizer on the train split only (``corpus-assets tokenizer train``).

The texts are the train members of a built partition: the dedup representatives (by record id,
object and line, so a repeated id elsewhere never slips in) that its ``splits`` table puts in
train. They stream chunk by chunk, a Parquet batch at a time, from the canonical chunks; no
validation or test text is read. The byte-level BPE (``tokens.bpe``) is pinned in the CAS by
the digest of its ``tokenizer.json`` bytes, which is what ``policies.tokenizer.digest`` names.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer

from corpus_assets.core.records.index import CanonicalIndex
from corpus_assets.core.runtime.layer_index import read_layer_index
from corpus_assets.core.runtime.parted_table import PartedTable
from corpus_assets.core.runtime.workspace import Workspace
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.storage.cas_queries import VerifiedFiles
from corpus_assets.core.storage.fsio import atomic_write
from corpus_assets.core.tokens.bpe import train_byte_level_bpe
from corpus_assets.core.training_view.splits import TRAIN

BATCH_RECORDS = 4096


class FitError(ValueError):
    """The partition cannot give a tokenizer (no train records); the message says why."""


@dataclass(frozen=True)
class FittedTokenizer:
    digest: str
    size: int
    vocab_size: int
    records: int  # train texts read
    special_tokens: list[str]


def train_lines(ws: Workspace, partition_key: str) -> dict[str, pa.Array]:
    """Object -> lines of the partition's train members (the splits table by record id, the
    dedup representatives for where each member is: the clusters table stored whole or as
    chunk parts, every part read)."""
    _ref, splits = read_layer_index(ws, partition_key, "splits")
    table = get_table(ws.cas, splits.output("splits"), "splits table", ["record_id", "split"])
    train = table.filter(pc.equal(table.column("split"), TRAIN)).column("record_id")
    _ref, dedup = read_layer_index(ws, partition_key, "dedup_clusters")
    clusters = PartedTable.read(ws.cas, dedup.output("clusters"), "dedup clusters")
    columns = ["record_id", "object", "line", "is_representative"]
    table = clusters.table(VerifiedFiles(ws.cas), "dedup clusters", columns)
    chosen = table.filter(table.column("is_representative"))
    chosen = chosen.filter(pc.is_in(chosen.column("record_id"), value_set=train.combine_chunks()))
    out: dict[str, pa.Array] = {}
    for group in chosen.group_by("object").aggregate([("line", "list")]).to_pylist():
        out[group["object"]] = pa.array(group["line_list"], pa.int64())
    return out


def train_texts(ws: Workspace, partition_key: str) -> Iterator[list[str]]:
    """The train members' texts, a batch at a time, in canonical chunk then record order."""
    lines = train_lines(ws, partition_key)
    _ref, canonical = CanonicalIndex.read(ws, partition_key)
    for chunk in canonical.chunks():
        parquet = chunk.parquet(ws.cas)
        for batch in parquet.iter_batches(BATCH_RECORDS, columns=["object", "line", "text"]):
            keep = pa.array([False] * batch.num_rows)
            for name in pc.unique(batch.column(0)).to_pylist():
                if name in lines:
                    here = pc.equal(batch.column(0), name)
                    keep = pc.or_(keep, pc.and_(here, pc.is_in(batch.column(1), lines[name])))
            texts = pc.filter(batch.column(2), keep).to_pylist()
            if texts:
                yield texts


def fit_tokenizer(
    ws: Workspace,
    partition_key: str,
    vocab_size: int,
    special_tokens: list[str],
    out: Path | None = None,
) -> FittedTokenizer:
    """Train a byte-level BPE on the partition's train split; pin it (and write ``out``)."""
    read = 0

    def counted() -> Iterator[list[str]]:
        nonlocal read
        for texts in train_texts(ws, partition_key):
            read += len(texts)
            yield texts

    data = train_byte_level_bpe(counted(), vocab_size, special_tokens)
    if read == 0:
        raise FitError(f"partition {partition_key} has no train records to fit a tokenizer on")
    digest = ws.cas.put_bytes(data)
    if out is not None:
        atomic_write(out, data)
    vocab = Tokenizer.from_str(data.decode("utf-8")).get_vocab_size(with_added_tokens=True)
    return FittedTokenizer(digest, len(data), vocab, read, special_tokens)
