"""``corpus.yaml``: sources, policies, purpose and storage, validated strictly.

Every policy here changes output bytes, so each policy section is hashed into the manifest; a typo
must fail loudly (unknown keys are errors) instead of silently falling back to a default.
"""

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from corpus_assets.core.digests import json_digest

SOURCE_ID_RE = r"^[a-z0-9][a-z0-9_-]{0,63}$"
DEFAULT_HOME = ".corpus"
CONFIG_NAME = "corpus.yaml"


class ConfigError(ValueError):
    """The configuration file is missing, unreadable or invalid; the message names the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ObjectsSource(_Strict):
    """A folder of JSONL / JSONL.zst objects, pinned by sha256 at freeze time."""

    id: Annotated[str, Field(pattern=SOURCE_ID_RE)]
    kind: Literal["objects"]
    path: str
    include: list[str] = Field(default_factory=lambda: ["*.jsonl", "*.jsonl.zst"])
    text_field: str = "text"
    id_field: str = "id"
    group_field: str | None = None


class DedupPolicy(_Strict):
    normalization: Literal["nfc-lf-rstrip"] = "nfc-lf-rstrip"


class SplitPolicy(_Strict):
    salt: Annotated[str, Field(min_length=1)] = "corpus-assets-v1"
    train_percent: Annotated[int, Field(ge=0, le=100)] = 80
    validation_percent: Annotated[int, Field(ge=0, le=100)] = 10
    test_percent: Annotated[int, Field(ge=0, le=100)] = 10

    @model_validator(mode="after")
    def _sums_to_100(self) -> "SplitPolicy":
        total = self.train_percent + self.validation_percent + self.test_percent
        if total != 100:
            raise ValueError(f"train/validation/test percents sum to {total}, not 100")
        return self


class MixingPolicy(_Strict):
    seed: Annotated[str, Field(min_length=1)] = "mix-v1"
    alpha: Literal["1"] = "1"
    unit: Literal["documents"] = "documents"


class PackingPolicy(_Strict):
    tokenizer: Literal["utf8-bytes-v1"] = "utf8-bytes-v1"
    block_tokens: Annotated[int, Field(ge=8, le=1 << 20)] = 2048
    overlong: Literal["split"] = "split"
    tail: Literal["pad"] = "pad"


class Policies(_Strict):
    dedup: DedupPolicy = DedupPolicy()
    splits: SplitPolicy = SplitPolicy()
    mixing: MixingPolicy = MixingPolicy()
    packing: PackingPolicy = PackingPolicy()


class Storage(_Strict):
    home: str | None = None
    catalog_url: str | None = None


class CorpusConfig(_Strict):
    version: Literal[1]
    purpose: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    alias: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")] = "train"
    sources: Annotated[list[ObjectsSource], Field(min_length=1)]
    policies: Policies = Policies()
    storage: Storage = Storage()

    @model_validator(mode="after")
    def _unique_source_ids(self) -> "CorpusConfig":
        seen: set[str] = set()
        for source in self.sources:
            if source.id in seen:
                raise ValueError(f"source id {source.id!r} is used twice")
            seen.add(source.id)
        return self

    def policy_digest(self, name: str) -> str:
        return json_digest(getattr(self.policies, name).model_dump(mode="json"))


class LoadedConfig(BaseModel):
    """A validated config plus where it came from (relative paths resolve against its folder)."""

    model_config = ConfigDict(frozen=True)

    config: CorpusConfig
    path: Path

    def source_path(self, source: ObjectsSource) -> Path:
        return (self.path.parent / os.path.expanduser(source.path)).resolve()


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses repeated mapping keys instead of silently keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


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
        key = (
            "".join(
                f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"]
            ).lstrip(".")
            or "(top level)"
        )
        problem = re.sub(r"^Value error, ", "", first["msg"])
        more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
        raise ConfigError(f"{where}: {key}: {problem}{more}") from None


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
        raw = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    return LoadedConfig(config=parse_config(raw, str(path)), path=path)
