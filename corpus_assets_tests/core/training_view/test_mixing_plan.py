"""Mixing: exact integer plans, content-keyed selection, a worked example, a build."""

import hashlib
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from pydantic import ValidationError

from corpus_assets.core.pipeline import build_all
from corpus_assets.core.runtime.config import MixingPolicy
from corpus_assets.core.runtime.layer_index import read_layer_index
from corpus_assets.core.runtime.workspace import Workspace, open_workspace
from corpus_assets.core.storage.artifacts import get_table
from corpus_assets.core.training_view.mixing.plan import (
    MixingError,
    Population,
    decimal_text,
    hamilton,
    plan_mixture,
)
from corpus_assets.core.training_view.mixing.select import Members, mix, report
from corpus_assets_tests.conftest import use_demo_copy


def _members(source: str, count: int, length: int, start: int = 0) -> Members:
    ids = [f"{source}/{i:06d}" for i in range(start, start + count)]
    digests = [hashlib.sha256(i.encode()).hexdigest() for i in ids]
    return Members(pa.array(ids), pa.array(digests), np.full(count, length, dtype=np.int64))


def _concat(a: Members, b: Members) -> Members:
    return Members(
        pa.concat_arrays([a.record_id, b.record_id]),
        pa.concat_arrays([a.record_digest, b.record_digest]),
        np.concatenate([a.tokens, b.tokens]),
    )


def _populations(members: dict[str, Members]) -> list[Population]:
    return [Population(s, len(m.record_id), int(m.tokens.sum())) for s, m in members.items()]


def _run(policy: MixingPolicy, members: dict[str, Members]) -> tuple[pa.Table, list[dict]]:
    plans = plan_mixture(policy, _populations(members))
    weighted = any(p.target != p.natural for p in plans)
    table, picks = mix(policy.seed, policy.unit, plans, members, weighted)
    return table, report(plans, members, picks)


def test_hamilton_apportions_exactly_and_within_one_unit() -> None:
    shares = {"a": Fraction(1, 3), "b": Fraction(1, 3), "c": Fraction(1, 3)}
    assert hamilton(10, shares) == {"a": 4, "b": 3, "c": 3}
    shares = {"a": Fraction(2, 7), "b": Fraction(3, 7), "c": Fraction(2, 7)}
    for total in range(0, 60):
        out = hamilton(total, shares)
        assert sum(out.values()) == total
        assert all(abs(out[n] - shares[n] * total) < 1 for n in shares)


def test_decimal_text_is_exact_and_short() -> None:
    assert decimal_text(Fraction(3, 7)) == "0.428571428571"
    assert decimal_text(Fraction(3, 4)) == "0.75"
    assert decimal_text(Fraction(3)) == "3"


def test_chapter_worked_example_temperature_half() -> None:
    """900 short (100 tokens) and 100 long (400 tokens) documents, alpha 1/2, 1200 draws."""
    members = {"short": _members("short", 900, 100), "long": _members("long", 100, 400)}
    policy = MixingPolicy(policy="temperature", alpha="0.5", budget=1200)
    plans = plan_mixture(policy, _populations(members))
    assert [p.target for p in plans] == [Fraction(3, 4), Fraction(1, 4)]
    assert [p.amount for p in plans] == [900, 300]
    table, rows = _run(policy, members)
    assert table.num_rows == 1200
    assert [r["selected_tokens"] for r in rows] == [90_000, 120_000]
    assert [r["token_share"] for r in rows] == [
        decimal_text(Fraction(3, 7)),
        decimal_text(Fraction(4, 7)),
    ]
    assert [r["doc_share"] for r in rows] == ["0.75", "0.25"]
    long_rows = table.filter(pc.equal(table.column("source_id"), "long"))
    assert sorted(set(long_rows.column("repeat").to_pylist())) == [0, 1, 2]
    assert long_rows.group_by("record_id").aggregate([]).num_rows == 100  # each record 3 times
    assert set(table.column("weight").to_pylist()) == {
        decimal_text(Fraction(3, 4) / Fraction(9, 10)),
        decimal_text(Fraction(1, 4) / Fraction(1, 10)),
    }


def test_natural_uses_every_record_once_with_weight_one() -> None:
    members = {"a": _members("a", 37, 5), "b": _members("b", 11, 9)}
    table, rows = _run(MixingPolicy(), members)
    ids = sorted(table.column("record_id").to_pylist())
    assert ids == sorted(members["a"].record_id.to_pylist() + members["b"].record_id.to_pylist())
    assert set(table.column("repeat").to_pylist()) == {0}
    assert set(table.column("weight").to_pylist()) == {"1"}
    assert [r["target_share"] for r in rows] == [
        decimal_text(Fraction(37, 48)),
        decimal_text(Fraction(11, 48)),
    ]


def test_ratios_in_tokens_land_within_one_document_of_target() -> None:
    members = {"a": _members("a", 200, 7), "b": _members("b", 50, 13)}
    policy = MixingPolicy(
        policy="ratios", ratios={"a": "0.5", "b": "0.5"}, unit="tokens", budget=1000
    )
    _table, rows = _run(policy, members)
    assert 500 <= rows[0]["selected_tokens"] < 500 + 7
    assert 500 <= rows[1]["selected_tokens"] < 500 + 13


def test_an_infeasible_plan_names_source_need_and_fit() -> None:
    members = {"short": _members("short", 900, 100), "long": _members("long", 100, 400)}
    policy = MixingPolicy.model_validate(
        {
            "policy": "temperature",
            "alpha": "0.5",
            "budget": 1200,
            "sources": {"long": {"max_epochs": 2}},
        }
    )
    with pytest.raises(MixingError) as error:
        plan_mixture(policy, _populations(members))
    message = str(error.value)
    assert "'long' needs 300 documents" in message
    assert "100 x max_epochs 2 = 200" in message
    assert "max_epochs >= 3" in message and "budget <= 800" in message
    empty = {"a": _members("a", 10, 1), "b": _members("b", 0, 1)}
    ratios = MixingPolicy(policy="ratios", ratios={"a": "0.5", "b": "0.5"})
    with pytest.raises(MixingError, match="'b' needs 5 documents but has no train records"):
        plan_mixture(ratios, _populations(empty))


def test_max_fraction_caps_and_redistributes_or_fails() -> None:
    members = {"a": _members("a", 80, 1), "b": _members("b", 20, 1)}
    policy = MixingPolicy.model_validate(
        {"sources": {"a": {"max_fraction": "0.5"}}, "max_epochs": 3}
    )
    plans = plan_mixture(policy, _populations(members))
    assert [(p.target, p.amount, p.cap_hit) for p in plans] == [
        (Fraction(1, 2), 50, True),
        (Fraction(1, 2), 50, False),
    ]
    both = {"sources": {"a": {"max_fraction": "0.5"}, "b": {"max_fraction": "0.25"}}}
    with pytest.raises(MixingError, match="max_fraction caps"):
        plan_mixture(MixingPolicy.model_validate(both), _populations(members))


def test_unimax_spreads_uniformly_up_to_max_epochs() -> None:
    members = {"big": _members("big", 1000, 1), "small": _members("small", 10, 1)}
    policy = MixingPolicy(policy="unimax", budget=400, max_epochs=4)
    plans = plan_mixture(policy, _populations(members))
    assert [(p.amount, p.cap_hit) for p in plans] == [(360, False), (40, True)]
    with pytest.raises(MixingError, match="budget 5000 exceeds"):
        plan_mixture(
            MixingPolicy(policy="unimax", budget=5000, max_epochs=4), _populations(members)
        )


def test_appending_to_one_source_changes_no_other_selection() -> None:
    base = {"a": _members("a", 400, 3), "b": _members("b", 300, 5), "c": _members("c", 200, 2)}
    grown = {**base, "a": _concat(base["a"], _members("a", 4, 3, start=400))}
    ratios = {"a": "0.5", "b": "0.3", "c": "0.2"}
    for policy in (MixingPolicy(), MixingPolicy(policy="ratios", ratios=ratios, budget=1500)):
        before, _ = _run(policy, base)
        after, _ = _run(policy, grown)
        for source in ("b", "c"):
            keep = [
                t.filter(pc.equal(t.column("source_id"), source)).select(["record_id", "repeat"])
                for t in (before, after)
            ]
            assert keep[0].sort_by("record_id").equals(keep[1].sort_by("record_id"))


def test_policy_config_is_strict_and_backwards_compatible() -> None:
    assert MixingPolicy(seed="demo-mix-v1", alpha="1", unit="documents").policy == "natural"
    for bad in (
        {"policy": "ratios"},
        {"ratios": {"a": "1"}},
        {"policy": "ratios", "ratios": {"a": "0.5", "b": "0.4"}},
        {"alpha": "0.5"},
        {"policy": "unimax", "budget": 10},
        {"policy": "natural", "shares": {}},
    ):
        with pytest.raises(ValidationError):
            MixingPolicy.model_validate(bad)


def _samples(ws: Workspace, key: str) -> tuple[pa.Table, dict]:
    _ref, index = read_layer_index(ws, key, "mixed_samples")
    return get_table(ws.cas, index.output("samples"), "samples"), index.outputs


def test_build_natural_keeps_train_set_and_ratios_rebuild_identically(
    workspace: Workspace, tmp_path: Path
) -> None:
    results = build_all(workspace, "p1")
    table, outputs = _samples(workspace, "p1")
    _ref, splits = read_layer_index(workspace, "p1", "splits")
    split = get_table(workspace.cas, splits.output("splits"), "splits")
    train = split.filter(pc.equal(split.column("split"), "train")).column("record_id")
    assert sorted(table.column("record_id").to_pylist()) == sorted(train.to_pylist())
    assert results["packed_blocks"].counts["samples"] == table.num_rows
    assert [r["source"] for r in outputs["report"]] == [s.id for s in workspace.config.sources]
    assert results["mixed_samples"].details["mixing_report"] == outputs["report"]
    path = Path(os.environ["CORPUS_CONFIG"])
    document = yaml.safe_load(path.read_text())
    ratios = {"essays": "0.5", "dialogs": "0.25", "chats": "0.25"}
    document["policies"]["mixing"] = {
        "seed": "m",
        "policy": "ratios",
        "ratios": ratios,
        "budget": 40,
    }
    mixed = path.with_name("mixed.yaml")
    mixed.write_text(yaml.safe_dump(document))
    runs = []
    for key in ("p2", "p3"):
        ws = open_workspace(mixed)
        try:
            build_all(ws, key)
            runs.append(_samples(ws, key))
        finally:
            ws.close()
    assert runs[0][0].equals(runs[1][0]) and runs[0][0].num_rows == 40
    assert [r["selected_docs"] for r in runs[0][1]["report"]] == [20, 10, 10]
    assert set(runs[0][0].column("weight").to_pylist()) != {"1"}


def test_one_and_two_workers_give_the_same_splits_samples_and_blocks(
    demo_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker count changes how canonical chunks and signatures are computed, never the bytes
    of the layers a trainer reads."""
    built = []
    for workers in (1, 2):
        use_demo_copy(demo_home, tmp_path / f"w{workers}", workers, monkeypatch)
        with open_workspace() as ws:
            results = build_all(ws, "p1")
            layers = ("splits", "mixed_samples", "packed_blocks")
            built.append({layer: results[layer].digest for layer in layers})
            samples = read_layer_index(ws, "p1", "mixed_samples")[1].output("samples")
            built[-1]["samples_table"] = samples["digest"]
    assert built[0] == built[1]
