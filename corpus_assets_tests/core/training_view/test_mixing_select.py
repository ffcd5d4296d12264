"""Mixing selection: the documented key against a plain-Python reference, reruns, ties, weights."""

import hashlib
import logging
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest

from corpus_assets.core.runtime.config import MixingPolicy
from corpus_assets.core.storage.artifacts import table_bytes
from corpus_assets.core.training_view.mixing.plan import (
    MixingError,
    Population,
    SourcePlan,
    decimal_text,
    plan_mixture,
)
from corpus_assets.core.training_view.mixing.select import (
    Members,
    Stream,
    _first,
    digest_bits,
    mix,
    pass_key,
    report,
    selection_keys,
    stream_order,
)

MASK = (1 << 64) - 1


def reference_key(seed: str, source: str, digest: str, repeat: int) -> int:
    """The module docstring's formula, one record at a time with Python integers."""
    bits = int(digest[-64:][:16], 16)
    material = f"{seed}\x00{source}\x00{repeat}".encode()
    z = bits ^ int.from_bytes(hashlib.sha256(material).digest()[:8], "big")
    z ^= z >> 33
    z = (z * 0xFF51AFD7ED558CCD) & MASK
    z ^= z >> 33
    z = (z * 0xC4CEB9FE1A85EC53) & MASK
    return z ^ (z >> 33)


def reference_stream(
    seed: str, unit: str, plans: list[SourcePlan], members: dict[str, Members]
) -> list[tuple[str, str, int]]:
    """Pass by pass: rank by (key, record_id), take whole passes, then bottom-k (documents) or
    the shortest prefix reaching the plan (tokens); order everything by (key, record_id, pass)."""
    entries = []
    for plan in plans:
        own = members[plan.source]
        ids, digests = own.record_id.to_pylist(), own.record_digest.to_pylist()
        tokens = [int(t) for t in own.tokens]
        left, repeat = plan.amount, 0
        while left > 0 and ids:
            keys = [reference_key(seed, plan.source, d, repeat) for d in digests]
            for i in sorted(range(len(ids)), key=lambda i: (keys[i], ids[i])):
                if left <= 0:
                    break
                left -= 1 if unit == "documents" else tokens[i]
                entries.append((keys[i], ids[i], repeat, plan.source))
            repeat += 1
    return [(rid, source, repeat) for _key, rid, repeat, source in sorted(entries)]


def members_of(source: str, lengths: list[int], prefixed: bool = False) -> Members:
    ids = [f"{source}/{i:05d}" for i in range(len(lengths))]
    digests = [
        ("sha256:" if prefixed else "") + hashlib.sha256(i.encode()).hexdigest() for i in ids
    ]
    return Members(pa.array(ids), pa.array(digests), np.array(lengths, dtype=np.int64))


def duplicated(members: Members, distinct: int) -> Members:
    digests = members.record_digest.to_pylist()
    shared = [digests[i % distinct] for i in range(len(digests))]
    return Members(members.record_id, pa.array(shared), members.tokens)


def run(policy: MixingPolicy, members: dict[str, Members]) -> tuple[list[SourcePlan], pa.Table]:
    populations = [Population(s, len(m.tokens), int(m.tokens.sum())) for s, m in members.items()]
    plans = plan_mixture(policy, populations)
    table, _picks = mix(policy.seed, policy.unit, plans, members, weighted=True)
    return plans, table


def rows_of(table: pa.Table) -> list[tuple[str, str, int]]:
    columns = [table.column(c).to_pylist() for c in ("record_id", "source_id", "repeat")]
    return list(zip(*columns, strict=True))


def test_golden_keys_match_the_documented_formula() -> None:
    a, b, c = (hashlib.sha256(text).hexdigest() for text in (b"a", b"b", b"c"))
    golden = [  # (seed, source, digest, repeat) -> key, pinned
        ("mix-v1", "essays", "sha256:" + a, 0, 0x483C82786DD133C9),
        ("mix-v1", "essays", "sha256:" + a, 1, 0x058738F99B856AA6),
        ("demo-mix-v1", "chats", b, 0, 0x04819F3CDAC599A2),
        ("s\u00e9ed", "x", c, 7, 0x2C7EAD98186ED5D0),
    ]
    for seed, source, digest, repeat, pinned in golden:
        assert reference_key(seed, source, digest, repeat) == pinned
        got = selection_keys(digest_bits(pa.array([digest])), seed, source, repeat)
        assert got.dtype == np.uint64 and int(got[0]) == pinned
    assert pass_key("mix-v1", "essays", 0) != pass_key("mix-v1", "essays", 1)


def test_digest_bits_parse_prefixed_bare_sliced_and_reject_non_digests() -> None:
    bare = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(3000)]
    expected = np.array([int(d[:16], 16) for d in bare], dtype=np.uint64)
    assert (digest_bits(pa.array(bare)) == expected).all()
    prefixed = pa.array(["sha256:" + d.upper() for d in bare], pa.large_string())
    assert (digest_bits(prefixed) == expected).all()
    assert (digest_bits(pa.array(bare).slice(1000, 7)) == expected[1000:1007]).all()
    mixed = pa.array([("sha256:" if i % 3 else "") + d for i, d in enumerate(bare)])  # 2 widths
    assert (digest_bits(mixed) == expected).all()
    assert digest_bits(pa.array([], pa.string())).size == 0
    for bad in (["abc"], ["sha256:" + bare[0][:15] + "g" + bare[0][16:]], [None], ["é" * 64]):
        with pytest.raises(MixingError, match="record_digest"):
            digest_bits(pa.array(bad, pa.string()))


@pytest.mark.parametrize(
    "policy",
    [
        MixingPolicy(seed="s1"),
        MixingPolicy(policy="temperature", alpha="0.5", budget=700, seed="s2"),
        MixingPolicy(policy="temperature", alpha="0.3", unit="tokens", budget=9000, seed="s3"),
        MixingPolicy(policy="unimax", budget=650, max_epochs=5, seed="s4"),
        MixingPolicy(
            policy="ratios",
            ratios={"web": "0.2", "code": "0.3", "books": "0.4", "dups": "0.1"},
            unit="tokens",
            budget=200_000,
            seed="s5",
        ),
    ],
    ids=["natural", "temperature-docs", "temperature-tokens", "unimax", "ratios-tokens-repeats"],
)
def test_stream_equals_the_plain_python_reference(policy: MixingPolicy) -> None:
    rng = np.random.default_rng(7)
    members = {
        "web": members_of("web", rng.integers(1, 40, 300).tolist()),
        "code": members_of("code", rng.integers(1, 400, 60).tolist(), prefixed=True),
        # one huge record: the mean overestimates a prefix, so the token guess must grow
        "books": members_of("books", [1] * 39 + [50_000]),
        # 5 distinct digests over 50 records: equal keys, ordered by record_id
        "dups": duplicated(members_of("dups", rng.integers(1, 60, 50).tolist()), 5),
    }
    plans, table = run(policy, members)
    assert rows_of(table) == reference_stream(policy.seed, policy.unit, plans, members)
    assert table.column("position").to_pylist() == list(range(table.num_rows))


def test_same_config_gives_identical_samples_across_reruns() -> None:
    policy = MixingPolicy(policy="temperature", alpha="0.5", unit="tokens", budget=20_000)
    rng = np.random.default_rng(11)
    lengths = {"a": rng.integers(1, 30, 400).tolist(), "b": rng.integers(5, 90, 80).tolist()}
    first = run(policy, {s: members_of(s, n) for s, n in lengths.items()})[1]
    second = run(policy, {s: members_of(s, n) for s, n in lengths.items()})[1]
    assert first.num_rows > 480 and set(first.column("repeat").to_pylist()) != {0}
    assert table_bytes(first) == table_bytes(second)
    other_seed = policy.model_copy(update={"seed": "other"})
    third = run(other_seed, {s: members_of(s, n) for s, n in lengths.items()})[1]
    assert rows_of(third) != rows_of(first)


def test_equal_keys_across_sources_are_ordered_by_record_id() -> None:
    """A record of source 'z' listed first whose key equals one of source 'a' (a crafted
    64-bit collision) still comes after it: ties go by record_id, not by source order."""
    seed, digest_a = "tie", hashlib.sha256(b"a").hexdigest()
    bits = int(digest_a[:16], 16) ^ pass_key(seed, "a", 0) ^ pass_key(seed, "z", 0)
    digest_z = f"{bits:016x}" + digest_a[16:]
    assert reference_key(seed, "z", digest_z, 0) == reference_key(seed, "a", digest_a, 0)
    members = {
        "z": Members(pa.array(["z/1"]), pa.array([digest_z]), np.array([1])),
        "a": Members(pa.array(["a/1"]), pa.array([digest_a]), np.array([1])),
    }
    _plans, table = run(MixingPolicy(seed=seed), members)
    assert table.column("record_id").to_pylist() == ["a/1", "z/1"]


def test_weight_above_max_weight_warns_and_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    members = {"short": members_of("short", [100] * 900), "long": members_of("long", [400] * 100)}
    policy = MixingPolicy(policy="temperature", alpha="0.5", budget=1200, max_weight="2")
    populations = [Population(s, len(m.tokens), int(m.tokens.sum())) for s, m in members.items()]
    plans = plan_mixture(policy, populations)
    _table, picks = mix(policy.seed, policy.unit, plans, members, weighted=True)
    with caplog.at_level(logging.WARNING):
        rows = report(plans, members, picks, policy.max_weight)
    assert [r["weight"] for r in rows] == [decimal_text(Fraction(5, 6)), "2.5"]
    assert [r["weight_over_bound"] for r in rows] == [False, True]
    assert [r["epochs_used"] for r in rows] == [1, 3]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "'long'" in warnings[0] and "2.5" in warnings[0] and "max_weight 2" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for bound in (Decimal("2.5"), None):
            rows = report(plans, members, picks, bound)
            assert not any(r["weight_over_bound"] for r in rows)
    assert not caplog.records


def test_orders_equal_a_stable_sort_when_keys_tie_in_any_bits() -> None:
    """The packed sort orders by the keys' top bits only; keys that agree there (small values,
    duplicates) must still come out in (key, index) order, and the stream in (key, record_id,
    repeat) order."""
    rng = np.random.default_rng(3)
    for keys in (
        rng.integers(0, 2**64, 5000, dtype=np.uint64),  # uniform: top bits hardly ever tie
        rng.integers(0, 40, 5000).astype(np.uint64),  # small: every top bit ties
        np.array([9, 3, 3, 1, 7, 3], dtype=np.uint64),
    ):
        expected = np.argsort(keys, kind="stable")
        for k in (1, 3, len(keys) // 2, len(keys)):
            assert (_first(keys, k, ordered=True) == expected[:k]).all()
            assert sorted(_first(keys, k, ordered=False)) == sorted(expected[:k])
    count = 4000
    stream = Stream(
        rng.integers(0, 30, count).astype(np.uint64),
        rng.permutation(count).astype(np.int64),
        rng.integers(0, 3, count).astype(np.int64),
        np.zeros(count, np.int32),
    )
    ids = pa.array([f"r{rng.integers(0, 500):04d}" for _ in range(count)])
    table = pa.table({"key": stream.key, "record_id": ids.take(stream.row), "r": stream.repeat})
    by = [("key", "ascending"), ("record_id", "ascending"), ("r", "ascending")]
    ordered = table.take(stream_order(stream, ids))
    assert ordered.equals(table.sort_by(by))
