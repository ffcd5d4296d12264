"""The freeze spec (``corpus.freeze.v1``) as a typed model instead of a dict read by string keys.

Its canonical JSON digest is the freeze every later layer and the manifest name, so the model
must write exactly the document the freeze wrote: camelCase member names, offsets (which can pass
2**53) as decimal strings, optional members omitted rather than null. Parsing a stored spec is
strict - unknown members, nulls, wrong types and non-canonical decimals are refused naming the
member - so ``FreezeSpec.parse(document).to_document() == document`` for every accepted document.
"""

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    Strict,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic.alias_generators import to_camel

from corpus_assets.core.storage.artifacts import Ref, get_json
from corpus_assets.core.storage.cas import ContentStore
from corpus_assets.core.storage.digests import check_digest

FREEZE_SCHEMA = "corpus.freeze.v1"
_DOCUMENT = "freeze_spec_document"  # validation context key: the input is a stored document
_CANONICAL_DECIMAL = re.compile(r"0|[1-9][0-9]*")


class FreezeSpecError(ValueError):
    """A freeze spec document does not match ``corpus.freeze.v1``; the message names the member."""


def _from_document(info: ValidationInfo) -> bool:
    return isinstance(info.context, dict) and info.context.get(_DOCUMENT) is True


def _decimal(value: Any, info: ValidationInfo) -> Any:
    """Documents hold offsets as canonical decimal strings; Python code passes ints."""
    if not _from_document(info):
        return value
    if isinstance(value, str) and _CANONICAL_DECIMAL.fullmatch(value):
        return int(value)
    raise ValueError(f"{value!r} is not a decimal string (digits, no leading zeros)")


# An offset: a non-negative int in Python, a decimal string in the document.
Offset = Annotated[
    int, BeforeValidator(_decimal), Field(ge=0), PlainSerializer(str, return_type=str)
]
Digest = Annotated[str, AfterValidator(check_digest)]
Gap = Annotated[tuple[Offset, Offset], Strict(False)]  # a JSON array, so lax about the container


def _omitted(value: object) -> bool:
    return value is None


class _Member(BaseModel):
    """Shared rules: camelCase member names, no unknown or null members, immutable."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="forbid",
        strict=True,
        frozen=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _no_null_members(cls, data: Any, info: ValidationInfo) -> Any:
        if _from_document(info) and isinstance(data, Mapping):
            nulls = sorted(str(name) for name, value in data.items() if value is None)
            if nulls:
                raise ValueError(f"members {nulls} are null; a freeze spec has no null members")
        return data


class PinnedObject(_Member):
    """One object pinned by the sha256 of its bytes (for a changelog: the folded state)."""

    name: str
    sha256: Digest
    size: int = Field(ge=0)
    format: Literal["jsonl", "parquet"]
    etag: str | None = Field(default=None, exclude_if=_omitted)
    last_modified: str | None = Field(default=None, exclude_if=_omitted)
    rows: int | None = Field(default=None, ge=0, exclude_if=_omitted)  # changelog state only


class DeferredChange(_Member):
    """A change seen during the scan that belongs to the next snapshot; the pinned version wins."""

    name: str
    change: Literal["added", "removed", "changed"]
    pinned: bool


class PinnedIndex(_Member):
    """The index file an ``index`` source was listed from, as read at the freeze."""

    location: str
    digest: Digest
    media: str
    size: int = Field(ge=0)


class FrozenSegment(_Member):
    """A changelog segment as far as the fold read it: the sha256 of exactly ``size`` bytes;
    ``pending_bytes`` after them were an unterminated line, left for the next snapshot."""

    name: str
    sha256: Digest
    size: int = Field(ge=0)
    pending_bytes: int | None = Field(default=None, ge=1, exclude_if=_omitted)


class ObjectsSourceSpec(_Member):
    """An ``objects`` source: what was pinned, and what changed during the scan."""

    id: str
    kind: Literal["objects"]
    objects: list[PinnedObject]
    deferred: list[DeferredChange]
    index: PinnedIndex | None = Field(default=None, exclude_if=_omitted)


class ChangelogSourceSpec(_Member):
    """A ``changelog`` source folded up to ``watermark``; gaps make the freeze incomplete."""

    id: str
    kind: Literal["changelog"]
    watermark: Offset
    start_lsn: Offset
    events: int = Field(ge=0)
    events_digest: Digest
    after_watermark: int = Field(ge=0)
    gaps: list[Gap]
    segments: list[FrozenSegment]
    objects: list[PinnedObject]


SourceSpec = Annotated[ObjectsSourceSpec | ChangelogSourceSpec, Field(discriminator="kind")]


class FrozenConfig(_Member):
    """The config the freeze ran under: source entries as configured, policy digests by name."""

    sources: list[dict[str, Any]]  # each ``SourceConfig.model_dump(mode="json")``, kept verbatim
    policies: dict[str, Digest]


class FreezeSpec(_Member):
    """The consistent boundary a partition names: fences first, then every pinned source.

    Built in Python with offsets as ints; a stored document is read with ``parse`` or ``load``
    (plain ``model_validate`` expects the Python form and refuses the document's decimal strings).
    """

    schema_id: Literal["corpus.freeze.v1"] = Field(alias="schema")
    partition: str
    alias: str
    purpose: str
    tombstone_watermark: Offset
    benchmark_fence: Offset
    parents: list[str]
    sources: list[SourceSpec]
    incomplete: list[str]  # why the sources gave no consistent boundary; empty when they did
    config: FrozenConfig

    @classmethod
    def parse(cls, document: Mapping[str, Any], what: str = "freeze spec") -> Self:
        """The typed spec of a stored document, or ``FreezeSpecError`` naming the bad member."""
        try:
            return cls.model_validate(document, context={_DOCUMENT: True})
        except ValidationError as error:
            problems = "; ".join(
                f"{_member_path(problem['loc'])}: {problem['msg']}" for problem in error.errors()
            )
            raise FreezeSpecError(f"{what}: {problems}") from None

    @classmethod
    def load(cls, cas: ContentStore, ref: Ref | str, what: str = "freeze spec") -> Self:
        """The verified spec stored under ``ref``."""
        digest = ref if isinstance(ref, str) else ref["digest"]
        return cls.parse(get_json(cas, digest, what), f"{what} {digest}")

    def document(self) -> dict[str, Any]:
        """The JSON document, exactly as written at the freeze (``put_json`` it to store it)."""
        return self.model_dump(mode="json")

    def pinned(self) -> list[tuple[str, PinnedObject]]:
        """(source id, object) of every pinned object, in source then listing order."""
        return [(source.id, entry) for source in self.sources for entry in source.objects]


def _member_path(loc: tuple[int | str, ...]) -> str:
    """``sources[0].objects[1].sha256`` from a pydantic location (minus the union's tag)."""
    path = ""
    for position, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        elif position == 2 and loc[0] == "sources":
            continue  # the discriminated union puts the source kind here
        else:
            path += f".{part}" if path else str(part)
    return path or "document"
