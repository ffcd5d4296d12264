import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from corpus_assets.core.dedup.clusters import CLUSTER_COLUMNS
from corpus_assets.core.dedup.in_memory import cluster
from corpus_assets.core.records.canonicalize import Excluded as Quarantined
from corpus_assets.core.records.canonicalize import Stages, canonicalize, parse_line
from corpus_assets.core.records.index import RECORD_COLUMNS
from corpus_assets.core.records.normalize import dedup_key
from corpus_assets.core.records.quality import QualityPolicy
from corpus_assets.core.runtime.config import ObjectsSource, SplitPolicy
from corpus_assets.core.tokens.encode import encode_batch
from corpus_assets.core.tokens.spec import UTF8_IDS, utf8_spec
from corpus_assets.core.training_view.splits import split_of
from corpus_assets.demo import demo_objects

SOURCE = ObjectsSource(id="s", kind="objects", path=".")
THREADED = ObjectsSource(id="s", kind="objects", path=".", group_field="thread")


def line(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


# --- canonical_records: one line through the canonical stages ----------------------------------


def parse_document(source: ObjectsSource, name: str, line_no: int, raw: bytes) -> dict[str, Any]:
    stages = Stages(purpose="test", quality=QualityPolicy(), index=None)
    return canonicalize(source, name, line_no, parse_line(raw), stages)


def test_valid_line_gives_nfc_text_and_source_scoped_ids() -> None:
    parsed = parse_document(SOURCE, "part-0.jsonl", 3, line({"id": "a1", "text": "Cafe\u0301!"}))

    assert parsed["text"] == "Caf\u00e9!"
    assert parsed["record_id"] == "s/a1"
    assert parsed["group_id"] == "s/a1"
    assert parsed["record_digest"].startswith("sha256:")


def test_integer_id_and_missing_id() -> None:
    assert parse_document(SOURCE, "o.jsonl", 1, line({"id": 7, "text": "x"}))["record_id"] == "s/7"
    missing = parse_document(SOURCE, "dir/o.jsonl", 12, line({"text": "x"}))
    assert missing["record_id"] == "s/dir/o.jsonl#L12"


def test_trailing_whitespace_around_the_json_is_accepted() -> None:
    parsed = parse_document(SOURCE, "o.jsonl", 1, b'  {"id": 1, "text": "x"}\r')
    assert parsed["text"] == "x"


def test_record_digest_depends_on_normalised_text_and_identity() -> None:
    composed = parse_document(SOURCE, "o.jsonl", 1, line({"id": 1, "text": "\u00e9"}))
    decomposed = parse_document(SOURCE, "other.jsonl", 9, line({"id": 1, "text": "e\u0301"}))
    other_text = parse_document(SOURCE, "o.jsonl", 1, line({"id": 1, "text": "e"}))
    other_id = parse_document(SOURCE, "o.jsonl", 1, line({"id": 2, "text": "\u00e9"}))

    assert composed["record_digest"] == decomposed["record_digest"]
    assert other_text["record_digest"] != composed["record_digest"]
    assert other_id["record_digest"] != composed["record_digest"]


def test_custom_text_and_id_fields() -> None:
    source = ObjectsSource(id="s", kind="objects", path=".", text_field="body", id_field="uid")
    parsed = parse_document(source, "o.jsonl", 1, line({"uid": "u", "body": "b", "text": "t"}))
    assert (parsed["record_id"], parsed["text"]) == ("s/u", "b")


@pytest.mark.parametrize(
    ("obj", "group_id"),
    [
        ({"id": "m1", "thread": "t7", "text": "x"}, "s/t7"),
        ({"id": "m1", "thread": 42, "text": "x"}, "s/42"),
        ({"id": "m1", "text": "x"}, "s/m1"),
        ({"id": "m1", "thread": "", "text": "x"}, "s/m1"),
        ({"id": "m1", "thread": None, "text": "x"}, "s/m1"),
    ],
    ids=["str", "int", "absent", "empty", "null"],
)
def test_group_id_comes_from_group_field(obj: dict[str, Any], group_id: str) -> None:
    assert parse_document(THREADED, "o.jsonl", 1, line(obj))["group_id"] == group_id


def test_group_field_is_ignored_when_not_configured() -> None:
    parsed = parse_document(SOURCE, "o.jsonl", 1, line({"id": "m1", "thread": "t7", "text": "x"}))
    assert parsed["group_id"] == "s/m1"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "parse.blank_line"),
        (b"  \t ", "parse.blank_line"),
        (b'{"text": "caf\xe9"}', "parse.invalid_utf8"),
        (b"\xff\xfe", "parse.invalid_utf8"),
        (b'{"text": "unterminated', "parse.invalid_json"),
        (b'{"text": "x"} trailing', "parse.invalid_json"),
        (b"\xef\xbb\xbf" + b'{"text": "x"}', "parse.invalid_json"),
        (b'["text"]', "parse.not_an_object"),
        (b'"text"', "parse.not_an_object"),
        (b"null", "parse.not_an_object"),
        (b'{"id": 1}', "schema.unknown"),
        (b'{"Text": "x"}', "schema.unknown"),
        (b'{"text": 5}', "schema.unknown"),
        (b'{"text": null}', "schema.unknown"),
        (b'{"text": ["a"]}', "schema.unknown"),
        (b'{"text": ""}', "parse.empty_text"),
        (b'{"text": " \\n\\t "}', "parse.empty_text"),
        # only zero-width and Unicode space characters: nothing to read either
        (b'{"text": "\\u200b\\u200c\\u200d\\u2060\\ufeff"}', "parse.empty_text"),
        (b'{"text": "\\u00a0\\u3000\\u2000\\u2005\\u200a \\u200b\\n"}', "parse.empty_text"),
        ('{"text": "\u2060\u00ad\u3164\u202f"}'.encode(), "parse.empty_text"),
        (b'{"text": "x", "id": [1]}', "schema.bad_id"),
        (b'{"text": "x", "id": {"a": 1}}', "schema.bad_id"),
        (b'{"text": "x", "id": 1.5}', "schema.bad_id"),
        (b'{"text": "x", "id": true}', "schema.bad_id"),
    ],
)
def test_uninterpretable_lines_are_quarantined_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(Quarantined) as info:
        parse_document(SOURCE, "o.jsonl", 1, raw)
    assert info.value.reason == reason
    assert info.value.detail
    assert str(info.value).startswith(f"{reason}: ")


@pytest.mark.parametrize("text", ["\u200bx", "\u00a0\u3000a\u200b", "\ufeff\u05d0"])
def test_one_visible_character_among_invisible_ones_is_text(text: str) -> None:
    record = parse_document(SOURCE, "o.jsonl", 1, json.dumps({"text": text}).encode())
    assert record["text"]


@pytest.mark.parametrize(
    "raw",
    [b'{"id": 1, "text": "a\\ud800b"}', b'{"id": "\\udc00", "text": "x"}'],
    ids=["text", "id"],
)
def test_lone_surrogate_escape_is_quarantined_not_a_crash(raw: bytes) -> None:
    """Valid JSON syntax, but not encodable text; must quarantine the line, not fail the chunk."""
    with pytest.raises(Quarantined) as info:
        parse_document(SOURCE, "o.jsonl", 1, raw)
    assert info.value.reason


# --- dedup_clusters --------------------------------------------------------------------------


def test_dedup_key_ignores_line_endings_and_trailing_whitespace() -> None:
    base = dedup_key("line one\nline two")
    assert dedup_key("line one\r\nline two") == base
    assert dedup_key("line one\rline two") == base
    assert dedup_key("line one   \nline two\t ") == base
    assert dedup_key("line one\nline two\n") == base
    assert dedup_key("line one\r\nline two  \r\n") == base


def test_dedup_key_folds_unicode_to_nfc() -> None:
    assert dedup_key("caf\u00e9") == dedup_key("cafe\u0301")


def test_dedup_key_keeps_what_changes_meaning_per_kind() -> None:
    code = "def f():\n    return 1"
    assert dedup_key(code, "code") != dedup_key("def f():\nreturn 1", "code")
    assert dedup_key(code, "code") != dedup_key("def f():\n  return 1", "code")
    assert dedup_key("a  b", "code") != dedup_key("a b", "code")
    assert dedup_key("Word", "code") != dedup_key("word", "code")
    # prose ignores spacing and case, never words
    assert dedup_key("a  b") == dedup_key("a b") and dedup_key("Word") == dedup_key("word")
    assert dedup_key("a b") != dedup_key("a c")


def test_dedup_key_is_sha256_of_the_normalised_utf8() -> None:
    assert dedup_key("x  \r\ny", "code") == "sha256:" + hashlib.sha256(b"x\ny").hexdigest()
    assert dedup_key("X  \r\ny") == "sha256:" + hashlib.sha256(b"x y").hexdigest()


def records_table(rows: list[tuple[str, str]]) -> pa.Table:
    """(record_id, text) rows; the source id is the record id's prefix."""
    return pa.Table.from_pylist(
        [
            {
                "record_id": rid,
                "source_id": rid.split("/", 1)[0],
                "object": "sha256:" + "0" * 64,
                "line": sum(map(ord, rid)),  # a row's identity, not its position
                "group_id": rid,
                "record_digest": "sha256:" + hashlib.sha256(rid.encode()).hexdigest(),
                "dedup_key": dedup_key(text, "code"),
                "text": text,
            }
            for rid, text in rows
        ],
        schema=RECORD_COLUMNS,
    )


ORDER = {"web": 0, "books": 1}
ROWS = [
    ("books/a", "shared text"),
    ("web/z", "shared text\r\n"),
    ("web/m", "shared text  "),
    ("books/b", "only in books"),
    ("web/10", "twice in web"),
    ("web/2", "twice in web\n"),
    ("books/c", "    indented"),
    ("books/d", "indented"),
]


def test_cluster_representative_is_first_by_source_order_then_length_then_record_id() -> None:
    table, _, _ = cluster(records_table(ROWS), ORDER)

    assert table.schema == CLUSTER_COLUMNS
    rows = {r["record_id"]: r for r in table.to_pylist()}
    assert table.column("record_id").to_pylist() == sorted(rid for rid, _ in ROWS)
    reps = {rid: r["representative_id"] for rid, r in rows.items()}
    assert reps == {
        # web is listed first in the config, so it wins even though "books/a" sorts first.
        "books/a": "web/m",
        "web/m": "web/m",
        "web/z": "web/m",
        "books/b": "books/b",
        # The longer text wins ("twice in web\n"), whatever the record ids say.
        "web/10": "web/2",
        "web/2": "web/2",
        "books/c": "books/c",
        "books/d": "books/d",
    }
    assert {rid for rid, r in rows.items() if r["is_representative"]} == {
        "web/m",
        "books/b",
        "web/2",
        "books/c",
        "books/d",
    }
    assert rows["books/a"]["source_id"] == "books"
    assert rows["books/a"]["dedup_key"] == dedup_key("shared text", "code")


def test_cluster_source_order_comes_from_config_not_names() -> None:
    table, _, _ = cluster(records_table(ROWS), {"books": 0, "web": 1})
    columns = table.to_pydict()
    reps = dict(zip(columns["record_id"], columns["representative_id"], strict=True))
    assert reps["web/z"] == reps["web/m"] == reps["books/a"] == "books/a"


def test_cluster_output_does_not_depend_on_input_row_order() -> None:
    expected = cluster(records_table(ROWS), ORDER)
    assert expected.edges.num_rows > 0  # the published edges, too
    rng = random.Random(5)
    for _ in range(20):
        shuffled = ROWS[:]
        rng.shuffle(shuffled)
        got = cluster(records_table(shuffled), ORDER)
        assert got.table.equals(expected.table) and got.edges.equals(expected.edges)


def test_cluster_of_no_records_is_empty() -> None:
    table, _, _ = cluster(RECORD_COLUMNS.empty_table(), ORDER)
    assert table.num_rows == 0
    assert table.schema == CLUSTER_COLUMNS


# --- splits ----------------------------------------------------------------------------------

DEFAULT_SPLITS = SplitPolicy()


def test_split_of_is_deterministic_and_matches_the_documented_hash() -> None:
    for n in range(200):
        group = f"web/g{n}"
        h = hashlib.sha256(b"corpus-assets-v1\x00" + group.encode()).digest()
        percent = int.from_bytes(h[:8], "big") * 100 // 2**64
        expected = "train" if percent < 80 else "validation" if percent < 90 else "test"
        assert split_of(group, DEFAULT_SPLITS) == expected
        assert split_of(group, SplitPolicy()) == expected


THIRDS = SplitPolicy(salt="x", train_percent=34, validation_percent=33, test_percent=33)


def test_records_of_one_group_share_a_split() -> None:
    def splits_of(thread_of: Callable[[int], str]) -> set[str]:
        return {
            split_of(
                parse_document(
                    THREADED,
                    "o.jsonl",
                    n,
                    line({"id": f"m{n}", "thread": thread_of(n), "text": "x"}),
                )["group_id"],
                THIRDS,
            )
            for n in range(60)
        }

    assert len(splits_of(lambda n: "t-shared")) == 1
    assert splits_of(lambda n: f"t{n}") == {"train", "validation", "test"}


def test_salt_changes_some_assignments() -> None:
    groups = [f"g{n}" for n in range(1000)]
    other = SplitPolicy(salt="another-salt")
    moved = sum(split_of(g, DEFAULT_SPLITS) != split_of(g, other) for g in groups)
    # Independent 80/10/10 draws disagree with probability 0.34.
    assert 250 < moved < 430


def test_shares_over_10000_groups_are_within_two_points_of_policy() -> None:
    counts = Counter(split_of(f"src/group-{n}", DEFAULT_SPLITS) for n in range(10_000))
    assert set(counts) == {"train", "validation", "test"}
    assert abs(counts["train"] / 100 - 80) <= 2
    assert abs(counts["validation"] / 100 - 10) <= 2
    assert abs(counts["test"] / 100 - 10) <= 2


@pytest.mark.parametrize(
    ("percents", "only"),
    [((100, 0, 0), "train"), ((0, 100, 0), "validation"), ((0, 0, 100), "test")],
)
def test_degenerate_policy_puts_everything_in_one_split(
    percents: tuple[int, int, int], only: str
) -> None:
    train, validation, test = percents
    policy = SplitPolicy(train_percent=train, validation_percent=validation, test_percent=test)
    assert {split_of(f"g{n}", policy) for n in range(2000)} == {only}


# --- packed_blocks ---------------------------------------------------------------------------


def tokenize(text: str) -> list[int]:
    """One text through the utf8-bytes-v1 encoder the token cache runs."""
    tokens, counts = encode_batch(utf8_spec(), pa.array([text]))
    assert counts.tolist() == [len(tokens)]
    return tokens.tolist()


def test_tokenize_is_utf8_bytes_then_eos() -> None:
    EOS, PAD = UTF8_IDS["eos"], UTF8_IDS["pad"]
    assert tokenize("") == [EOS]
    assert tokenize("A é") == [0x41, 0x20, 0xC3, 0xA9, EOS]
    assert tokenize("✓") == [0xE2, 0x9C, 0x93, 256]
    assert (EOS, PAD) == (256, 257)


# --- demo ------------------------------------------------------------------------------------


def test_demo_objects_are_byte_identical_across_calls() -> None:
    first, second = demo_objects(), demo_objects()
    assert list(first) == list(second)
    assert first == second
    assert sorted(first) == [
        "chats/chats-00000.jsonl",
        "dialogs/dialogs-00000.jsonl",
        "essays/essays-00000.jsonl.zst",
        "essays/essays-00001.jsonl",
    ]
    assert all(first.values())
