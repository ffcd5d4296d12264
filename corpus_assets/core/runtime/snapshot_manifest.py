"""The ``training.dataset.snapshot.v1`` manifest as a typed model: the one way code reads one.

It lives in runtime, beside ``LayerIndex``, because stages below release read a parent's
manifest too (splits, the dedup pair cache, incremental packing, the deletion index, lineage);
``release/manifest`` writes it and ``corpus_assets/schemas`` holds its JSON Schema, which
``test_manifest_model`` keeps equal to this model field for field.

Unknown keys are kept on read and refused on write. A manifest is signed and content-addressed,
so a reader must take one written by older or newer code and give back exactly what it read
(``document()`` of a loaded model is the stored document, key for key, and hashes to the same
snapshotId): dropping or rejecting a key would change or hide the bytes that were signed.
Whether a key is allowed is the schema's question, and verify answers it on the stored bytes.
A writer builds through ``Manifest.new``, which refuses any key the model does not name, so new
code cannot add a field without adding it to the model (and so, by the test, to the schema).
Values are strict, never coerced (``"3"`` is not read as 3): what is read is what was hashed.
Fields an older manifest may lack are optional, and an absent field stays absent on output.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corpus_assets.core.storage.artifacts import PARQUET, Ref, get_json
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.cas_queries import VerifiedFiles

MANIFEST_SCHEMA = "training.dataset.snapshot.v1"


class ManifestError(ValueError):
    """A stored manifest does not have the shape of the model (verify names what is wrong)."""


class _Part(BaseModel):
    """A part of a manifest: read as stored, extra keys kept, values never coerced."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, populate_by_name=True)

    def document(self) -> dict[str, Any]:
        """The part as JSON, exactly the keys it was read or built with."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class SourceVersion(_Part):
    """A source as frozen: object versions (``objects``) or a folded change log (``changelog``)."""

    id: str
    kind: str
    objects: str | None = None  # decimal: how many objects were pinned
    object_versions: str | None = Field(None, alias="objectVersions")
    table_snapshot: str | None = Field(None, alias="tableSnapshot")
    cdc_high_watermark: str | None = Field(None, alias="cdcHighWatermark")


class SpecialToken(_Part):
    token: str
    id: int


class SpecialTokens(_Part):
    bos: SpecialToken | None = None
    eos: SpecialToken
    pad: SpecialToken


class TokenizerEntry(_Part):
    """The tokenizer the blocks were packed with, by digest (``file`` for a tokenizer.json)."""

    schema_name: str = Field(alias="schema")
    kind: str
    digest: str
    file: Ref | None = None
    vocab_size: int = Field(alias="vocabSize")
    dtype: str
    special_tokens: SpecialTokens = Field(alias="specialTokens")


class PackingEntry(_Part):
    """How packed_blocks packed: incremental or full, why, and the parent's packed layer."""

    mode: str
    reason: str
    parent: str | None


class MixtureRow(_Part):
    """One source's row of the mixed_samples report (shares are decimal strings)."""

    source: str
    weight: str | None = None
    target_share: str | None = None
    doc_share: str | None = None
    token_share: str | None = None
    population_docs: int | None = None
    population_tokens: int | None = None
    selected_docs: int | None = None
    selected_tokens: int | None = None
    epochs_used: int | None = None
    max_epochs: int | None = None
    cap_hit: bool | None = None
    weight_over_bound: bool | None = None


class BenchmarkContamination(_Part):
    benchmark: str
    items: int
    short_items: int
    checked_whole: int
    unchecked: int
    flagged: int


class FlaggedRecords(_Part):
    benchmark: str
    source: str
    records: int


class ContaminationEntry(_Part):
    """The canonical_records decontamination report: per benchmark, and flagged per source."""

    policy: str
    benchmarks: list[BenchmarkContamination]
    flagged: list[FlaggedRecords]


MEMBER_PARTS_SCHEMA = "corpus.members-parts.v1"
CLUSTER_PARTS_SCHEMA = "corpus.clusters-parts.v1"
PARTS_SCHEMAS = (MEMBER_PARTS_SCHEMA, CLUSTER_PARTS_SCHEMA)  # the chunk-parts documents


class _CountedTable(_Part):
    """A table by ref (digest, media, size) and its row count."""

    digest: str
    media: str
    size: int
    count: int

    def ref(self) -> Ref:
        return {"digest": self.digest, "media": self.media, "size": self.size}


class ChunkPart(_CountedTable):
    """One canonical chunk's rows of a table stored as parts (members, dedup clusters), each
    sorted by record id: the chunk's key, the digest of its records table (what the part's rows
    are read from) and the part's Parquet file."""

    chunk: str
    records: str


class ChunkParts(_Part):
    """A table as parts, one per canonical chunk (empty for a chunk without rows), in the
    canonical index's chunk order; ``schema`` names the table (``PARTS_SCHEMAS``); ``code``:
    what wrote them (a child reuses a parent's part only if the same code wrote it)."""

    schema_: str = Field(alias="schema")
    code: str
    count: int
    parts: list[ChunkPart]


class MembersEntry(_CountedTable):
    """The members table by ref, its ``cas://`` URI and its row count. The ref names a
    ``ChunkParts`` document (JSON), or, in manifests written before parts, the
    one Parquet table itself."""

    uri: str

    def part_refs(self, cas: ContentStore) -> list[Ref]:
        """The Parquet tables that together hold the members, each read verified."""
        if self.media == PARQUET:
            return [self.ref()]
        return [part.ref() for part in self.parts(cas).parts]

    def paths(self, files: VerifiedFiles, what: str = "members table") -> list[str]:
        """The parts' local files, each re-hashed (or trusted) by ``files``, in order."""
        return files.paths([ref["digest"] for ref in self.part_refs(files.cas)], what)

    def parts(self, cas: ContentStore) -> ChunkParts:
        """The parts document (verified against the digest the signed manifest names)."""
        if self.media == PARQUET:
            raise ManifestError(f"members {self.digest}: media {self.media} names no parts")
        try:
            return ChunkParts.model_validate(get_json(cas, self.ref(), "members parts"))
        except ValidationError as error:
            raise ManifestError(f"members parts {self.digest}: {error}") from error


class Counts(_Part):
    """The headline counts; the last four are absent from manifests written before them."""

    records: int
    quarantined: int
    duplicates_removed: int
    members: int
    train: int
    validation: int
    test: int
    blocks: int
    tokens: int
    dead_letters: int | None = None
    duplicate_ids: int | None = None
    id_conflicts: int | None = None
    tombstoned: int | None = None


class DsseSignature(_Part):
    keyid: str
    sig: str


class DsseEnvelope(_Part):
    """DSSE envelope over an in-toto Statement v1 whose subject is the snapshotId."""

    payload: str
    payload_type: str = Field(alias="payloadType")
    signatures: list[DsseSignature]


class Manifest(_Part):
    """The snapshot manifest. ``snapshot_id`` is sha256 of the RFC 8785 form of ``document()``
    without ``snapshotId`` and ``signature`` (``release/identity``)."""

    schema_name: str = Field(alias="schema")
    build_id: str = Field(alias="buildId")
    partition: str
    parents: list[str]
    purpose: str
    alias: str
    freeze: Ref
    sources: list[SourceVersion]
    tombstone_watermark: str = Field(alias="tombstoneWatermark")  # decimal string
    benchmark_fence: str = Field(alias="benchmarkFence")  # decimal string
    record_schema: str = Field(alias="recordSchema")
    selection_policy: str = Field(alias="selectionPolicy")
    split_policy: str = Field(alias="splitPolicy")
    mixing_policy: str = Field(alias="mixingPolicy")
    packing_policy: str = Field(alias="packingPolicy")
    transform_image: str = Field(alias="transformImage")
    transform: dict[str, str]  # layer -> code identity
    layers: dict[str, Ref]  # layer -> index ref
    tokenizer: TokenizerEntry
    packing: PackingEntry | None = None
    mixture: list[MixtureRow]
    contamination: ContaminationEntry | None = None
    members: MembersEntry
    counts: Counts
    snapshot_id: str = Field(alias="snapshotId")
    signature: DsseEnvelope

    @classmethod
    def read(cls, document: Any, what: str = "manifest") -> "Manifest":
        """A stored document as the model; ``ManifestError`` names what does not fit."""
        try:
            return cls.model_validate(document)
        except ValidationError as error:
            raise ManifestError(f"{what} is malformed: {error}") from None

    @classmethod
    def new(cls, document: dict[str, Any]) -> "Manifest":
        """A manifest being written: every key must be one the model names, at every depth."""
        manifest = cls.model_validate(document)
        unknown = _unknown_keys(manifest, "")
        if unknown:
            raise ManifestError(f"manifest fields the model does not name: {', '.join(unknown)}")
        return manifest

    @property
    def tombstone_seq(self) -> int:
        return int(self.tombstone_watermark)

    @property
    def benchmark_seq(self) -> int:
        return int(self.benchmark_fence)

    def policies(self) -> dict[str, str]:
        """The policy digests by short name (``selection``, ``split``, ``mixing``, ``packing``)."""
        return {
            "mixing": self.mixing_policy,
            "packing": self.packing_policy,
            "selection": self.selection_policy,
            "split": self.split_policy,
        }


def _unknown_keys(part: BaseModel, where: str) -> list[str]:
    """Every extra key of ``part`` and of the parts inside it, as dotted paths."""
    found = [f"{where}{key}" for key in part.model_extra or {}]
    for name in type(part).model_fields:
        values = getattr(part, name)
        if not isinstance(values, list):
            values = [values]
        for value in values:
            if isinstance(value, BaseModel):
                found += _unknown_keys(value, f"{where}{name}.")
    return found


def read_manifest(cas: ContentStore, digest: str, what: str = "manifest") -> Manifest:
    """The manifest stored under ``digest``, re-hashed by the CAS on read, as the model."""
    return Manifest.read(get_json(cas, digest, what), f"{what} {digest}")
