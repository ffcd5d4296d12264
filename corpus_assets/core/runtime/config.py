"""``corpus.yaml``: sources, policies, purpose and storage, validated strictly.

Every policy changes output bytes, so each is hashed into the manifest; a typo fails loudly.
"""

import os
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from corpus_assets.core.runtime.execution import Execution
from corpus_assets.core.runtime.row_policies import (
    ContaminationConfig,
    NearSignature,
    PiiConfig,
    QualityConfig,
)
from corpus_assets.core.runtime.row_policies import Strict as _Strict
from corpus_assets.core.runtime.schedule import Schedule
from corpus_assets.core.runtime.yaml_loader import load_config_yaml
from corpus_assets.core.storage.cas_s3 import parse_cas_url
from corpus_assets.core.storage.digests import DIGEST_RE, json_digest

SOURCE_ID_RE = r"^[a-z0-9][a-z0-9_-]{0,63}$"
DEFAULT_HOME = ".corpus"
URL_SCHEMES = ("file://", "http://", "https://")
SOURCE_KINDS = ("objects", "changelog")
CONFIG_NAME = "corpus.yaml"


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or invalid; the message names the key."""


# The declared adapters, named once; ``records.adapters`` implements exactly these.
AdapterName = Literal["jsonl-text.v1", "chat-messages.v1", "preference.v1", "debezium-row.v1"]


class _RecordFields(_Strict):
    """How a source's rows become typed records: the adapter, field names and governance."""

    adapter: AdapterName = "jsonl-text.v1"
    content: Literal["prose", "code"] = "prose"
    text_field: str = "text"
    group_field: str | None = None
    messages_field: str = "messages"
    prompt_field: str = "prompt"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    lang_field: str | None = None
    time_field: str | None = None
    licence: str | None = None
    purposes: list[str] | None = None
    retention: str | None = None


class ObjectsSource(_RecordFields):
    """Objects pinned by sha256 at freeze time: a local folder, listed URLs, or an index file.

    Exactly one of ``path`` (a folder, filtered by ``include``), ``urls`` (``file://``,
    ``http://`` or ``https://``) or ``index`` (a path or URL of a text file listing one object URL
    per line, relative URLs resolved against it) names the objects.
    """

    id: Annotated[str, Field(pattern=SOURCE_ID_RE)]
    kind: Literal["objects"]
    path: str | None = None
    urls: list[str] | None = None
    index: str | None = None
    include: list[str] = Field(
        default_factory=lambda: ["*.jsonl", "*.jsonl.zst", "*.jsonl.gz", "*.parquet"]
    )
    format: Literal["auto", "jsonl", "parquet"] = "auto"
    id_field: str = "id"

    @model_validator(mode="after")
    def _one_location(self) -> "ObjectsSource":
        given = [k for k in ("path", "urls", "index") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of path, urls, index (got {given or 'none'})")
        for url in self.urls or []:
            if not url.startswith(URL_SCHEMES):
                raise ValueError(f"url {url!r} must start with one of {', '.join(URL_SCHEMES)}")
        return self


class ChangelogSource(_RecordFields):
    """Append-only CDC segment files (Debezium-style events) folded to a table at a watermark."""

    id: Annotated[str, Field(pattern=SOURCE_ID_RE)]
    kind: Literal["changelog"]
    path: str
    include: list[str] = Field(default_factory=lambda: ["*.jsonl", "*.jsonl.zst", "*.jsonl.gz"])
    adapter: Literal["debezium-row.v1"] = "debezium-row.v1"
    key_field: str = "id"
    start_lsn: Annotated[int, Field(ge=0)] = 1

    @property
    def id_field(self) -> str:
        return self.key_field


Source = Annotated[ObjectsSource | ChangelogSource, Field(discriminator="kind")]


class Limits(_Strict):
    """Decompression bounds: a bomb stops with an error naming the object, not an OOM."""

    max_output_bytes: Annotated[int, Field(ge=1)] = 64 << 30
    max_ratio: Annotated[int, Field(ge=2)] = 1000


_Fraction = Annotated[Decimal, Field(gt=0, le=1, strict=False, allow_inf_nan=False)]


class NearDedupPolicy(_Strict):
    """MinHash/LSH near-dedup: every field changes which records survive, so all are hashed."""

    enabled: bool = True
    signature: NearSignature = "minhash.v3"
    num_perm: Annotated[int, Field(ge=8, le=1024)] = 128
    seed: Annotated[int, Field(ge=0)] = 1
    shingle_words: Annotated[int, Field(ge=1, le=64)] = 5
    shingle_chars: Annotated[int, Field(ge=1, le=64)] = 5
    bands: Annotated[int, Field(ge=1)] = 16
    rows: Annotated[int, Field(ge=1)] = 8
    # Decimals, not floats: hashed into the policy digest as their exact text ("0.8").
    threshold: _Fraction = Decimal("0.8")
    char_threshold: _Fraction | None = None  # v3: unspaced-script pairs' own (dedup/near_rule)
    bucket_heads: Annotated[int, Field(ge=1, le=4096)] = 32

    @model_validator(mode="after")
    def _bands_cover_signature(self) -> "NearDedupPolicy":
        if self.bands * self.rows != self.num_perm:
            raise ValueError(
                f"bands x rows = {self.bands} x {self.rows} = {self.bands * self.rows}, "
                f"but num_perm is {self.num_perm}; they must be equal"
            )
        if self.char_threshold is not None and self.signature != "minhash.v3":
            raise ValueError(f"char_threshold needs signature minhash.v3, not {self.signature}")
        if (self.char_threshold or self.threshold) < self.threshold:
            raise ValueError(f"char_threshold {self.char_threshold} is below threshold")
        return self


class DedupPolicy(_Strict):
    normalization: Literal["nfc-lf-rstrip"] = "nfc-lf-rstrip"
    near: NearDedupPolicy = NearDedupPolicy()


class SplitPolicy(_Strict):
    salt: Annotated[str, Field(min_length=1)] = "corpus-assets-v1"
    train_percent: Annotated[int, Field(ge=0, le=100)] = 80
    validation_percent: Annotated[int, Field(ge=0, le=100)] = 10
    test_percent: Annotated[int, Field(ge=0, le=100)] = 10
    on_conflict: Literal["quarantine_new", "move_smaller", "new_eval_version"] = "quarantine_new"
    # Records with event_time at or after the cutoff are held out in test; those within ``gap``
    # before it are excluded. Naive times are UTC.
    time_cutoff: Annotated[datetime, Field(strict=False)] | None = None
    gap: Annotated[timedelta, Field(strict=False, ge=timedelta(0))] = timedelta(0)

    @field_validator("time_cutoff")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return value.replace(tzinfo=UTC) if value and value.tzinfo is None else value

    @model_validator(mode="after")
    def _sums_to_100(self) -> "SplitPolicy":
        total = self.train_percent + self.validation_percent + self.test_percent
        if total != 100:
            raise ValueError(f"train/validation/test percents sum to {total}, not 100")
        if self.time_cutoff is not None and self.test_percent:
            raise ValueError(
                "time_cutoff holds out test by time: set test_percent: 0 "
                "(train_percent + validation_percent = 100)"
            )
        if self.time_cutoff is None and self.gap:
            raise ValueError("gap needs time_cutoff")
        return self


_Share = Annotated[Decimal, Field(gt=0, le=1, strict=False, allow_inf_nan=False)]


class SourceMixing(_Strict):
    """Per-source caps: at most ``max_epochs`` passes, at most ``max_fraction`` of the mix."""

    max_epochs: Annotated[int, Field(ge=1)] | None = None
    max_fraction: _Share | None = None


class MixingPolicy(_Strict):
    """How the train split becomes the training stream (see ``training_view.mixing.plan``).

    Shares and alpha are decimals (hashed as their exact text). ``budget`` counts ``unit``s; none
    means the train split's total. ``max_epochs`` is the default cap of every source.
    ``max_weight`` bounds the importance weight q_i / p_i: above it the build warns (it still
    builds; the report row says ``weight_over_bound``).
    """

    seed: Annotated[str, Field(min_length=1)] = "mix-v1"
    policy: Literal["natural", "ratios", "temperature", "unimax"] = "natural"
    alpha: Annotated[Decimal, Field(gt=0, le=1, strict=False, allow_inf_nan=False)] = Decimal("1")
    unit: Literal["documents", "tokens"] = "documents"
    ratios: dict[str, _Share] | None = None
    budget: Annotated[int, Field(ge=1)] | None = None
    max_epochs: Annotated[int, Field(ge=1)] | None = None
    # warn (log + report row) when a source's importance weight q_i / p_i exceeds this
    max_weight: Annotated[Decimal, Field(gt=0, strict=False, allow_inf_nan=False)] | None = None
    sources: dict[str, SourceMixing] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _policy_fields(self) -> "MixingPolicy":
        if (self.policy == "ratios") != (self.ratios is not None):
            raise ValueError("ratios are required by, and only allowed with, policy: ratios")
        if self.ratios is not None and sum(self.ratios.values()) != 1:
            raise ValueError(f"ratios sum to {sum(self.ratios.values())}, not 1")
        if self.alpha != 1 and self.policy != "temperature":
            raise ValueError(f"alpha {self.alpha} needs policy: temperature")
        if self.policy == "unimax" and (self.budget is None or self.max_epochs is None):
            raise ValueError("policy: unimax needs budget and max_epochs")
        return self

    def epochs_of(self, source: str) -> int | None:
        own = self.sources.get(source)
        return own.max_epochs if own and own.max_epochs is not None else self.max_epochs


# utf8-bytes-v1's special tokens: fixed names (and, in ``tokens.spec``, fixed ids).
UTF8_SPECIALS = {"eos": "<eos>", "pad": "<pad>", "bos": "<bos>"}


class TokenizerPolicy(_Strict):
    """The tokenizer mixing counts with and packing packs (``tokens.spec`` resolves it).

    ``utf8-bytes-v1`` needs no file (token = byte, fixed ``<eos>`` and ``<pad>``; ``bos: <bos>``
    prepends one). ``huggingface`` names a ``tokenizer.json`` by ``path`` (relative to this file)
    and/or by ``digest`` (a file already in the CAS); ``eos`` and ``pad`` are token strings of
    its vocabulary, ``bos`` is optional. Caches and the manifest name the file by digest only.
    """

    kind: Literal["utf8-bytes-v1", "huggingface"] = "utf8-bytes-v1"
    path: Annotated[str, Field(min_length=1)] | None = None
    digest: Annotated[str, Field(pattern=DIGEST_RE.pattern)] | None = None
    bos: Annotated[str, Field(min_length=1)] | None = None
    eos: Annotated[str, Field(min_length=1)] | None = None
    pad: Annotated[str, Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _fits_kind(self) -> "TokenizerPolicy":
        if self.kind == "utf8-bytes-v1":
            if self.path is not None or self.digest is not None:
                raise ValueError("utf8-bytes-v1 needs no file: drop path and digest")
            for name in ("bos", "eos", "pad"):
                value, fixed = getattr(self, name), UTF8_SPECIALS[name]
                if value is not None and value != fixed:
                    raise ValueError(f"utf8-bytes-v1's {name} token is {fixed!r}, not {value!r}")
            return self
        if self.path is None and self.digest is None:
            raise ValueError("a huggingface tokenizer needs a path (tokenizer.json) or a digest")
        if self.eos is None or self.pad is None:
            raise ValueError("a huggingface tokenizer needs eos and pad token strings")
        given = [t for t in (self.bos, self.eos, self.pad) if t is not None]
        if len(set(given)) != len(given):
            raise ValueError("bos, eos and pad must be different tokens")
        return self


class PackingPolicy(_Strict):
    """How samples become fixed-length blocks. ``mode`` ``atomic`` never splits
    a sample that fits (global best-fit-decreasing); ``overlong`` decides the rest; ``tail``
    applies to ``continuous`` only; blocks are ordered by a hash keyed with ``seed``."""

    block_tokens: Annotated[int, Field(ge=8, le=1 << 20)] = 2048
    mode: Literal["atomic", "next_fit", "continuous"] = "atomic"
    overlong: Literal["truncate", "split", "quarantine"] = "split"
    tail: Literal["drop", "pad"] = "pad"
    positions: Literal["per_segment"] = "per_segment"
    seed: Annotated[str, Field(min_length=1)] = "pack-v1"
    incremental: bool = True  # keep the parent's blocks (packing.incremental) unless the padding
    max_extra_padding: _Fraction = Decimal("0.001")  # added over a full repack exceeds this

    @model_validator(mode="before")
    @classmethod
    def _tokenizer_moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tokenizer" in data:
            moved = f"tokenizer moved to policies.tokenizer (kind: {data['tokenizer']}); "
            raise ValueError(moved + "remove it from policies.packing")
        return data


class ValidationPolicy(_Strict):
    """What the check replays (``records.canary``): the first ``canary_lines`` source lines of
    the first chunk of each source; null replays those chunks whole."""

    canary_lines: Annotated[int, Field(ge=1)] | None = 1024


class Policies(_Strict):
    quality: QualityConfig = QualityConfig()
    contamination: ContaminationConfig = ContaminationConfig()
    pii: PiiConfig = PiiConfig()
    dedup: DedupPolicy = DedupPolicy()
    splits: SplitPolicy = SplitPolicy()
    mixing: MixingPolicy = MixingPolicy()
    packing: PackingPolicy = PackingPolicy()
    tokenizer: TokenizerPolicy = TokenizerPolicy()
    validation: ValidationPolicy = ValidationPolicy()


class Storage(_Strict):
    """Where the data home is; ``cas_url`` (``s3://bucket/prefix``) keeps the CAS in an object
    store with ``<home>/cas`` as its verified read-through cache (``storage.cas_s3``)."""

    home: str | None = None
    catalog_url: str | None = None
    cas_url: str | None = None

    @field_validator("cas_url")
    @classmethod
    def _s3_url(cls, url: str | None) -> str | None:
        if url is not None:
            parse_cas_url(url)
        return url


class Retention(_Strict):
    """What ``corpus-assets gc`` may drop: absent keeps every snapshot, so gc never surprises."""

    keep_generations: Annotated[int, Field(ge=1)] | None = None  # the alias's last N activations


class Trust(_Strict):
    """The readers' trust root (``publication.trust_root``): its file and the key ids it accepts."""

    file: str | None = None
    keys: list[Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]] | None = None


class CorpusConfig(_Strict):
    version: Literal[1]
    purpose: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    alias: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")] = "train"
    sources: Annotated[list[Source], Field(min_length=1)]
    policies: Policies = Policies()
    limits: Limits = Limits()
    execution: Execution = Execution()
    storage: Storage = Storage()
    schedule: Schedule | None = None  # absent: the incremental_build schedule is off
    retention: Retention = Retention()
    trust: Trust = Trust()

    @model_validator(mode="after")
    def _unique_source_ids(self) -> "CorpusConfig":
        seen: set[str] = set()
        for source in self.sources:
            if source.id in seen:
                raise ValueError(f"source id {source.id!r} is used twice")
            seen.add(source.id)
        mixing = self.policies.mixing
        for name in [*(mixing.ratios or {}), *mixing.sources]:
            if name not in seen:
                raise ValueError(f"policies.mixing names unknown source {name!r}")
        return self

    def policy_digest(self, name: str) -> str:
        return json_digest(getattr(self.policies, name).model_dump(mode="json"))


class LoadedConfig(BaseModel):
    """A validated config plus where it came from (relative paths resolve against its folder)."""

    model_config = ConfigDict(frozen=True)

    config: CorpusConfig
    path: Path

    def resolve(self, location: str) -> Path:
        """A path from the config, relative to the config file's folder."""
        return (self.path.parent / os.path.expanduser(location)).resolve()

    def data_home(self) -> Path:
        """``storage.home`` resolved against the config's folder (the default home if unset)."""
        home = self.config.storage.home
        return (self.path.parent / home).resolve() if home else default_home()


def default_home() -> Path:
    return Path(os.environ.get("CORPUS_HOME", DEFAULT_HOME)).resolve()


def config_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``--config`` beats ``CORPUS_CONFIG`` beats ``$CORPUS_HOME/corpus.yaml``."""
    if explicit:
        return Path(explicit).resolve()
    if os.environ.get("CORPUS_CONFIG"):
        return Path(os.environ["CORPUS_CONFIG"]).resolve()
    return default_home() / CONFIG_NAME


def parse_config(raw: Any, where: str) -> CorpusConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping at the top level")
    try:
        return CorpusConfig.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        key = _key_path(first["loc"])
        if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            key += ".kind"
        problem = re.sub(r"^Value error, ", "", first["msg"])
        more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
        raise ConfigError(f"{where}: {key}: {problem}{more}") from None


def _key_path(loc: tuple[int | str, ...]) -> str:
    """``sources[0].colour`` from pydantic's location, minus the union tag it inserts."""
    parts: list[str] = []
    for n, part in enumerate(loc):
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif not (n and isinstance(loc[n - 1], int) and part in SOURCE_KINDS):
            parts.append(f".{part}")
    return "".join(parts).lstrip(".") or "(top level)"


def load_config(explicit: str | os.PathLike[str] | None = None) -> LoadedConfig:
    path = config_path(explicit)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: config file not found (pass --config, set CORPUS_CONFIG, "
            f"or run `corpus-assets demo` to write one)"
        ) from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 (byte {error.start}: {error.reason})") from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read config file: {error.strerror}") from None
    try:
        raw = load_config_yaml(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    return LoadedConfig(config=parse_config(raw, str(path)), path=path)
