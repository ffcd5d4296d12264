"""Quality policy: each reason fires on a crafted text and not on normal ones; per-kind rules."""

import json

import pytest

from corpus_assets.core.records.quality import QualityPolicy, check_quality, policy_payload

PARAGRAPH = (
    "A celebrity is a person who is known for his well-knownness. The critic, on the other\n"
    "hand, creates nothing and thereby feels qualified to judge the work of creative men;\n"
    "there is logic in this, for he is unbiased and hates all creative people equally.\n"
)
CODE = (
    "def mean(values: list[float]) -> float:\n"
    '    """Arithmetic mean; {} and [] are symbols, and that is fine."""\n'
    "    if not values:\n"
    "        raise ValueError('empty')\n"
    "    return sum(values) / len(values)  # {x: y for x, y in z}\n"
)
OTHER_SCRIPTS = [
    "Любовь привносит в жизнь все то, что мертво вокруг нас.\n\t\t-- Розенцвейг",
    "在 Debian 这种规模的项目中，很难避免遇到与你意见不和，或者难以合作的人。",
    "আপনি কেন খাওয়াদাওয়া করেন? আমি সবসময়ই তোমার সাথে কথা বলতে পছন্দ করি।",  # vowel signs are marks
    "تلميح دبيان: يمكنك معرفة الإصدارت المتوفرة والمتبثة لحزمة باستخدام الأمر",
]
TIGHT = QualityPolicy(
    min_chars=20,
    max_chars=2_000,
    max_symbol_ratio_ppm=250_000,
    min_alpha_ratio_ppm=600_000,
    max_repeated_line_ratio_ppm=300_000,
    max_repeated_ngram_ratio_ppm=300_000,
    ngram=3,
)


@pytest.mark.parametrize("text", [PARAGRAPH, *OTHER_SCRIPTS])
def test_normal_prose_passes_default_and_tight(text: str) -> None:
    assert check_quality(text, "prose", QualityPolicy()) is None
    assert check_quality(text, "prose", TIGHT) is None


def test_dense_code_passes_as_code_and_fails_as_prose() -> None:
    assert check_quality(CODE, "code", TIGHT) is None
    dense = "m[i] = {k: v*2 for k, v in d.items()}; y = (a+b)*c/d - e%f  # ok\n"
    assert check_quality(dense, "code", TIGHT) is None
    assert check_quality(dense, "prose", TIGHT) == "quality.symbol_ratio"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("short text", "quality.too_short"),
        ("   padded   \n\n\t\t  ", "quality.too_short"),  # whitespace does not count
        (PARAGRAPH * 10, "quality.too_long"),
        ("==== ### ---- !!! ~~~~ |||| **** // " * 3 + "some words here", "quality.symbol_ratio"),
        ("1234 5678 9012 3456 7890 1234 5678 90 ab", "quality.alpha_ratio"),
        ("Buy now!\nBuy now!\nBuy now!\nBuy now!\nPlease read this.\n", "quality.repeated_lines"),
        ("the cat sat on the mat " * 6, "quality.repeated_ngrams"),
    ],
)
def test_each_reason(text: str, reason: str) -> None:
    assert check_quality(text, "prose", TIGHT) == reason


def test_code_skips_character_class_rules_but_not_the_others() -> None:
    symbols = "{}[]()<>=+-*/%&|^~!:;,." * 10
    assert check_quality(symbols, "prose", TIGHT) == "quality.symbol_ratio"
    assert check_quality(symbols, "code", TIGHT) is None
    assert check_quality("x = 1\n", "code", TIGHT) == "quality.too_short"
    assert check_quality(CODE * 20, "code", TIGHT) == "quality.too_long"
    boiler = "# generated, do not edit by hand!\n" * 5 + CODE
    assert check_quality(boiler, "code", TIGHT) == "quality.repeated_lines"


def test_short_repeated_lines_weigh_little() -> None:
    # Many closing braces repeat, but by characters they are a small share.
    code = "".join(f"if (x{i} > {i}) {{\n    call_function_{i}(x{i});\n}}\n" for i in range(8))
    assert check_quality(code, "code", TIGHT) is None


def test_combining_marks_count_as_letters() -> None:
    devanagari = "कि " * 40  # letter + vowel sign (a combining mark)
    assert check_quality(devanagari, "prose", QualityPolicy(min_alpha_ratio_ppm=1_000_000)) is None


def test_rules_run_in_stated_order() -> None:
    # Too short and symbol-heavy: the length rule is reported.
    assert check_quality("!!!!", "prose", TIGHT) == "quality.too_short"
    # Symbol-heavy and repetitive: the character-class rule comes first.
    assert check_quality("#### ####\n" * 10, "prose", TIGHT) == "quality.symbol_ratio"


def test_ratio_boundary_is_exact_in_integers() -> None:
    policy = QualityPolicy(max_symbol_ratio_ppm=250_000)
    assert check_quality("abc!", "prose", policy) is None  # exactly 25%: kept
    assert check_quality("ab!!", "prose", policy) == "quality.symbol_ratio"
    alpha = QualityPolicy(min_alpha_ratio_ppm=750_000)
    assert check_quality("abc1", "prose", alpha) is None  # exactly 75%: kept
    assert check_quality("ab12", "prose", alpha) == "quality.alpha_ratio"


def test_defaults_are_permissive() -> None:
    default = QualityPolicy()
    for text in [PARAGRAPH, CODE, "x", "1234", "Buy now!\n" * 50, "a a a a a a a a"]:
        assert check_quality(text, "prose", default) is None
        assert check_quality(text, "code", default) is None
    assert check_quality("", "prose", default) == "quality.too_short"
    assert check_quality("<<<>>>", "prose", default) is None  # the config's: no symbol cap


def test_too_few_words_are_not_judged_on_ngrams() -> None:
    policy = QualityPolicy(max_repeated_ngram_ratio_ppm=0, ngram=5)
    assert check_quality("spam spam spam spam", "prose", policy) is None
    assert check_quality("spam spam spam spam spam spam", "prose", policy) == (
        "quality.repeated_ngrams"
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_symbol_ratio_ppm": 0.5},
        {"min_alpha_ratio_ppm": 1_000_001},
        {"min_chars": -1},
        {"max_chars": True},
        {"ngram": 0},
        {"version": ""},
    ],
)
def test_policy_rejects_values_a_hash_could_not_carry(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        QualityPolicy(**kwargs)


def test_policy_payload_is_ints_and_strings() -> None:
    payload = policy_payload(TIGHT)
    assert all(isinstance(v, int | str) and not isinstance(v, bool) for v in payload.values())
    assert payload["version"] == "quality.v1"
    assert payload["max_symbol_ratio_ppm"] == 250_000
    assert "unicode" in payload  # character classes depend on the Unicode database
    assert json.loads(json.dumps(payload)) == payload
    assert policy_payload(QualityPolicy()) != payload
    assert policy_payload(QualityPolicy()) == policy_payload(QualityPolicy())
