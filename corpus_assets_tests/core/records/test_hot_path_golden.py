"""The hot per-record paths give the bytes the code gave before their optimisation.

Each digest below was recorded by running the code as it was before that work (commit
0ec88fa) on ``golden_inputs``: canonical records, exclusions and stage counts through the
layer's row path (with PII redaction and benchmark containment, and again under a strict
quality policy without redaction), and each hot function alone (normalisation, PII, quality,
script, dedup key, MinHash signatures, fingerprints, modes, shingles and ICU words). An
optimisation that changes one byte changes a digest, and the failing key names the function.
The ``canonical`` digests (the row path with the benchmark screen) were recorded again, from the
unchanged tree, under ``contamination.v2`` when the whitespace-token rule they first ran was
removed.
The adversarial set always runs; each shared corpus only where ``../shared`` is present.
"""

import hashlib
import json
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pytest

from corpus_assets.core.dedup.minhash import (
    SignatureSpec,
    fingerprints,
    is_unspaced,
    normalise,
    shingles,
    signatures,
    signatures_and_modes,
)
from corpus_assets.core.dedup.minhash.segment import segment_words
from corpus_assets.core.records.canonicalize import (
    Excluded,
    Stages,
    canonical_record,
    contaminated,
    finish_records,
    parse_line,
)
from corpus_assets.core.records.contamination import BenchmarkIndex, TokenPolicy
from corpus_assets.core.records.normalize import dedup_key, normalize_parts
from corpus_assets.core.records.pii import redact_parts
from corpus_assets.core.records.quality import QualityPolicy, check_quality
from corpus_assets.core.records.scripts import script_of, scripts_of
from corpus_assets.core.runtime.config import ObjectsSource
from corpus_assets_tests.golden_inputs import (
    CORPORA,
    adversarial_lines,
    adversarial_texts,
    corpus_lines,
)
from corpus_assets_tests.paths import DATA

SOURCES: dict[str, dict[str, str]] = {
    "fortunes": {},
    "chat-dialogs": {"adapter": "chat-messages.v1", "messages_field": "meta.messages"},
    "licenses": {},
    "python-stdlib": {"content": "code"},
    "python-docs": {},
}
STRICT = QualityPolicy(
    min_chars=20,
    max_chars=200_000,
    max_symbol_ratio_ppm=200_000,
    min_alpha_ratio_ppm=500_000,
    max_repeated_line_ratio_ppm=300_000,
    max_repeated_ngram_ratio_ppm=200_000,
)
# the policy the goldens were recorded under: the symbol cap the core default had before it
# took the config's (no cap), kept explicit so the recorded bytes still pin the same paths
RECORDED = QualityPolicy(max_symbol_ratio_ppm=500_000)
V2, V3 = (SignatureSpec(version=f"minhash.v{n}") for n in (2, 3))

# Recorded from commit 0ec88fa (before the optimisation); see the module docstring.
GOLDEN: dict[str, dict[str, str]] = json.loads((DATA / "hot_path_golden.json").read_text())


class _Digest:
    """sha256 over the ``repr`` of what it is fed (bytes and arrays as their bytes)."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def feed(self, value: Any) -> None:
        if isinstance(value, np.ndarray):
            value = (value.dtype.str, value.shape, value.tobytes())
        self.h.update(repr(value).encode("utf-8", "surrogatepass") + b"\x00")

    def hex(self) -> str:
        return self.h.hexdigest()[:32]


def _each(fn: Callable[[str], Any], texts: Iterable[str]) -> str:
    """Digest of ``fn`` on every text: its result, or the type of what it raised."""
    d = _Digest()
    for text in texts:
        try:
            d.feed(fn(text))
        except Exception as error:
            d.feed(("raised", type(error).__name__))
    return d.hex()


def _index() -> BenchmarkIndex:
    """Benchmark items that hit: adversarial pieces and fixed English sentences."""
    items = [
        ("adv/0", "the of data file value error code line text page alpha beta"),
        ("adv/1", "Permission is hereby granted, free of charge, to any person obtaining a copy"),
        ("adv/2", "Return a new list containing all items from the iterable in ascending order"),
        ("adv/3", "日本語のテキスト 中文文本内容"),
    ]
    return BenchmarkIndex.build(items, TokenPolicy())


def _canonical(source: ObjectsSource, lines: list[bytes], stages: Stages) -> str:
    """The layer's row path on the lines: every record column, exclusion and stage count."""
    d = _Digest()
    records: list[dict[str, Any]] = []

    def finish() -> None:
        hits = contaminated(stages.index, [r["text"] for r in records])
        for n in sorted(hits):
            d.feed((n, hits[n][0].reason, hits[n][0].detail, hits[n][1]))
        finish_records(records)
        for record in records:
            d.feed(sorted(record.items()))
        records.clear()

    for n, raw in enumerate(lines, start=1):
        try:
            records.append(canonical_record(source, "golden", n, parse_line(raw), stages))
        except Excluded as error:
            d.feed((n, error.reason, error.detail))
        if len(records) >= 512:
            finish()
    finish()
    d.feed((sorted(stages.pii.items()), sorted(stages.normalized.items())))
    return d.hex()


def _texts_of(lines: list[bytes]) -> list[str]:
    texts = []
    for raw in lines:
        try:
            text = json.loads(raw).get("text")
        except (ValueError, AttributeError, RecursionError):
            continue
        if isinstance(text, str):
            texts.append(text)
    return texts


def _signatures(texts: list[str]) -> dict[str, str]:
    sig3, modes = signatures_and_modes(texts, V3)
    out = {}
    for name, value in (
        ("minhash.v2", signatures(texts, V2)),
        ("minhash.v3", sig3),
        ("minhash.v3.modes", modes),
        ("fingerprints.v2", fingerprints(texts, V2)),
        ("fingerprints.v3", fingerprints(texts, V3)),
    ):
        d = _Digest()
        for item in value if isinstance(value, list) else [value]:
            d.feed(item)
        out[name] = d.hex()
    return out


def digests(name: str, fields: dict[str, str], lines: list[bytes]) -> dict[str, str]:
    """Every golden digest of one input set (see module docstring)."""
    source = ObjectsSource(id=name.replace("-", "_"), kind="objects", path=".", **fields)
    plain = ObjectsSource(id="plain", kind="objects", path=".", content=source.content)
    texts = _texts_of(lines)
    dedup_texts = [t for t in texts if _encodable(t)]  # canonical texts never hold surrogates
    unspaced = [t for t in dedup_texts if (norm := normalise(t)) and is_unspaced(norm)]
    code = source.content == "code"
    other_kind = "prose" if code else "code"
    out = {
        "canonical": _canonical(source, lines, Stages("train", RECORDED, _index())),
        "canonical.strict": _canonical(plain, lines, Stages("train", STRICT, None, False)),
        "normalize": _each(lambda t: normalize_parts(t, code), texts),
        "normalize.other": _each(lambda t: normalize_parts(t, not code), texts),
        "pii": _each(redact_parts, texts),
        "quality": _each(lambda t: check_quality(t, source.content, STRICT), texts),
        "quality.other": _each(lambda t: check_quality(t, other_kind, STRICT), texts),
        "script": _each(script_of, texts),
        "scripts_of": _each(str, [scripts_of(texts)]),
        "dedup_key": _each(lambda t: dedup_key(t, source.content), texts),
        "shingles.v2": _each(lambda t: shingles(t, V2), dedup_texts),
        "shingles.v3": _each(lambda t: shingles(t, V3), dedup_texts),
        "segment": _each(lambda t: segment_words(normalise(t)), unspaced),
    }
    return out | _signatures(dedup_texts)


def _encodable(text: str) -> bool:
    """Whether the text has no lone surrogate (what canonicalisation lets through)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check(name: str, got: dict[str, str]) -> None:
    want = GOLDEN.get(name)
    if want is None:  # recording: print what to paste
        print(f"{name!r}: {json.dumps(got, indent=4)},")
        pytest.fail(f"no golden digests recorded for {name}")
    assert got == want, {k: (got[k], want.get(k)) for k in got if got[k] != want.get(k)}


def test_adversarial_strings_give_the_recorded_bytes() -> None:
    texts = adversarial_texts()
    lines = adversarial_lines(texts)
    _check("adversarial", digests("adversarial", {}, lines))
    _check("adversarial-code", digests("adversarial-code", {"content": "code"}, lines))


@pytest.mark.parametrize("name", list(SOURCES))
def test_shared_corpus_sample_gives_the_recorded_bytes(name: str) -> None:
    if not CORPORA.is_dir():
        pytest.skip(f"shared corpora not present at {CORPORA}")
    _check(name, digests(name, SOURCES[name], corpus_lines(name)))
