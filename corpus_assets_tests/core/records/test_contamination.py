"""Benchmark decontamination: word-character tokens, any shared 13-gram, short items whole.

The four real leak shapes users reported are reproduced with small fixtures (two of them are
what the earlier whitespace-token containment rule missed).
"""

import json
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest

from corpus_assets.core.records.canonicalize import _evidence as contaminated_detail
from corpus_assets.core.records.contamination import (
    BenchmarkIndex,
    Match,
    TokenPolicy,
    contamination_report,
)
from corpus_assets.core.records.contamination import stream as contamination_stream
from corpus_assets.core.records.contamination.index import TokenIndex
from corpus_assets.core.records.contamination.rules import normalise, reference_match, tokens
from corpus_assets.core.records.contamination.tokens import (
    letter_stream,
    single_stream,
    token_stream,
)
from corpus_assets.core.runtime.config import ContaminationConfig
from corpus_assets.core.storage.digests import json_digest
from corpus_assets_tests.paths import CORPORA

V2 = TokenPolicy()
CORPORA = CORPORA
ANSWER = "Nothing in particular happens, that's all: you just eat watermelon seeds"
SOLUTION = '''def has_close_elements(numbers, threshold):
    """Check if two numbers are closer to each other than the threshold."""
    for idx, elem in enumerate(numbers):
        for idx2, elem2 in enumerate(numbers):
            if idx != idx2:
                distance = abs(elem - elem2)
                if distance < threshold:
                    return True
    return False
'''
QUESTION = (
    "Which planet in our solar system has the longest day, measured as one full rotation on "
    "its axis relative to the distant stars, and why does it spin backwards?"
)
ZH_ITEM = (
    "在一个遥远的山村里，住着一位年迈的木匠。他每天清晨都会走到河边，"
    "观察水流的方向，然后回到作坊里雕刻一只新的木鸟。村里的孩子们常常问他为什么这样做。"
)
WORDS = ["ka", "lo", "mi", "ter", "van", "sul", "po", "rin", "dex", "ab", "or", "ne", "qui"]


def filler(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join("".join(rng.choices(WORDS, k=rng.randint(1, 3))) for _ in range(words))


def zh_filler(chars: int, seed: int) -> str:
    rng = random.Random(seed)
    return "".join(chr(rng.randint(0x4E00, 0x62FF)) for _ in range(chars))


def test_a_12_token_answer_quoted_in_a_fortune_is_caught_whole() -> None:
    assert len(tokens(ANSWER)) == 12  # ``that's`` is ``that s``: no 13-gram exists
    fortune = (
        "Q: What happens if you eat watermelon seeds?\n"
        "A: Nothing in particular happens -- that’s all; you just eat watermelon seeds!\n"
        "\t\t-- Overheard at a picnic"
    )
    v2 = BenchmarkIndex.build([("truthfulqa/17", ANSWER)], V2)
    assert v2.mode("truthfulqa/17") == "whole"
    match = v2.match(fortune)
    assert match is not None and match.item_id == "truthfulqa/17" and match.whole
    assert match.containment_ppm == 1_000_000


def test_a_respaced_solution_in_a_chat_message_is_caught() -> None:
    respaced = (
        SOLUTION.replace(", ", ",")
        .replace(" - ", "-")
        .replace(" != ", "!=")
        .replace("    ", "  ")
        .replace("(numbers,threshold)", "( numbers , threshold )")
    )
    message = "Sure! Here is a fix:\n```python\n" + respaced + "```\nHope that helps."
    assert respaced != SOLUTION and tokens(respaced) == tokens(SOLUTION)
    v2 = BenchmarkIndex.build([("humaneval/0", SOLUTION)], V2)
    match = v2.match(message)
    assert match is not None and match.item_id == "humaneval/0"
    assert match.containment_ppm == 1_000_000 and match.shared > 10
    # ``a+b`` and ``a + b`` tokenise the same; operators carry no token
    assert tokens("x=a+b") == tokens("x = a + b") == ["x", "a", "b"]


def test_a_long_item_pasted_verbatim_and_one_with_punctuation_changes_are_caught() -> None:
    v2 = BenchmarkIndex.build([("q/1", QUESTION)], V2)
    pasted = filler(3000, 1) + " " + QUESTION + " " + filler(3000, 2)
    edited = QUESTION.replace(",", "").replace("?", " !!").replace("day", "day --")
    for record in (pasted, filler(200, 3) + " «" + edited + "» " + filler(50, 4)):
        match = v2.match(record)
        assert match is not None and match.item_id == "q/1"


def test_any_shared_13_gram_flags_and_containment_is_the_evidence() -> None:
    words = QUESTION.split()
    one_gram = " ".join(words[5:18])  # exactly 13 tokens of a 28-token item
    index = BenchmarkIndex.build([("q/1", QUESTION)], V2)
    match = index.match(filler(500, 5) + " " + one_gram + " " + filler(500, 6))
    assert match is not None and match.shared == 1
    assert match.containment_ppm == 1_000_000 // (len(tokens(QUESTION)) - 12)  # 1 of its 13-grams


def test_clean_text_sharing_only_common_short_phrases_is_not_flagged() -> None:
    item = (
        "At the end of the day, in the middle of the night, the results of the study show "
        "that the number of people who live in the city is on the rise."
    )
    record = (
        "At the end of the day we went home. In the middle of the night it rained. The "
        "results of the study show little. The number of people who live in the village "
        "fell, and the price is on the rise."
    )
    assert BenchmarkIndex.build([("x/1", item)], V2).match(record) is None


def test_cjk_short_common_phrase_is_unchecked_and_never_over_matches() -> None:
    items = [("zh/long", ZH_ITEM), ("zh/phrase", "中华人民共和国"), ("zh/mid", ZH_ITEM[:24])]
    index = BenchmarkIndex.build(items, V2)
    assert index.mode("zh/phrase") == "unchecked"  # 7 letters < min_whole_chars
    assert index.mode("zh/mid") == "whole"  # 22 letters: checked whole
    assert index.mode("zh/long") == "ngram"
    common = zh_filler(300, 7) + "中华人民共和国成立以来，" + "村里的孩子们" + zh_filler(300, 8)
    assert index.match(common) is None
    assert index.match(zh_filler(200, 9) + ZH_ITEM[5:70] + zh_filler(200, 10)).item_id == (
        "zh/long"
    )
    assert index.match("前言" + ZH_ITEM[:24] + "后记").item_id == "zh/mid"
    assert index.unchecked == ("zh/phrase",)


def test_short_items_are_checked_whole_at_token_boundaries() -> None:
    short = "the quick brown fox jumps over the lazy dog"  # 9 tokens
    index = BenchmarkIndex.build([("s/1", short), ("s/2", "why not")], V2)
    assert index.mode("s/1") == "whole" and index.mode("s/2") == "unchecked"
    assert index.match("He said: The QUICK brown fox, jumps over the lazy dog.").item_id == "s/1"
    assert index.match("the quick brown fox jumps over the lazy dogs") is None  # not at a token end
    assert index.match("athe quick brown fox jumps over the lazy dog") is None  # nor start
    assert index.match("the quick brown fox jumps over a lazy dog") is None
    assert index.match("why not") is None  # unchecked: never flags


def test_report_counts_items_short_whole_unchecked_and_flagged_per_benchmark() -> None:
    items = [
        ("tqa/1", ANSWER),
        ("tqa/2", "why?"),
        ("he/0", SOLUTION),
        ("zh/1", "中华人民共和国"),
    ]
    names = {"tqa/1": "truthfulqa", "tqa/2": "truthfulqa", "he/0": "humaneval", "zh/1": "cmmlu"}
    index = BenchmarkIndex.build(items, V2, names)
    assert index.match(SOLUTION).benchmark == "humaneval"
    flagged = {"fortunes": {"tqa/1": 2}, "chats": {"he/0": 1, "tqa/1": 1}}
    report = contamination_report("contamination.v2", index, flagged)
    assert report["benchmarks"] == [
        {"benchmark": "cmmlu", "items": 1, "short_items": 1, "checked_whole": 0, "unchecked": 1,
         "flagged": 0},
        {"benchmark": "humaneval", "items": 1, "short_items": 0, "checked_whole": 0,
         "unchecked": 0, "flagged": 1},
        {"benchmark": "truthfulqa", "items": 2, "short_items": 2, "checked_whole": 1,
         "unchecked": 1, "flagged": 3},
    ]  # fmt: skip
    assert report["flagged"] == [
        {"benchmark": "humaneval", "source": "chats", "records": 1},
        {"benchmark": "truthfulqa", "source": "chats", "records": 1},
        {"benchmark": "truthfulqa", "source": "fortunes", "records": 2},
    ]
    assert contamination_report("contamination.v2", None, {})["benchmarks"] == []


def test_hash_collisions_cost_time_but_never_change_a_result(monkeypatch) -> None:
    """A position-free hash (sum of code points) collides anagrams; confirmation decides."""
    ones = np.ones(1 << 20, dtype=np.uint64)
    monkeypatch.setattr(contamination_stream, "_powers", lambda n: (ones, ones))
    items = [("q/1", QUESTION), ("s/1", "the quick brown fox jumps over the lazy dog")]
    index = TokenIndex.build(items, V2)
    scrambled = " ".join(reversed(QUESTION.split()))
    anagram = "the quick brown fox jumps over the lazy odg"  # same letters and lengths
    records = [scrambled, anagram, QUESTION, "dog lazy the over jumps fox brown quick the"]
    expected = [reference_match(items, r, V2) for r in records]
    assert [m and m.item_id for m in expected] == [None, None, "q/1", None]
    assert index.match_many(records) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ... ",
        "Hello, World!  don't e.g. 3.14 a+b a_b",
        "ﬁne ① Ⅻ ＡＢＣ Straße İstanbul e\u0301",
        "中文，测试。 日本語のテキスト！ ภาษาไทย",
        "nul\x00inside\x1b[1mbold\x1b[0m",
    ],
)
def test_vectorised_tokenisation_equals_the_reference(text: str) -> None:
    texts = [text, "filler " + text + " filler", "", text]
    stream = token_stream(texts)
    assert [stream.text(r) for r in range(len(texts))] == [normalise(t) for t in texts]
    assert single_stream(text).text(0) == normalise(text)
    letters = letter_stream(stream)  # only texts holding an unspaced-script character
    if any("\u4e00" <= c <= "\u9fff" for c in text):
        assert letters is not None and letters.text(0) == normalise(text).replace(" ", "")
        assert letters.text(2) == ""
    else:
        assert letters is None


def test_index_equals_the_reference_on_a_mixed_corpus() -> None:
    rng = random.Random(11)
    items = [(f"w{n:02d}", filler(rng.randint(4, 40), 100 + n)) for n in range(20)]
    items += [(f"z{n:02d}", zh_filler(rng.randint(10, 80), 300 + n)) for n in range(6)]
    index = TokenIndex.build(items, V2)
    records = []
    for n in range(80):
        _, text = rng.choice(items)
        cut = rng.randint(0, len(text) // 2)
        piece = text[cut:] if rng.random() < 0.5 else text[: len(text) - cut]
        records.append(filler(rng.randint(0, 200), 400 + n) + " " + piece)
    expected = [reference_match(items, r, V2) for r in records]
    assert index.match_many(records) == expected
    assert [index.match_many([r])[0] for r in records[:20]] == expected[:20]
    assert sum(e is not None for e in expected) > 30


def test_the_policy_payload_is_hashable_and_the_detail_names_the_evidence() -> None:
    assert ContaminationConfig().version == "contamination.v2"
    assert V2.payload() == {
        "version": "contamination.v2",
        "ngram_words": 13,
        "ngram_chars": 50,
        "min_whole_tokens": 8,
        "min_whole_chars": 20,
    }
    json_digest(V2.payload())  # hashable: no floats
    with pytest.raises(ValueError):
        TokenPolicy(min_whole_tokens=14)
    with pytest.raises(ValueError):
        TokenPolicy(ngram_words=True)
    with pytest.raises(ValueError):
        TokenPolicy(version="contamination.v1")
    whole = Match("q/1", 1_000_000, whole=True)
    assert contaminated_detail(whole) == "item q/1 containment 100.00% (whole item)"
    v2_match = Match("q/1", 62_500, shared=1, benchmark="quiz")
    assert contaminated_detail(v2_match) == (
        "item q/1 containment 6.25% (1 shared n-grams) of benchmark quiz"
    )


def test_same_items_in_another_order_give_the_same_digest_and_matches() -> None:
    items = [
        ("bench/q1", QUESTION),
        ("bench/zh", ZH_ITEM),
        ("bench/q2", filler(40, 14)),
        ("bench/q3", filler(25, 15)),
    ]
    index = BenchmarkIndex.build(items, V2)
    shuffled = BenchmarkIndex.build(reversed(items), V2)
    assert index.digest == shuffled.digest
    assert index.digest.startswith("sha256:")
    documents = [
        f"{filler(300, 20 + n)} {text} {filler(200, 40 + n)}" for n, (_, text) in enumerate(items)
    ]
    assert [index.match(d) for d in documents] == [shuffled.match(d) for d in documents]
    assert [m and m.item_id for m in index.match_many(documents)] == [i for i, _ in items]
    assert BenchmarkIndex.build(items[:3], V2).digest != index.digest
    other = TokenPolicy(ngram_words=12)
    assert BenchmarkIndex.build(items, other).digest != index.digest
    # The digest names items by digest only: no benchmark text in task keys or logs.
    assert QUESTION not in repr(index.digest)


def test_ties_choose_the_smallest_item_id_and_duplicate_ids_are_refused() -> None:
    items = [("b", QUESTION), ("a", QUESTION.upper())]
    index = BenchmarkIndex.build(items, V2)
    match = index.match(filler(100, 17) + " " + QUESTION)
    assert match is not None and match.item_id == "a" and match.containment_ppm == 1_000_000
    with pytest.raises(ValueError, match="given twice"):
        BenchmarkIndex.build([("x", "one"), ("x", "two")], V2)


def test_empty_inputs() -> None:
    index = BenchmarkIndex.build([("bench/q1", QUESTION)], V2)
    assert index.match("") is None
    assert index.match(" ... \n ") is None
    assert index.match_many([]) == []
    empty = BenchmarkIndex.build([], V2)
    assert len(empty) == 0
    assert empty.match(QUESTION) is None


def _shard_texts(folder: Path, limit: int) -> list[str]:
    texts: list[str] = []
    for shard in sorted(folder.glob("*.jsonl.zst")):
        raw = subprocess.run(["zstd", "-dc", str(shard)], check=True, capture_output=True)
        texts += [json.loads(line)["text"] for line in raw.stdout.decode().splitlines()]
        if len(texts) >= limit:
            break
    return texts[:limit]


@pytest.mark.skipif(not CORPORA.is_dir(), reason="../shared/corpora is absent")
def test_control_sets_get_no_flag_from_fortune_and_chat_items() -> None:
    """Fortunes (quotes, jokes) and chat-dialogs turns are not quoted by the Python
    documentation nor by licence texts, so 0 flags is expected (measured on the whole of both
    corpora against 8,000 such items: 0); hundreds of short items are checked whole, which is
    where a loose rule would over-match. (Licence passages are not used as items: the docs'
    "History and License" page quotes real licences, a true match.)"""
    rng = random.Random(3)
    fortunes = _shard_texts(CORPORA / "fortunes", 20_000)
    chats = _shard_texts(CORPORA / "chat-dialogs", 8_000)
    items = [(f"f/{n}", t) for n, t in enumerate(rng.sample(fortunes, 800))]
    items += [(f"c/{n}", t) for n, t in enumerate(rng.sample(chats, 800))]
    index = BenchmarkIndex.build(items, V2)
    assert sum(r["checked_whole"] for r in index.report({})) > 400
    for control in ("python-docs", "licenses"):
        texts = _shard_texts(CORPORA / control, 150)
        assert [m for m in index.match_many(texts) if m is not None] == [], control


def test_an_n_gram_split_across_two_records_of_a_batch_does_not_match() -> None:
    item = " ".join(f"w{n}" for n in range(14))  # 14 tokens: two 13-grams
    index = BenchmarkIndex.build([("x/1", item)], V2)
    halves = [" ".join(f"w{n}" for n in range(7)), " ".join(f"w{n}" for n in range(7, 14))]
    assert index.match_many([*halves, "", item]) == [None, None, None, index.match(item)]
    assert index.match(item) is not None
