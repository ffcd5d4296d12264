"""Croissant (MLCommons, JSON-LD 1.0) metadata for a snapshot, so catalogues and loaders that read
Croissant find its files, digests and record schemas without knowing this project.

The export directory is self-contained: ``croissant.json`` plus the files it names, each copied out
of the CAS through the verifying reader (``members.parquet``, ``spans.parquet``, one
``shard-NNNNN.bin`` per packed shard). ``contentUrl`` is relative to that directory (a CAS path
would not travel, and an object-store CAS has none); ``sha256`` is the CAS digest's hex, so a copy
is checkable with any sha256 tool. Built as plain dicts (no mlcroissant import here); the bytes are
a function of the snapshot: sorted keys, no dates, nothing from the machine.
"""

import json
from typing import Any

import pyarrow as pa

from corpus_assets.core.runtime.snapshot_manifest import Manifest
from corpus_assets.core.storage.shards import ShardIndex

CROISSANT_SPEC = "http://mlcommons.org/croissant/1.0"
PARQUET_MEDIA = "application/x-parquet"  # what Croissant loaders (mlcroissant) read as parquet
SHARD_MEDIA = "application/octet-stream"
UNSPECIFIED = "unspecified: the snapshot's manifest and configuration declare no license"
CONTEXT = {
    "@language": "en",
    "@vocab": "https://schema.org/",
    "citeAs": "cr:citeAs",
    "column": "cr:column",
    "conformsTo": "dct:conformsTo",
    "cr": "http://mlcommons.org/croissant/",
    "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"},
    "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/",
    "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"},
    "extract": "cr:extract",
    "field": "cr:field",
    "fileProperty": "cr:fileProperty",
    "fileObject": "cr:fileObject",
    "fileSet": "cr:fileSet",
    "format": "cr:format",
    "includes": "cr:includes",
    "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath",
    "key": "cr:key",
    "md5": "cr:md5",
    "parentField": "cr:parentField",
    "path": "cr:path",
    "recordSet": "cr:recordSet",
    "references": "cr:references",
    "regex": "cr:regex",
    "repeated": "cr:repeated",
    "replace": "cr:replace",
    "samplingRate": "cr:samplingRate",
    "sc": "https://schema.org/",
    "separator": "cr:separator",
    "source": "cr:source",
    "subField": "cr:subField",
    "transform": "cr:transform",
}
SHARD_FIELDS = (
    ("shard", "sc:Integer", "position of the shard in the pack"),
    ("content_url", "sc:Text", "the shard's file, relative to this document"),
    ("first_block", "sc:Integer", "index of the shard's first block in the pack"),
    ("blocks", "sc:Integer", "blocks held by the shard"),
    ("bytes", "sc:Integer", "the shard's size in bytes"),
    ("sha256", "sc:Text", "hex sha256 of the shard's bytes"),
)


def croissant_type(dtype: pa.DataType) -> str:
    """The Croissant dataType of an arrow column; an unmapped type is refused, never guessed."""
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "sc:Text"
    if pa.types.is_integer(dtype):
        return "sc:Integer"
    if pa.types.is_floating(dtype):
        return "sc:Float"
    if pa.types.is_boolean(dtype):
        return "sc:Boolean"
    raise ValueError(f"croissant export: no Croissant dataType for arrow type {dtype}")


def sha256_hex(digest: str) -> str:
    """The hex of a ``sha256:<hex>`` CAS digest, which Croissant's ``sha256`` property holds."""
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != "sha256" or len(hexdigest) != 64:
        raise ValueError(f"croissant export: {digest!r} is not a sha256:<hex> digest")
    return hexdigest


def shard_name(position: int) -> str:
    return f"shard-{position:05d}.bin"


def file_object(name: str, digest: str, size: int, media: str, what: str) -> dict[str, Any]:
    return {
        "@type": "cr:FileObject",
        "@id": name,
        "name": name,
        "description": what,
        "contentUrl": name,
        "contentSize": f"{size} B",
        "encodingFormat": media,
        "sha256": sha256_hex(digest),
    }


def table_record_set(name: str, file: str, schema: pa.Schema, what: str) -> dict[str, Any]:
    """A record set read from a parquet FileObject, one field per column."""
    fields = [
        {
            "@type": "cr:Field",
            "@id": f"{name}/{column.name}",
            "name": column.name,
            "dataType": croissant_type(column.type),
            "source": {"fileObject": {"@id": file}, "extract": {"column": column.name}},
        }
        for column in schema
    ]
    return {
        "@type": "cr:RecordSet",
        "@id": name,
        "name": name,
        "description": what,
        "field": fields,
    }


def shards_record_set(index: ShardIndex) -> dict[str, Any]:
    """One inline record per packed shard: where it is, which blocks it holds, its digest."""
    layout = ", ".join(f"{field.name} ({field.dtype})" for field in index.fields)
    fields = [
        {
            "@type": "cr:Field",
            "@id": f"packed_shards/{n}",
            "name": n,
            "dataType": t,
            "description": d,
        }
        for n, t, d in SHARD_FIELDS
    ]
    data = [
        {
            "packed_shards/shard": position,
            "packed_shards/content_url": shard_name(position),
            "packed_shards/first_block": entry.first_block,
            "packed_shards/blocks": entry.blocks,
            "packed_shards/bytes": entry.size,
            "packed_shards/sha256": sha256_hex(entry.digest),
        }
        for position, entry in enumerate(index.shards)
    ]
    what = (
        f"{index.format} shards: each holds its blocks of {index.block_tokens} tokens as one "
        f"little-endian array per field, in order: {layout}"
    )
    return {
        "@type": "cr:RecordSet",
        "@id": "packed_shards",
        "name": "packed_shards",
        "description": what,
        "field": fields,
        "data": data,
    }


def croissant_document(
    manifest: Manifest,
    index: ShardIndex,
    members_file: tuple[dict[str, Any], pa.Schema],
    spans: tuple[dict[str, Any], pa.Schema],
) -> dict[str, Any]:
    """The Croissant Dataset of a snapshot: its files, by digest, and three record sets.
    ``members_file``: the members as one table (``members_table``) and its schema."""
    sid, counts = manifest.snapshot_id, manifest.counts
    spans_ref, spans_schema = spans
    members_ref, members = members_file
    files = [
        file_object(
            "members.parquet",
            members_ref["digest"],
            members_ref["size"],
            PARQUET_MEDIA,
            "the members table: one row per record in the snapshot",
        ),
        file_object(
            "spans.parquet",
            spans_ref["digest"],
            spans_ref["size"],
            PARQUET_MEDIA,
            "which record's bytes each packed block holds",
        ),
        *(
            file_object(shard_name(n), e.digest, e.size, SHARD_MEDIA, f"packed shard {n}")
            for n, e in enumerate(index.shards)
        ),
    ]
    return {
        "@context": CONTEXT,
        "@type": "sc:Dataset",
        "conformsTo": CROISSANT_SPEC,
        "name": f"corpus-assets-{manifest.partition}",
        "description": (
            f"corpus-assets training snapshot {sid} (partition {manifest.partition}, purpose "
            f"{manifest.purpose}): {counts.members} members packed into {counts.blocks} "
            f"blocks, {counts.tokens} tokens. Manifest schema {manifest.schema_name}."
        ),
        "citeAs": f"corpus-assets snapshot {sid}",
        "license": UNSPECIFIED,  # the manifest names no licence: the sources each may
        "url": f"urn:corpus-assets:snapshot:{sid}",
        "version": sid,
        "distribution": files,
        "recordSet": [
            table_record_set("members", "members.parquet", members, "one record per member"),
            table_record_set(
                "block_spans", "spans.parquet", spans_schema, "record spans per block"
            ),
            shards_record_set(index),
        ],
    }


def croissant_bytes(document: dict[str, Any]) -> bytes:
    """Sorted keys, fixed separators, one trailing newline: same snapshot, same bytes."""
    return (json.dumps(document, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()
