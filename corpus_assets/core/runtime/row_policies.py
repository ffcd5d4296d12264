"""The row stages' policies in ``corpus.yaml`` (quality, contamination, PII), and the strict base
every config model shares: unknown keys are errors, values are not coerced, models are frozen."""

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


MAX_CHARS_LIMIT = 16_000_000


class QualityConfig(Strict):
    """Heuristic quality thresholds; ratios in parts per million so hashed policies carry no
    floats. Defaults keep everything a sane parser produces."""

    min_chars: Annotated[int, Field(ge=0)] = 1
    # bounded: one record at the limit costs up to ~23x its UTF-8 size in its worker while the
    # row stages run (the v2 benchmark screen, windowed, ~15 MB; v1 ~42x): max_chars_memory.py
    max_chars: Annotated[int, Field(ge=1, le=MAX_CHARS_LIMIT)] = 1_000_000
    max_symbol_ratio_ppm: Annotated[int, Field(ge=0, le=1_000_000)] = 1_000_000
    min_alpha_ratio_ppm: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    max_repeated_line_ratio_ppm: Annotated[int, Field(ge=0, le=1_000_000)] = 1_000_000
    max_repeated_ngram_ratio_ppm: Annotated[int, Field(ge=0, le=1_000_000)] = 1_000_000
    ngram: Annotated[int, Field(ge=1, le=32)] = 3


def refuse_removed(version: str, why: str) -> BeforeValidator:
    """A removed version named in the config is an error saying so, not just "not allowed"."""

    def check(value: object) -> object:
        if value == version:
            raise ValueError(f"{version} is no longer available ({why})")
        return value

    return BeforeValidator(check)


NearSignature = Annotated[
    Literal["minhash.v3", "minhash.v2"],
    refuse_removed("minhash.v1", "its sha1 scheme was removed; use minhash.v3 or minhash.v2"),
]


class ContaminationConfig(Strict):
    """Any shared n-gram flags; short items are checked whole (``min_whole_*``).
    docs/USER_GUIDE.md, "Decontamination"."""

    version: Annotated[
        Literal["contamination.v2"],
        refuse_removed("contamination.v1", "its engine was removed; use contamination.v2"),
    ] = "contamination.v2"
    ngram_words: Annotated[int, Field(ge=3, le=64)] = 13
    ngram_chars: Annotated[int, Field(ge=8, le=256)] = 50
    min_whole_tokens: Annotated[int, Field(ge=1, le=64)] = 8
    min_whole_chars: Annotated[int, Field(ge=1, le=256)] = 20

    @model_validator(mode="after")
    def _whole_checks_below_ngrams(self) -> "ContaminationConfig":
        if self.min_whole_tokens > self.ngram_words:
            raise ValueError(
                f"min_whole_tokens {self.min_whole_tokens} is above ngram_words "
                f"{self.ngram_words}: items between them would be checked by neither rule"
            )
        return self


class PiiConfig(Strict):
    redact: bool = True
