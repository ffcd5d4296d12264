"""Exports of a permitted snapshot for trainers and catalogues that read other formats: Megatron,
MDS, or Croissant metadata (``croissant.json`` beside the files it names).

An export is a training read: it needs the run's permit (``take_permit``), opens the snapshot
through ``TrainingReader`` (manifest, packed_blocks index and shard index verified), reads every
block chunk-verified, puts the export files and an export document (each file's digest and size)
in the CAS, and copies the files out through the CAS's verifying reader. The document's digest
names the export; a copy elsewhere is checkable file by file.
"""

import errno
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa

from corpus_assets.core.consumption.export_croissant import (
    croissant_bytes,
    croissant_document,
    shard_name,
)
from corpus_assets.core.consumption.export_mds import copy_object, export_mds, materialize_mds
from corpus_assets.core.consumption.exports import export_megatron, record_megatron
from corpus_assets.core.consumption.training import TrainingReader
from corpus_assets.core.storage.artifacts import JSON, PARQUET, Ref, get_json, put_bytes, put_table
from corpus_assets.core.storage.cas import ContentStore

FORMATS = ("megatron", "mds", "croissant")


class ExportError(ValueError):
    """``--out`` cannot take the export (a file, or a folder this user cannot write)."""


def check_out_folder(directory: Path, command: str = "export") -> None:
    """Before the permit is taken and a block read (or a card drawn: ``command``): ``directory``,
    or its nearest existing parent, is a folder that takes new files. An existing file is never
    replaced."""
    if directory.exists() and not directory.is_dir():
        raise ExportError(f"{command} --out {directory}: not a folder (a file is there; kept)")
    existing = next(p for p in (directory, *directory.parents) if p.exists())
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "a file is on the way", str(existing))
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".writable-"):
            pass  # nothing is made before the permit: a refused export leaves no folder
    except OSError as error:
        raise ExportError(
            f"{command} --out {directory}: not a writable folder ({error.strerror})"
        ) from None


def export_snapshot(reader: TrainingReader, fmt: str, directory: Path) -> dict[str, Any]:
    """Export ``reader``'s snapshot as ``fmt`` into ``directory``; the export document's digest,
    its content, and what the run read."""
    pack = reader.pack_digest
    if fmt == "croissant":
        return export_croissant(reader, directory)
    if fmt == "megatron":
        exported = export_megatron(reader.cas, reader.block_reader, reader.tokenizer["vocabSize"])
        ref = record_megatron(reader.cas, exported, pack)
    elif fmt == "mds":
        exported, ref = export_mds(reader.cas, reader.block_reader, pack)
    else:
        raise ValueError(f"export format {fmt!r}: one of {', '.join(FORMATS)}")
    document = get_json(reader.cas, ref, f"{fmt} export")
    if fmt == "mds":
        materialize_mds(reader.cas, exported, directory)
    else:
        _copy_out(reader.cas, document["files"], directory)
    return {"export": ref["digest"], **document, "run": reader.report()}


def _copy_out(cas: ContentStore, files: list[dict[str, Any]], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for entry in files:
        copy_object(cas, entry["digest"], directory / entry["basename"], entry["basename"])


def members_table(reader: TrainingReader, members: pa.Table) -> Ref:
    """The members as one Parquet table in the store: the manifest's own table, or the
    concatenation of its parts (the same rows in part order), written as every table is."""
    entry = reader.manifest.members
    if entry.media == PARQUET:
        return entry.ref()
    return put_table(reader.cas, members)


def export_croissant(reader: TrainingReader, directory: Path) -> dict[str, Any]:
    """Copy the members, spans and shards out verified, and write ``croissant.json`` naming them
    (also put in the CAS: its digest names the export, as for the other formats)."""
    members, spans = reader.members(), reader.spans()  # both verified against their refs
    spans_ref, index = reader.packed.output("spans"), reader.block_reader.index  # notes shards
    members_ref = members_table(reader, members)
    document = croissant_document(
        reader.manifest, index, (members_ref, members.schema), (spans_ref, spans.schema)
    )
    data = croissant_bytes(document)
    ref = put_bytes(reader.cas, data, JSON)
    named = [("members.parquet", members_ref["digest"])]
    named += [("spans.parquet", spans_ref["digest"])]
    named += [(shard_name(n), entry.digest) for n, entry in enumerate(index.shards)]
    files = [{"basename": name, "digest": digest} for name, digest in named]
    _copy_out(reader.cas, files, directory)
    path = directory / "croissant.json"
    path.write_bytes(data)
    return {"export": ref["digest"], "croissant": str(path), "files": files, "run": reader.report()}
