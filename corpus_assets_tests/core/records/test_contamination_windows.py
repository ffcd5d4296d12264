"""The contamination screen reads a long text in bounded windows with exactly the unwindowed result.

A tiny window (the ``window`` parameter) makes every item straddle cuts; matches, containment
and shared n-gram counts must equal the one-window computation, which the other contamination
tests tie to the reference rules.
"""

import random
from itertools import pairwise

import pytest

from corpus_assets.core.records.contamination import TokenPolicy
from corpus_assets.core.records.contamination.index import TokenIndex
from corpus_assets.core.records.contamination.rules import reference_match
from corpus_assets.core.records.contamination.tokens import fold
from corpus_assets.core.records.contamination.windows import (
    _folded_pieces,
    folded_windows,
    windows,
)

POLICY = TokenPolicy(ngram_words=5, ngram_chars=8, min_whole_tokens=2, min_whole_chars=3)
ITEMS = [
    ("long", "the quick brown fox jumps over the lazy dog today"),
    ("short", "Paris, France!"),
    ("cjk", "天地玄黄宇宙洪荒日月盈昃辰宿列张"),
    ("cjk_short", "寒来暑往"),
    ("mixed", "秋收冬藏abc闰余成岁律吕调阳"),
]
WORDS = ["the", "fox", "dog", "over", "lazy", "paris", "France", "x_1", "数", "Ünïcode"]
JOINERS = [" ", "  ", ", ", "\n", "—", "...", ""]
BIG = 1 << 30


@pytest.fixture(scope="module")
def index() -> TokenIndex:
    return TokenIndex.build(ITEMS, POLICY)


def _cuts(text: str, window: int) -> list[int]:
    return [hi for _, hi in windows(fold(text), window, POLICY.ngram_words, POLICY.ngram_chars)]


def test_an_ngram_across_a_cut_is_matched_with_the_same_evidence(index: TokenIndex) -> None:
    filler = "lorem ipsum " * 8
    fragment = "the quick brown fox jumps over"  # 2 of the item's 5-grams
    text = filler + fragment + " dolor" * 10
    straddling = len(filler) + 12
    assert len(filler) < _cuts(text, straddling)[0] < len(filler) + len(fragment)
    whole = index.match_many([text], window=BIG)[0]
    assert whole is not None and whole.item_id == "long" and whole.shared == 2
    for window in (5, 17, 40, len(filler) + 10, straddling):
        assert index.match_many([text], window=window)[0] == whole


def test_short_items_and_cjk_grams_across_cuts_are_matched(index: TokenIndex) -> None:
    text = "a b c d " * 5 + "Paris ... france? " + "e f g " * 5
    cjk = "数" * 30 + "，天地玄黄宇宙洪荒，" + "數" * 30
    cjk_short = "数" * 30 + "寒来暑往" + "字" * 30
    split = "数，" * 30 + "，".join("天地玄黄宇宙洪荒") + "，數" * 30  # letters span 8 tokens
    cases = ((text, "short"), (cjk, "cjk"), (cjk_short, "cjk_short"), (split, "cjk"))
    for source, item in cases:
        whole = index.match_many([source], window=BIG)[0]
        assert whole is not None and whole.item_id == item
        for window in range(1, 40, 3):
            assert index.match_many([source], window=window) == [whole]


def test_windows_advance_and_cover_the_text() -> None:
    text = fold("aaaa " * 50 + "天" * 100 + " b" * 30)
    spans = list(windows(text, 7, POLICY.ngram_words, POLICY.ngram_chars))
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a[0] < b[0] and a[1] < b[1] and b[0] <= a[1] for a, b in pairwise(spans))


def _text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 60)):
        if rng.random() < 0.15:
            item = rng.choice(ITEMS)[1]
            lo = rng.randrange(len(item))
            parts.append(item[lo : lo + rng.randint(1, len(item))])
        else:
            parts.append(rng.choice(WORDS))
        parts.append(rng.choice(JOINERS))
    return "".join(parts)


def test_windowed_matching_agrees_with_unwindowed_on_random_texts(index: TokenIndex) -> None:
    rng = random.Random(20261202)
    texts = [_text(rng) for _ in range(200)]
    whole = index.match_many(texts, window=BIG)
    assert sum(m is not None for m in whole) > 40  # the texts do exercise matching
    for window in (2, 11, 29):
        assert index.match_many(texts, window=window) == whole
    for text in texts[:60]:  # every item's evidence, not only the best match
        assert index._windowed(text, 2) == index._windowed(text, BIG)
    for text, match in zip(texts[:60], whole[:60], strict=True):
        assert reference_match(ITEMS, text, POLICY) == match


def test_folding_in_pieces_equals_folding_the_whole() -> None:
    rng = random.Random(7)
    alphabet = "aZ e\u0301\u0308ﬁ①Ｆ天가\u1161\u11a8ΣσςẞǅÅ\u0327 ,.\n"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        for size in (1, 3, 10):
            assert "".join(_folded_pieces(text, size)) == fold(text)
            parts = list(folded_windows(text, size, POLICY.ngram_words, POLICY.ngram_chars))
            assert parts == [fold(text)[lo:hi] for lo, hi in windows(fold(text), size, 5, 8)]
