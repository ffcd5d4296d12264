import random

import numpy as np
import pytest

from corpus_assets.core import minhash as mh
from corpus_assets.core.minhash import SignatureSpec, jaccard, shingles, signatures, spec_payload

datasketch = pytest.importorskip("datasketch")

SPEC = SignatureSpec()
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "or",
    "from",
    "at",
    "which",
    "an",
    "not",
    "have",
    "data",
    "corpus",
    "record",
    "shard",
    "manifest",
    "signature",
    "hash",
    "near",
    "duplicate",
    "license",
    "copyright",
    "python",
    "module",
    "function",
    "value",
    "return",
    "error",
    "file",
    "stream",
    "token",
    "window",
    "bucket",
    "band",
    "row",
    "seed",
]


def _english(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def _golden_texts() -> list[str]:
    rng = random.Random(7)
    texts = [
        "",
        "   \n\t ",
        "a",
        "Hello",
        "two words",
        "exactly five words right here",
        "The Quick  Brown\tFox\njumps over the lazy dog",
        "Straße STRASSE straße groß",  # casefold
        "Cafe\u0301 café CAFÉ naïve nai\u0308ve",  # NFC
        "数据去重是一个签名问题",
        "精确哈希去重会漏掉近重复：同一篇文章带着三种不同的样板页脚出现。",
        "日本語のテキストは空白で区切られません。カタカナもあります。",
        "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
        "中文",
        "Python 是一种编程语言，由 Guido van Rossum 创建。",
        "Привет мир, это русский текст с несколькими словами подряд",
        "def f(x):\n    return x + 1\n\n\nclass A:\n    pass\n",
        "import numpy as np\nprint(np.arange(10).sum())  # 45",
        "for (int i = 0; i < n; ++i) { sum += a[i]; }",
        "👍👍👍 emoji only 🎉",
        "word " * 40,
        "repeat repeat repeat repeat repeat repeat",
        "Permission is hereby granted, free of charge, to any person obtaining a copy",
    ]
    while len(texts) < 50:
        texts.append(_english(rng, rng.choice([3, 6, 20, 80, 200])))
    return texts


def _datasketch_sig(sh: list[bytes], spec: SignatureSpec = SPEC) -> np.ndarray:
    m = datasketch.MinHash(num_perm=spec.num_perm, seed=spec.seed, scheme="legacy")
    for s in sh:
        m.update(s)
    return m.hashvalues


def test_golden_vectors_match_datasketch_legacy_bit_for_bit():
    texts = _golden_texts()
    assert len(texts) == 50
    ours = signatures(texts, SPEC)
    assert ours.shape == (50, 128) and ours.dtype == np.uint32
    for text, row in zip(texts, ours, strict=True):
        ref = _datasketch_sig(shingles(text, SPEC))
        assert ref.max() <= mh.MAX_HASH
        assert row.tobytes() == ref.astype(np.uint32).tobytes(), text


def test_other_num_perm_and_seed_match_datasketch():
    spec = SignatureSpec(num_perm=64, seed=42)
    texts = _golden_texts()[:20]
    for text, row in zip(texts, signatures(texts, spec), strict=True):
        assert np.array_equal(row, _datasketch_sig(shingles(text, spec), spec).astype(np.uint32))


def test_fast_mod_equals_numpy_mod_including_edges():
    a, b = mh._permutations(128, 1)
    hv = np.random.default_rng(0).integers(0, 1 << 32, 20000, dtype=np.uint64)
    hv = np.concatenate([hv, np.array([0, 1, mh.MAX_HASH], dtype=np.uint64)])
    ref = ((hv[:, None] * a + b) % np.uint64(mh.MERSENNE_PRIME)) & np.uint64(mh.MAX_HASH)
    assert np.array_equal(mh._permute(hv, a, b), ref.astype(np.uint32))


def test_estimated_jaccard_tracks_exact():
    rng = random.Random(3)
    base_words = [rng.choice(_WORDS) + str(rng.randrange(50)) for _ in range(300)]
    base = " ".join(base_words)
    variants = []
    for frac in (0.0, 0.02, 0.05, 0.1, 0.2, 0.4, 0.7):
        words = list(base_words)
        for i in rng.sample(range(len(words)), int(frac * len(words))):
            words[i] = "edited" + str(i)
        variants.append(" ".join(words))
    variants.append(base + " " + _english(rng, 100))  # appended tail
    variants.append(" ".join(base_words[50:250]))  # cropped
    variants.append(_english(rng, 300))  # unrelated
    sigs = signatures([base, *variants], SPEC)
    sb = set(shingles(base, SPEC))
    for text, sig in zip(variants, sigs[1:], strict=True):
        exact = jaccard(sb, set(shingles(text, SPEC)))
        est = float(np.mean(sig == sigs[0]))
        assert abs(est - exact) <= 0.1, (exact, est)


def test_short_document_rule():
    assert shingles("", SPEC) == []
    assert shingles(" \n\t ", SPEC) == []
    assert shingles("Hello   WORLD", SPEC) == [b"hello world"]
    assert shingles("one two three four", SPEC) == [b"one two three four"]
    assert shingles("one two three four five", SPEC) == [b"one two three four five"]
    assert len(shingles("one two three four five six", SPEC)) == 2
    assert shingles("中文", SPEC) == ["中文".encode()]
    assert len(shingles("数据去重是一个", SPEC)) == 3  # 7 chars, 5-grams
    sig = signatures(["", "x"], SPEC)
    assert (sig[0] == mh.MAX_HASH).all()  # no shingles: datasketch's empty value
    assert not (sig[1] == mh.MAX_HASH).all()


def test_normalisation_and_script_choice():
    assert shingles("Café  au\nlait ok fine", SPEC) == shingles("CAFE\u0301 AU LAIT OK FINE", SPEC)
    assert shingles("a b c d e a b c d e", SPEC) == [
        b"a b c d e",
        b"b c d e a",
        b"c d e a b",
        b"d e a b c",
        b"e a b c d",
    ]  # a set: repeated shingles appear once
    cjk = shingles("这是中文文本没有空格", SPEC)
    assert all(len(s.decode()) == 5 for s in cjk)
    thai = shingles("ภาษาไทยไม่มีการเว้นวรรค", SPEC)
    assert all(len(s.decode()) == 5 for s in thai)
    mixed = shingles("the api returns 数据 when the call succeeds without any error", SPEC)
    assert all(len(s.decode().split(" ")) == 5 for s in mixed)  # mostly Latin: word shingles


def test_deterministic_across_calls_and_batch_sizes(monkeypatch):
    texts = _golden_texts()
    whole = signatures(texts, SPEC)
    assert np.array_equal(whole, signatures(texts, SPEC))
    one_by_one = np.vstack([signatures([t], SPEC) for t in texts])
    assert np.array_equal(whole, one_by_one)
    monkeypatch.setattr(mh, "_BLOCK_CELLS", 128 * 7)  # 7-row blocks: documents span blocks
    assert np.array_equal(whole, signatures(texts, SPEC))
    assert signatures([], SPEC).shape == (0, 128)


def test_spec_payload_and_validation():
    payload = spec_payload(SPEC)
    assert all(isinstance(v, int | str) and not isinstance(v, bool) for v in payload.values())
    assert payload["version"] == "minhash.v1" and payload["num_perm"] == 128
    assert spec_payload(SignatureSpec(seed=2)) != payload
    with pytest.raises(ValueError):
        SignatureSpec(num_perm=0)
    with pytest.raises(ValueError):
        SignatureSpec(version="minhash.v2")


def test_jaccard_exact():
    assert jaccard({1, 2}, {1, 2, 3}) == pytest.approx(2 / 3)
    assert jaccard({1}, {2}) == 0.0
    assert jaccard(set(), set()) == 1.0
