import hashlib
import math
import random

import pytest
import rfc8785

from corpus_assets.core.storage.digests import (
    DigestError,
    canonical_json,
    check_digest,
    hex_of,
    json_digest,
    sha256_digest,
)

GOOD = "sha256:" + "0123456789abcdef" * 4


def test_canonical_json_sorts_keys_and_writes_utf8_without_whitespace() -> None:
    assert canonical_json({"b": 1, "a": [True, None, "é"]}) == (
        b'{"a":[true,null,"\xc3\xa9"],"b":1}'
    )


def test_canonical_json_sorts_nested_keys_by_utf16_code_units() -> None:
    # RFC 8785 3.2.3: U+1F600 (surrogates D83D DE00) sorts before U+FF61, unlike code-point order.
    payload = {"z": 0, "\uff61": 1, "\U0001f600": 2, "é": 3, "a": {"y": 1, "x": 2}}
    expected = '{"a":{"x":2,"y":1},"z":0,"é":3,"😀":2,"｡":1}'.encode()
    assert canonical_json(payload) == expected


def test_canonical_json_string_escapes_follow_rfc8785() -> None:
    # Control characters use \n-style or \u00XX escapes; U+2028 and '/' stay literal.
    assert canonical_json(['\n\t\x07"\\/\u2028']) == '["\\n\\t\\u0007\\"\\\\/\u2028"]'.encode()


def test_canonical_json_is_independent_of_insertion_order() -> None:
    first = {"source": "s", "lines": [1, 2], "meta": {"k": "v", "a": None}}
    second = {"meta": {"a": None, "k": "v"}, "lines": [1, 2], "source": "s"}
    assert canonical_json(first) == canonical_json(second)
    assert json_digest(first) == json_digest(second)


def test_canonical_json_does_not_treat_a_tuple_differently_from_a_list() -> None:
    assert canonical_json({"a": (1, "x")}) == canonical_json({"a": [1, "x"]})


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        (1.5, "$"),
        ({"a": 1.0}, "$.a"),
        ({"a": [1, {"b": 0.5}]}, "$.a[1].b"),
        ([[0, [math.inf]]], "$[0][1][0]"),
        ({"t": (1, float("nan"))}, "$.t[1]"),
    ],
)
def test_floats_are_refused_naming_their_json_path(payload: object, path: str) -> None:
    with pytest.raises(TypeError, match="float") as info:
        canonical_json(payload)
    assert f"float at {path} " in str(info.value)
    with pytest.raises(TypeError):
        json_digest(payload)


def test_integers_beyond_the_ijson_safe_range_are_refused_not_rounded() -> None:
    canonical_json(2**53 - 1)
    with pytest.raises(ValueError):
        canonical_json(2**53 + 1)


def test_json_digest_is_sha256_of_the_canonical_bytes() -> None:
    payload = {"b": 1, "a": [True, None, "é"], "nested": {"z": "", "y": [-3, 0]}}
    expected = "sha256:" + hashlib.sha256(canonical_json(payload)).hexdigest()
    assert json_digest(payload) == expected
    assert json_digest(payload) == sha256_digest(canonical_json(payload))
    assert json_digest(payload) != json_digest({**payload, "b": 2})


def test_sha256_digest_of_known_bytes() -> None:
    assert sha256_digest(b"") == (
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )


def test_check_digest_accepts_and_returns_a_well_formed_digest() -> None:
    assert check_digest(GOOD) == GOOD
    assert hex_of(GOOD) == GOOD.removeprefix("sha256:")


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty"),
        pytest.param("0123456789abcdef" * 4, id="no-prefix"),
        pytest.param("sha256:" + "0123456789abcdef" * 4 + "0", id="65-hex"),
        pytest.param("sha256:" + ("0123456789abcdef" * 4)[:-1], id="63-hex"),
        pytest.param("sha256:" + "0123456789ABCDEF" * 4, id="uppercase-hex"),
        pytest.param("SHA256:" + "0123456789abcdef" * 4, id="uppercase-prefix"),
        pytest.param("sha512:" + "0123456789abcdef" * 4, id="other-algorithm"),
        pytest.param("sha256:" + "0123456789abcdeg" * 4, id="non-hex"),
        pytest.param(" " + GOOD, id="leading-space"),
        pytest.param(GOOD + " ", id="trailing-space"),
        pytest.param(GOOD + "\n", id="trailing-newline"),
        pytest.param(None, id="none"),
        pytest.param(42, id="int"),
        pytest.param(GOOD.encode(), id="bytes"),
    ],
)
def test_check_digest_rejects_malformed_digests(value: object) -> None:
    with pytest.raises(DigestError, match="sha256:<64 lowercase hex>"):
        check_digest(value, "manifest digest")  # type: ignore[arg-type]
    with pytest.raises(DigestError):
        hex_of(value)  # type: ignore[arg-type]


def test_check_digest_error_names_what_was_checked() -> None:
    with pytest.raises(DigestError, match=r"^parent ref 'nope' "):
        check_digest("nope", "parent ref")


def test_digest_error_is_a_value_error() -> None:
    assert issubclass(DigestError, ValueError)


def test_fast_canonical_json_matches_rfc8785_byte_for_byte() -> None:
    """Golden comparison of the fast path against the reference implementation."""

    rng = random.Random(8785)
    alphabet = [
        "a",
        "é",
        "\u2028",
        "\x00",
        "\x1f",
        '"',
        "\\",
        "\n",
        "\t",
        "😀",
        "\u00e9",
        "中",
        "/",
    ]

    def value(depth: int) -> object:
        roll = rng.random()
        if depth > 3 or roll < 0.3:
            return "".join(rng.choices(alphabet, k=rng.randint(0, 8)))
        if roll < 0.45:
            return rng.choice([0, -1, 2**53 - 1, -(2**53) + 1, 42, True, False, None])
        if roll < 0.7:
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        keys = ["b", "a", "A", "_", "z9", "aa", ""]
        return {k: value(depth + 1) for k in rng.sample(keys, rng.randint(0, len(keys)))}

    for _ in range(2000):
        payload = {"root": value(0)}
        assert canonical_json(payload) == rfc8785.dumps(payload)
