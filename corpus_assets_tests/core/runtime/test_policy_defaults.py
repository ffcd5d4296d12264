"""A core policy's defaults are its ``corpus.yaml`` section's: the two never drift apart.

Core dataclasses take their defaults from the config models; this holds every pair equal, field
by field, so a literal typed into either side that differs from the other fails here.
"""

import dataclasses
from decimal import Decimal
from typing import Any

import pytest
from pydantic import BaseModel

from corpus_assets.core.dedup.minhash import SignatureSpec
from corpus_assets.core.dedup.near_dedup import LshParams
from corpus_assets.core.ingest.codecs import DecompressionLimits
from corpus_assets.core.records.canonicalize import Stages
from corpus_assets.core.records.contamination import TokenPolicy
from corpus_assets.core.records.quality import QualityPolicy
from corpus_assets.core.runtime.config import Limits, NearDedupPolicy
from corpus_assets.core.runtime.execution import Execution
from corpus_assets.core.runtime.row_policies import ContaminationConfig, PiiConfig, QualityConfig
from corpus_assets.core.runtime.runners import RayRunner

# (core class, config model, core field -> config field for names that differ); every field
# the two share by name is compared as well. ``version`` names the engine a core class is,
# not a default a config chooses.
PAIRS: list[tuple[type, type[BaseModel], dict[str, str]]] = [
    (QualityPolicy, QualityConfig, {}),
    (TokenPolicy, ContaminationConfig, {}),
    (SignatureSpec, NearDedupPolicy, {"version": "signature"}),
    (LshParams, NearDedupPolicy, {}),
    (DecompressionLimits, Limits, {}),
    (Stages, PiiConfig, {"redact_pii": "redact"}),
    (RayRunner, Execution, {"memory_mb": "worker_memory_mb"}),
]
NOT_DEFAULTS = {"version"}  # the engine a class is (contamination v1 or v2), not a setting


def _core_defaults(cls: type) -> dict[str, Any]:
    return {
        f.name: f.default
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING and f.name not in NOT_DEFAULTS
    }


def _same(core: Any, config: Any) -> bool:
    """Equal as values: a config fraction (``Decimal``) is the float the core compares with."""
    if isinstance(config, Decimal):
        return float(config) == core
    return type(core) is type(config) and core == config


@pytest.mark.parametrize(
    ("core", "config", "renamed"), PAIRS, ids=[c.__name__ for c, _m, _r in PAIRS]
)
def test_every_core_default_is_the_config_default(
    core: type, config: type[BaseModel], renamed: dict[str, str]
) -> None:
    fields = config.model_fields
    defaults = _core_defaults(core)
    if "version" in renamed:
        defaults["version"] = dataclasses.fields(core)[0].default
    pairs = {name: renamed.get(name, name) for name in defaults}
    compared = {n: c for n, c in pairs.items() if c in fields}
    assert compared, f"{core.__name__} shares no default with {config.__name__}"
    differing = {
        name: (defaults[name], fields[other].default)
        for name, other in compared.items()
        if not _same(defaults[name], fields[other].default)
    }
    assert differing == {}, f"{core.__name__} vs {config.__name__}: {differing}"


def test_the_comparison_sees_a_drift() -> None:
    """A core class whose default differs from the config's is named (the test is live)."""

    @dataclasses.dataclass(frozen=True)
    class Drifted:
        max_symbol_ratio_ppm: int = 500_000

    fields = QualityConfig.model_fields
    assert not _same(
        _core_defaults(Drifted)["max_symbol_ratio_ppm"], fields["max_symbol_ratio_ppm"].default
    )
