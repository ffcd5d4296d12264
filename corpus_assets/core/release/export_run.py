"""Exports of a permitted snapshot for trainers that read other formats: Megatron or MDS.

An export is a training read: it needs the run's permit (``take_permit``), opens the snapshot
through ``TrainingReader`` (manifest, packed_blocks index and shard index verified), reads every
block chunk-verified, puts the export files and an export document (each file's digest and size)
in the CAS, and copies the files out through the CAS's verifying reader. The document's digest
names the export; a copy elsewhere is checkable file by file.
"""

from pathlib import Path
from typing import Any

from corpus_assets.core.release.export_mds import copy_object, export_mds, materialize_mds
from corpus_assets.core.release.exports import export_megatron, record_megatron
from corpus_assets.core.release.training import TrainingReader
from corpus_assets.core.storage.artifacts import get_json
from corpus_assets.core.storage.cas import ContentStore

FORMATS = ("megatron", "mds")


def export_snapshot(reader: TrainingReader, fmt: str, directory: Path) -> dict[str, Any]:
    """Export ``reader``'s snapshot as ``fmt`` into ``directory``; the export document's digest,
    its content, and what the run read."""
    pack = reader.pack_digest
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
