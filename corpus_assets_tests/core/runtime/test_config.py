import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from corpus_assets.core.runtime.config import (
    ConfigError,
    CorpusConfig,
    DedupPolicy,
    MixingPolicy,
    PackingPolicy,
    SplitPolicy,
    TokenizerPolicy,
    load_config,
    parse_config,
)
from corpus_assets.demo import write_demo

WHERE = "corpus.yaml"
POLICIES = ("dedup", "splits", "mixing", "packing", "tokenizer")


def minimal() -> dict[str, Any]:
    return {
        "version": 1,
        "purpose": "pretraining",
        "sources": [{"id": "web", "kind": "objects", "path": "sources/web"}],
    }


def mutated(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    raw = minimal()
    change(raw)
    return raw


def config_error(raw: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, WHERE)
    message = str(info.value)
    assert message.startswith(f"{WHERE}: "), message
    return message


def write_yaml(path: Path, raw: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def test_minimal_config_loads_with_defaults() -> None:
    config = parse_config(minimal(), WHERE)

    assert config.version == 1
    assert config.purpose == "pretraining"
    assert config.alias == "train"
    (source,) = config.sources
    assert (source.id, source.kind, source.path) == ("web", "objects", "sources/web")
    assert source.include == ["*.jsonl", "*.jsonl.zst", "*.jsonl.gz", "*.parquet"]
    assert (source.text_field, source.id_field, source.group_field) == ("text", "id", None)
    assert config.policies.dedup == DedupPolicy(normalization="nfc-lf-rstrip")
    assert config.policies.splits == SplitPolicy(
        salt="corpus-assets-v1", train_percent=80, validation_percent=10, test_percent=10
    )
    assert config.policies.mixing == MixingPolicy(seed="mix-v1", alpha="1", unit="documents")
    assert config.policies.packing == PackingPolicy(block_tokens=2048, overlong="split", tail="pad")
    assert config.policies.tokenizer == TokenizerPolicy(kind="utf8-bytes-v1")
    assert (config.storage.home, config.storage.catalog_url) == (None, None)


def test_load_config_reads_yaml_and_resolves_sources_against_its_folder(tmp_path: Path) -> None:
    raw = mutated(lambda r: r.update(policies={"packing": {"block_tokens": 512}}))
    path = write_yaml(tmp_path / "corpus.yaml", raw)

    loaded = load_config(path)

    assert loaded.path == path.resolve()
    assert loaded.config == parse_config(raw, WHERE)
    assert loaded.config.policies.packing.block_tokens == 512
    source = loaded.config.sources[0]
    assert loaded.resolve(source.path) == (tmp_path / "sources" / "web").resolve()


def test_a_config_opened_again_is_parsed_once_and_an_edit_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build opens its config ~20 times: the YAML of the same text is parsed once per process
    (each caller still gets its own config), and an edited file is read and parsed anew."""
    from corpus_assets.core.runtime import config as config_module

    parses: list[str] = []
    real_load = yaml.load

    def counting_load(text: str, Loader: Any) -> Any:
        parses.append(text)
        return real_load(text, Loader=Loader)

    monkeypatch.setattr(config_module.yaml, "load", counting_load)
    raw = mutated(lambda r: r.update(purpose="parsed-once-test"))
    path = write_yaml(tmp_path / "corpus.yaml", raw)
    first, second = load_config(path), load_config(path)
    assert len(parses) == 1
    assert first.config == second.config and first.config is not second.config
    write_yaml(path, mutated(lambda r: r.update(purpose="edited-test")))
    assert load_config(path).config.purpose == "edited-test"
    assert len(parses) == 2


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda r: r.update(colour="red"), "colour"),
        (lambda r: r.update(policies={"splits": {"sallt": "x"}}), "policies.splits.sallt"),
        (lambda r: r.update(policies={"packng": {}}), "policies.packng"),
        (lambda r: r["sources"][0].update(colour="red"), "sources[0].colour"),
        (lambda r: r.update(storage={"hme": "/x"}), "storage.hme"),
    ],
    ids=["top", "policies.splits", "policies", "sources[0]", "storage"],
)
def test_unknown_key_is_an_error_naming_its_path(
    change: Callable[[dict[str, Any]], None], key: str
) -> None:
    message = config_error(mutated(change))
    assert f"{WHERE}: {key}: " in message
    assert "Extra inputs are not permitted" in message


def test_unknown_key_in_a_later_source_names_its_index() -> None:
    def change(raw: dict[str, Any]) -> None:
        raw["sources"].append({"id": "books", "kind": "objects", "path": "b", "txt_field": "t"})

    assert "sources[1].txt_field: " in config_error(mutated(change))


def test_unknown_key_in_a_file_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path / "corpus.yaml", mutated(lambda r: r.update(policies={"splits": {"sallt": "x"}}))
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path.resolve()) in str(info.value)
    assert "policies.splits.sallt" in str(info.value)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda r: r.update(purpose=5), "purpose"),
        (lambda r: r.update(version="1"), "version"),
        (lambda r: r.update(sources={"id": "web"}), "sources"),
        (lambda r: r.update(policies={"packing": {"block_tokens": "256"}}), "block_tokens"),
        (lambda r: r.update(policies={"packing": {"block_tokens": 256.0}}), "block_tokens"),
        (lambda r: r.update(policies={"splits": {"train_percent": True}}), "train_percent"),
        (lambda r: r.update(policies={"splits": {"salt": 7}}), "policies.splits.salt"),
        (lambda r: r.update(policies="default"), "policies"),
        (lambda r: r["sources"][0].update(include="*.jsonl"), "sources[0].include"),
        (lambda r: r["sources"][0].update(group_field=3), "sources[0].group_field"),
        (lambda r: r["sources"][0].update(kind="s3"), "sources[0].kind"),
    ],
    ids=[
        "purpose-int",
        "version-str",
        "sources-mapping",
        "block-str",
        "block-float",
        "percent-bool",
        "salt-int",
        "policies-str",
        "include-str",
        "group-int",
        "kind-unknown",
    ],
)
def test_wrong_type_names_the_key(change: Callable[[dict[str, Any]], None], key: str) -> None:
    message = config_error(mutated(change))
    path = message.split(": ", 2)[1]
    assert path.endswith(key), message


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (
            lambda r: r.update(policies={"packing": {"block_tokens": 4}}),
            "policies.packing.block_tokens",
        ),
        (lambda r: r.update(policies={"splits": {"salt": ""}}), "policies.splits.salt"),
        (lambda r: r.update(purpose="has space"), "purpose"),
        (lambda r: r["sources"][0].update(id="Web"), "sources[0].id"),
        (lambda r: r.update(sources=[]), "sources"),
        (lambda r: r.pop("version"), "version"),
    ],
    ids=["block-too-small", "empty-salt", "purpose-pattern", "id-pattern", "no-sources", "no-ver"],
)
def test_out_of_range_or_missing_values_name_the_key(
    change: Callable[[dict[str, Any]], None], key: str
) -> None:
    assert f": {key}" in config_error(mutated(change))


@pytest.mark.parametrize(
    "percents",
    [(80, 10, 5), (80, 10, 20), (0, 0, 0), (100, 100, 0)],
)
def test_split_percents_must_sum_to_100(percents: tuple[int, int, int]) -> None:
    train, validation, test = percents
    splits = {"train_percent": train, "validation_percent": validation, "test_percent": test}
    message = config_error(mutated(lambda r: r.update(policies={"splits": splits})))
    assert "policies.splits" in message
    assert f"sum to {sum(percents)}, not 100" in message


def test_split_percents_summing_to_100_are_accepted() -> None:
    splits = {"train_percent": 100, "validation_percent": 0, "test_percent": 0}
    config = parse_config(mutated(lambda r: r.update(policies={"splits": splits})), WHERE)
    assert config.policies.splits.train_percent == 100


def test_duplicate_source_ids_are_refused() -> None:
    def change(raw: dict[str, Any]) -> None:
        raw["sources"].append({"id": "web", "kind": "objects", "path": "elsewhere"})

    message = config_error(mutated(change))
    assert "'web' is used twice" in message


def test_top_level_must_be_a_mapping() -> None:
    assert "mapping" in config_error([minimal()])
    assert "mapping" in config_error(None)


def test_missing_file_is_a_config_error_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "corpus.yaml"
    with pytest.raises(ConfigError, match="not found") as info:
        load_config(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "version: 1\npurpose: [unclosed\n",
        "version: 1\n  purpose: x\n bad: indent\n",
        "sources:\n\t- id: web\n",
    ],
    ids=["unclosed-flow", "bad-indent", "tab-indent"],
)
def test_invalid_yaml_is_a_config_error_naming_the_path(tmp_path: Path, text: str) -> None:
    path = tmp_path / "corpus.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")


def test_empty_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "corpus.yaml"
    path.write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match="mapping") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_undecodable_file_is_a_config_error_naming_the_path(tmp_path: Path) -> None:
    """A corpus.yaml saved as Latin-1 is unreadable config, not a crash without the path."""
    path = tmp_path / "corpus.yaml"
    path.write_bytes("# café\nversion: 1\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_duplicate_yaml_keys_are_refused(tmp_path: Path) -> None:
    """A repeated section must not silently reset the first one's policy to defaults."""
    path = tmp_path / "corpus.yaml"
    path.write_text(
        "version: 1\n"
        "purpose: pretraining\n"
        "sources: [{id: web, kind: objects, path: web}]\n"
        "policies:\n"
        "  splits: {salt: mine}\n"
        "policies:\n"
        "  packing: {block_tokens: 512}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "policies" in str(info.value)


def policy_digests(config: CorpusConfig) -> dict[str, str]:
    return {name: config.policy_digest(name) for name in POLICIES}


def test_policy_digest_is_stable_and_counts_defaults_as_written() -> None:
    base = policy_digests(parse_config(minimal(), WHERE))
    assert len(set(base.values())) == len(POLICIES)
    assert all(d.startswith("sha256:") for d in base.values())
    assert policy_digests(parse_config(minimal(), WHERE)) == base

    explicit = mutated(
        lambda r: r.update(
            policies={
                "splits": {"test_percent": 10, "salt": "corpus-assets-v1", "train_percent": 80},
                "packing": {"block_tokens": 2048},
            }
        )
    )
    assert policy_digests(parse_config(explicit, WHERE)) == base


@pytest.mark.parametrize(
    ("policy", "value"),
    [
        ("splits", {"salt": "other"}),
        ("splits", {"train_percent": 70, "validation_percent": 20}),
        ("mixing", {"seed": "mix-v2"}),
        ("packing", {"block_tokens": 1024}),
        ("tokenizer", {"bos": "<bos>"}),
    ],
)
def test_policy_digest_changes_only_for_the_changed_policy(
    policy: str, value: dict[str, Any]
) -> None:
    base = policy_digests(parse_config(minimal(), WHERE))
    changed = policy_digests(
        parse_config(mutated(lambda r: r.update(policies={policy: value})), WHERE)
    )
    assert changed[policy] != base[policy]
    assert {k: v for k, v in changed.items() if k != policy} == {
        k: v for k, v in base.items() if k != policy
    }


def test_policy_digest_ignores_non_policy_fields() -> None:
    base = policy_digests(parse_config(minimal(), WHERE))

    def change(raw: dict[str, Any]) -> None:
        raw.update(purpose="other", alias="prod", storage={"home": "/data"})
        raw["sources"][0].update(path="moved")

    assert policy_digests(parse_config(mutated(change), WHERE)) == base


def test_parse_config_does_not_mutate_its_input() -> None:
    raw = minimal()
    before = copy.deepcopy(raw)
    parse_config(raw, WHERE)
    assert raw == before


def test_demo_config_is_valid(tmp_path: Path) -> None:
    path = write_demo(tmp_path)

    loaded = load_config(path)

    config = loaded.config
    assert config.purpose == "demo-pretraining"
    assert config.alias == "demo"
    assert [s.id for s in config.sources] == ["essays", "dialogs", "chats"]
    assert config.sources[1].group_field == "thread"
    assert config.policies.packing.block_tokens == 256
    assert config.policies.splits.salt == "demo-v1"
    for source in config.sources:
        folder = loaded.resolve(source.path)
        assert folder.is_dir(), folder
        assert any(folder.iterdir()), folder


@pytest.mark.parametrize(
    ("near", "expected"),
    [
        ({"bands": 10}, "policies.dedup.near: bands x rows = 10 x 8 = 80, but num_perm is 128"),
        ({"threshold": 1.5}, "policies.dedup.near.threshold: Input should be less than or equal"),
        ({"threshold": 0}, "policies.dedup.near.threshold: Input should be greater than 0"),
        ({"signature": "minhash.v9"}, "policies.dedup.near.signature: Input should be"),
        ({"bucket_heads": 0}, "policies.dedup.near.bucket_heads: Input should be greater"),
    ],
)
def test_bad_near_dedup_policy_is_named(near: dict[str, Any], expected: str) -> None:
    message = config_error(mutated(lambda r: r.update(policies={"dedup": {"near": near}})))
    assert f"{WHERE}: {expected}" in message


def test_removed_minhash_v1_is_an_error_naming_the_file_and_the_key(tmp_path: Path) -> None:
    near = {"dedup": {"near": {"signature": "minhash.v1"}}}
    path = write_yaml(tmp_path / "corpus.yaml", mutated(lambda r: r.update(policies=near)))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path.resolve()}: policies.dedup.near.signature: minhash.v1 is no longer available "
        "(its sha1 scheme was removed; use minhash.v3 or minhash.v2)"
    )


def test_near_dedup_threshold_is_hashed_as_its_decimal_text() -> None:
    a = parse_config(mutated(lambda r: r.update(policies={"dedup": {"near": {}}})), WHERE)
    b = parse_config(
        mutated(lambda r: r.update(policies={"dedup": {"near": {"threshold": 0.85}}})), WHERE
    )
    assert a.policies.dedup.near.model_dump(mode="json")["threshold"] == "0.8"
    assert b.policies.dedup.near.model_dump(mode="json")["threshold"] == "0.85"
    assert a.policy_digest("dedup") != b.policy_digest("dedup")


@pytest.mark.parametrize(
    ("tokenizer", "expected"),
    [
        ({"kind": "huggingface"}, "needs a path (tokenizer.json) or a digest"),
        ({"kind": "huggingface", "path": "t.json"}, "needs eos and pad token strings"),
        (
            {"kind": "huggingface", "path": "t.json", "eos": "<e>", "pad": "<e>"},
            "bos, eos and pad must be different tokens",
        ),
        ({"kind": "huggingface", "digest": "sha256:abc", "eos": "a", "pad": "b"}, "digest"),
        ({"path": "t.json"}, "utf8-bytes-v1 needs no file"),
        ({"eos": "</s>"}, "utf8-bytes-v1's eos token is '<eos>', not '</s>'"),
        ({"kind": "sentencepiece"}, "policies.tokenizer.kind"),
    ],
)
def test_tokenizer_section_is_checked_per_kind(tokenizer: dict[str, Any], expected: str) -> None:
    message = config_error(mutated(lambda r: r.update(policies={"tokenizer": tokenizer})))
    assert "policies.tokenizer" in message and expected in message, message


def test_packing_tokenizer_points_at_the_tokenizer_section() -> None:
    """An old config naming its tokenizer under packing is told where it moved; one that does
    not name it loads as before."""
    raw = mutated(lambda r: r.update(policies={"packing": {"tokenizer": "utf8-bytes-v1"}}))
    message = config_error(raw)
    assert "policies.packing: tokenizer moved to policies.tokenizer" in message, message
    ok = parse_config(
        mutated(lambda r: r.update(policies={"packing": {"block_tokens": 64}})), WHERE
    )
    assert ok.policies.tokenizer.kind == "utf8-bytes-v1"


def test_max_chars_has_an_upper_bound() -> None:
    """A record at ``max_chars`` costs a multiple of its size in its worker
    (docs/USER_GUIDE.md): the bound keeps a typo from admitting gigabyte records."""
    at_limit = {"quality": {"max_chars": 16_000_000}}
    config = parse_config(mutated(lambda r: r.update(policies=at_limit)), WHERE)
    assert config.policies.quality.max_chars == 16_000_000
    above = {"quality": {"max_chars": 16_000_001}}
    message = config_error(mutated(lambda r: r.update(policies=above)))
    assert "max_chars" in message and "16000000" in message


def test_whole_item_checks_cannot_start_above_the_ngram_size() -> None:
    """An item between ngram_words and a larger min_whole_tokens would be checked by neither
    rule: refused when the config loads, naming the section, not at the first build."""
    contamination = {"ngram_words": 10, "min_whole_tokens": 12}
    message = config_error(mutated(lambda r: r.update(policies={"contamination": contamination})))
    assert "policies.contamination" in message and "min_whole_tokens 12" in message
    contamination["min_whole_tokens"] = 10
    raw = mutated(lambda r: r.update(policies={"contamination": contamination}))
    assert parse_config(raw, WHERE).policies.contamination.min_whole_tokens == 10
