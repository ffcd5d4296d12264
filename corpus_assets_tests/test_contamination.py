"""Benchmark decontamination by n-gram containment (core/records/contamination*.py).

Texts are generated here, so the tests do not need ../shared.
"""

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus_assets.core.records import contamination, contamination_stream
from corpus_assets.core.records.contamination import (
    ContaminationPolicy,
    Match,
    char_ngrams,
    containment_ppm,
    normalise,
    policy_payload,
    word_ngrams,
)
from corpus_assets.core.records.contamination_index import BenchmarkIndex, ContainmentIndex
from corpus_assets.core.storage.digests import json_digest

POLICY = ContaminationPolicy()
QUESTION = (
    "Which planet in our solar system has the longest day, measured as one full rotation on "
    "its axis relative to the distant stars, and why does it spin backwards?"
)  # 28 words
ZH_ITEM = (
    "在一个遥远的山村里，住着一位年迈的木匠。他每天清晨都会走到河边，"
    "观察水流的方向，然后回到作坊里雕刻一只新的木鸟。村里的孩子们常常问他为什么这样做。"
)
SYLLABLES = ["ka", "lo", "mi", "ter", "van", "sul", "po", "rin", "dex", "ab", "or", "ne", "qui"]
COMMON = ["the", "of", "and", "in", "to", "is", "a", "which", "on", "its", "day", "full"]


def filler(words: int, seed: int) -> list[str]:
    """Deterministic nonsense words with some common English ones mixed in."""
    rng = random.Random(seed)
    out = []
    for _ in range(words):
        if rng.random() < 0.2:
            out.append(rng.choice(COMMON))
        else:
            out.append("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))))
    return out


def embed(item: str, words: int, seed: int) -> str:
    doc = filler(words, seed)
    at = len(doc) // 3
    return " ".join([*doc[:at], item, *doc[at:]])


def zh_filler(chars: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(chr(rng.randint(0x4E00, 0x62FF)) for _ in range(chars))


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b)


def brute_force(items: list[tuple[str, str]], text: str, policy: ContaminationPolicy):
    """The definition, without any index: best containment at or above the threshold."""
    record = normalise(text)
    best = None
    for item_id, item_text in sorted(items):
        norm = normalise(item_text)
        mode = contamination.item_mode(norm, policy)
        if mode is None:
            continue
        if mode == "word":
            ppm = containment_ppm(
                word_ngrams(norm, policy.ngram_words), word_ngrams(record, policy.ngram_words)
            )
        else:
            ppm = containment_ppm(
                char_ngrams(norm, policy.ngram_chars), char_ngrams(record, policy.ngram_chars)
            )
        if ppm >= policy.threshold_ppm and (best is None or ppm > best.containment_ppm):
            best = Match(item_id, ppm)
    return best


def test_question_embedded_in_long_document_is_caught_although_jaccard_is_tiny() -> None:
    assert 20 <= len(QUESTION.split()) <= 40
    document = embed(QUESTION, 5_000, seed=1)
    index = BenchmarkIndex.build([("bench/q1", QUESTION)], POLICY)

    assert index.mode("bench/q1") == "word"
    assert index.match(document) == Match("bench/q1", 1_000_000)
    a = word_ngrams(normalise(QUESTION), POLICY.ngram_words)
    b = word_ngrams(normalise(document), POLICY.ngram_words)
    assert containment_ppm(a, b) == 1_000_000
    assert jaccard(a, b) < 0.01


def test_case_punctuation_and_whitespace_do_not_hide_a_copy() -> None:
    index = BenchmarkIndex.build([("bench/q1", QUESTION)], POLICY)
    shouted = "«" + QUESTION.upper().replace(" ", " \n\t ").replace(",", " ,") + "»"
    assert index.match(embed(shouted, 300, seed=2)) == Match("bench/q1", 1_000_000)


def test_document_sharing_only_common_words_is_not_caught() -> None:
    index = BenchmarkIndex.build([("bench/q1", QUESTION)], POLICY)
    words = QUESTION.split()
    rng = random.Random(3)
    scattered = filler(2_000, seed=4)
    for word in words:  # every word of the question, none next to another
        scattered.insert(rng.randrange(len(scattered)), word)
    assert index.match(" ".join(scattered)) is None
    assert index.match(" ".join(filler(5_000, seed=5))) is None


def test_paraphrase_below_threshold_is_not_caught() -> None:
    words = QUESTION.split()
    # Change every 7th word: no 13-word window survives intact except near the ends.
    paraphrase = " ".join(w + "x" if i % 7 == 3 else w for i, w in enumerate(words))
    document = embed(paraphrase, 1_000, seed=6)
    a = word_ngrams(normalise(QUESTION), POLICY.ngram_words)
    b = word_ngrams(normalise(document), POLICY.ngram_words)
    assert containment_ppm(a, b) < POLICY.threshold_ppm

    index = BenchmarkIndex.build([("bench/q1", QUESTION)], POLICY)
    assert index.match(document) is None
    # Half of the question verbatim is caught at the default threshold.
    half = " ".join(words[: len(words) * 3 // 4]) + " " + paraphrase.split(" ", 21)[-1]
    half_ppm = containment_ppm(a, word_ngrams(normalise(half), POLICY.ngram_words))
    assert half_ppm >= POLICY.threshold_ppm
    assert index.match(embed(half, 1_000, seed=7)) == Match("bench/q1", half_ppm)


def test_cjk_item_uses_char_ngrams_and_is_caught_when_embedded() -> None:
    index = BenchmarkIndex.build([("bench/zh", ZH_ITEM), ("bench/q1", QUESTION)], POLICY)
    assert index.mode("bench/zh") == "char"
    document = zh_filler(3_000, seed=8) + ZH_ITEM + zh_filler(3_000, seed=9)
    assert index.match(document) == Match("bench/zh", 1_000_000)
    assert index.match(zh_filler(6_000, seed=10)) is None
    # An edited half no longer reaches the threshold.
    edited = "".join(ch if i % 40 else "改" for i, ch in enumerate(ZH_ITEM))
    assert index.match(zh_filler(500, seed=11) + edited) is None


def test_item_shorter_than_ngram_words_uses_char_ngrams() -> None:
    short = "Name the longest river that flows through Cairo today?"  # 9 words, 55 chars
    index = BenchmarkIndex.build([("bench/short", short), ("bench/tiny", "Why?")], POLICY)
    assert index.mode("bench/short") == "char"
    assert index.unchecked == ("bench/tiny",)
    assert index.mode("bench/tiny") == "unchecked"
    assert len(index) == 2
    assert index.match(embed(short, 2_000, seed=12)) == Match("bench/short", 1_000_000)
    assert index.match(embed("name the longest river in europe", 2_000, seed=13)) is None


def test_same_items_in_another_order_give_the_same_digest_and_matches() -> None:
    items = [
        ("bench/q1", QUESTION),
        ("bench/zh", ZH_ITEM),
        ("bench/q2", " ".join(filler(40, seed=14))),
        ("bench/q3", " ".join(filler(25, seed=15))),
    ]
    index = BenchmarkIndex.build(items, POLICY)
    shuffled = BenchmarkIndex.build(reversed(items), POLICY)
    assert index.digest == shuffled.digest
    assert index.digest.startswith("sha256:")
    documents = [embed(text, 500, seed=n) for n, (_, text) in enumerate(items)]
    assert [index.match(d) for d in documents] == [shuffled.match(d) for d in documents]
    assert [m.item_id for m in index.match_many(documents)] == [i for i, _ in items]

    assert BenchmarkIndex.build(items[:3], POLICY).digest != index.digest
    lower = ContaminationPolicy(threshold_ppm=400_000)
    assert BenchmarkIndex.build(items, lower).digest != index.digest
    # The digest names items by digest only: no benchmark text in task keys or logs.
    assert QUESTION not in repr(index.digest)


def test_ties_choose_the_smallest_item_id() -> None:
    other = " ".join(filler(30, seed=16))
    items = [("b", QUESTION), ("c", other), ("a", QUESTION.upper())]
    index = BenchmarkIndex.build(items, POLICY)
    assert index.match(embed(QUESTION, 400, seed=17)) == Match("a", 1_000_000)
    both = embed(QUESTION + " " + other, 400, seed=18)
    assert index.match(both) == Match("a", 1_000_000)
    # A higher containment beats a smaller id.
    partial = " ".join(QUESTION.split()[:20]) + " " + other
    match = index.match(partial)
    assert match == Match("c", 1_000_000)


def test_duplicate_ids_and_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="given twice"):
        BenchmarkIndex.build([("x", "one"), ("x", "two")], POLICY)
    with pytest.raises(ValueError):
        ContaminationPolicy(threshold_ppm=0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ContaminationPolicy(threshold_ppm=1_000_001)
    with pytest.raises(ValueError):
        ContaminationPolicy(ngram_words=True)
    payload = policy_payload(POLICY)
    assert payload == {
        "version": "contamination.v1",
        "ngram_words": 13,
        "ngram_chars": 50,
        "threshold_ppm": 500_000,
    }
    json_digest(payload)  # hashable: no floats


def test_empty_inputs() -> None:
    index = BenchmarkIndex.build([("bench/q1", QUESTION)], POLICY)
    assert index.match("") is None
    assert index.match(" ... \n ") is None
    assert index.match_many([]) == []
    empty = BenchmarkIndex.build([], POLICY)
    assert len(empty) == 0
    assert empty.match(QUESTION) is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  \t\n ",
        "...",
        "(a)",
        "Hello, World!  “Quoted” — dash -- e.g. don't 3.14.",
        "x ... y ((z)) 'q'",
        "Straße ΣΊΣΥΦΟΣ İstanbul",
        "e\u0301 é Å A\u030a",
        "中文，测试。 日本語のテキスト！ ภาษาไทย",
        "\x1b[1mbold\x1b[0m back\bspace",
        "a\u2003b\u00a0c\u3000d\x1ce",
        "a\x1cb\x1dc\x1ed\x1fe\x0bf\x0cg\rh\x85i -- j!k",  # ASCII whitespace, then not ASCII
        "tab\there, form\x0cfeed; unit\x1fsep: x.y.z (end)",  # ASCII only: the translate path
    ],
)
def test_vectorised_normalisation_equals_the_reference(text: str) -> None:
    texts = [text, "filler " + text + " filler", text]
    stream = contamination_stream.normalise_stream(texts)
    assert [stream.text(r) for r in range(len(texts))] == [normalise(t) for t in texts]
    single = contamination_stream.Stream.single(text)
    assert single.text(0) == normalise(text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.characters(max_codepoint=127), max_size=60), min_size=1, max_size=6))
def test_ascii_batches_equal_the_reference(texts: list[str]) -> None:
    """Batches of ASCII text take the ``bytes.translate`` classes: every ASCII character."""
    stream = contamination_stream.normalise_stream(texts)
    assert [stream.text(r) for r in range(len(texts))] == [normalise(t) for t in texts]


def test_normalisation_rules() -> None:
    assert normalise("  Hello,\n\tWORLD!  ") == "hello world"
    assert normalise("«e.g.» don't (stop) --") == "e.g don't stop"
    assert normalise("Stra\u00dfe") == normalise("STRASSE") == "strasse"
    assert normalise("e\u0301") == "\u00e9"


def test_matches_equal_brute_force_on_a_mixed_corpus() -> None:
    rng = random.Random(19)
    items = [(f"w{n:02d}", " ".join(filler(rng.randint(14, 40), seed=100 + n))) for n in range(12)]
    items += [(f"s{n:02d}", " ".join(filler(rng.randint(8, 12), seed=200 + n))) for n in range(6)]
    items += [(f"z{n:02d}", zh_filler(rng.randint(50, 90), seed=300 + n)) for n in range(4)]
    policy = ContaminationPolicy(threshold_ppm=300_000)
    index = BenchmarkIndex.build(items, policy)
    documents = []
    for n in range(60):
        _, text = rng.choice(items)
        cut = rng.randint(0, len(text) // 2)
        piece = text[cut:] if rng.random() < 0.5 else text[: len(text) - cut]
        documents.append(" ".join(filler(rng.randint(0, 300), seed=400 + n)) + " " + piece)
    documents += [" ".join(filler(200, seed=500 + n)) for n in range(10)]
    expected = [brute_force(items, d, policy) for d in documents]
    assert index.match_many(documents) == expected
    assert [index.match(d) for d in documents] == expected
    assert sum(e is not None for e in expected) > 20


def test_hash_collisions_cost_time_but_never_change_a_result(monkeypatch) -> None:
    """With a degenerate hash (sum of code points, position-free) nearly everything collides;
    the exact confirmation must still give the brute-force answer."""
    ones = np.ones(1 << 20, dtype=np.uint64)
    monkeypatch.setattr(contamination_stream, "_powers", lambda n: (ones, ones))
    items = [("q1", QUESTION), ("zh", ZH_ITEM)]
    scrambled = " ".join(reversed(QUESTION.split()))  # same letters, other n-grams
    documents = [embed(QUESTION, 300, seed=20), embed(scrambled, 300, seed=21), ZH_ITEM[::-1]]
    confirmed = []
    confirm = ContainmentIndex._confirm

    def counting(self, *args):
        confirmed.append(confirm(self, *args))
        return confirmed[-1]

    monkeypatch.setattr(ContainmentIndex, "_confirm", counting)
    index = BenchmarkIndex.build(items, POLICY)
    assert index.match_many(documents) == [brute_force(items, d, POLICY) for d in documents]
    assert index.match_many(documents) == [Match("q1", 1_000_000), None, None]
    assert confirmed.count(0) >= 2  # the scrambled and reversed texts were candidates
