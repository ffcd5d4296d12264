import random
import sys
import tracemalloc

import datasketch
import numpy as np
import pytest
from datasketch.minhash import _fmix

from corpus_assets.core.dedup.jaccard import jaccard, jaccard_sorted
from corpus_assets.core.dedup.minhash import (
    engine,
    fingerprints,
    shingling,
    signatures,
    sketch,
    unit_hash,
)
from corpus_assets.core.dedup.minhash.shingling import (
    is_unspaced,
    normalise,
    shingle_units,
    shingles,
)
from corpus_assets.core.dedup.minhash.spec import MAX_HASH, VERSION, SignatureSpec, spec_payload
from corpus_assets.core.dedup.minhash.unit_hash import (
    fingerprint64,
    fingerprint64_units,
    unit_hash64,
)

V2 = SignatureSpec(version="minhash.v2")  # its golden vectors (v3 signs the same)
SPEC = V2  # the shingling tests (v2 and v3 shingle spaced text the same)
BOTH = pytest.mark.parametrize("spec", [V2, SignatureSpec()], ids=["v2", "v3"])
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


_POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?()'\"-",
    "àáâãäåæçèéêëìíîïñòóôõöøùúûüýßẞſǅĲ",
    "\u0300\u0301\u0302\u0308\u0327\u0338\u20dd",  # combining marks
    "数据去重是一个签名问题精确哈希会漏掉近重复同篇文章带着三种不的样板页脚出现",
    "\U00020000\U00020001\U0002a6d6\U0002f800",  # CJK outside the BMP
    "ひらがなカタカナテキストは空白で区切られません",
    "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "한국어텍스트는띄어쓰기를합니다",
    "नमस्तेहिन्दीपाठ",
    "العربيةمناليمين",
    "Привет мир текст",
    "👍🎉😀🇩🇪👩\u200d👩\u200d👧\ufe0f",
    " \t\n\r\x0b\x0c\x1c\x85\xa0\u2028\u3000",  # every kind of whitespace
    "\x00\x01\x7f\ufffd\uffff",
]


def _unicode_texts(count: int, seed: int = 11) -> list[str]:
    """Random texts mixing scripts, marks, emoji, odd whitespace and control characters."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        weights = [rng.random() ** 3 for _ in _POOLS]
        weights[-2] += 0.3 * rng.random()  # whitespace, so most texts have several units
        size = rng.choice([0, 1, 2, 3, 4, 5, 6, 9, 30, 120, 400])
        pools = rng.choices(_POOLS, weights, k=size)
        texts.append("".join(rng.choice(pool) for pool in pools))
    return texts


def _long_texts() -> list[str]:
    """Texts longer than the small block sizes used below: pieces, cut tokens, giant tokens."""
    rng = random.Random(5)
    return [
        _english(rng, 700),
        "x" * 3000 + " y z",  # a giant token: fewer than n units
        "a " * 500 + "b" * 777 + " c" * 300,
        "   ".join(_english(rng, 1).upper() for _ in range(400)),
        "数据去重是一个签名问题" * 150 + " 中文 " + "ภาษาไทย" * 60,
        "".join(rng.choice(_POOLS[3] + " ") for _ in range(2500)),
    ]


def _reference_fps(text: str, spec: SignatureSpec) -> list[int]:
    return sorted({fingerprint64_units(u) for u in shingle_units(text, spec)})


def _v2_hv(units: tuple[str, ...]) -> int:
    return fingerprint64_units(units) >> 32


def _datasketch_v2(text: str, spec: SignatureSpec) -> np.ndarray:
    m = datasketch.MinHash(
        num_perm=spec.num_perm, seed=spec.seed, scheme="affine32", hashfunc=_v2_hv
    )
    m.update_batch(shingle_units(text, spec))
    return m.hashvalues


# --- minhash.v2 -----------------------------------------------------------------------------


def test_default_spec_is_v3_with_v2_signatures():
    assert SignatureSpec().version == VERSION == "minhash.v3"
    texts = [t for t in _golden_texts()[:10] if not is_unspaced(normalise(t))]
    # v3 segments unspaced scripts into words; on spaced text it signs as v2 does.
    assert np.array_equal(signatures(texts), signatures(texts, SignatureSpec(version="minhash.v2")))
    with pytest.raises(ValueError, match="unsupported signature version"):
        SignatureSpec(version="minhash.v1")


@pytest.mark.parametrize(("num_perm", "seed"), [(128, 1), (64, 42), (16, 0), (200, 98765)])
def test_v2_golden_vectors_match_datasketch_affine32_bit_for_bit(num_perm, seed):
    spec = SignatureSpec(num_perm=num_perm, seed=seed)
    texts = _golden_texts() + _unicode_texts(40)
    ours = signatures(texts, spec)
    assert ours.shape == (len(texts), num_perm) and ours.dtype == np.uint32
    assert ours.flags.c_contiguous
    for text, row in zip(texts, ours, strict=True):
        ref = _datasketch_v2(text, spec)
        assert ref.dtype == np.uint32
        assert row.tobytes() == ref.tobytes(), text


def test_v2_permutations_and_finalisers_are_datasketchs():
    for num_perm, seed in [(128, 1), (7, 3)]:
        a, b = engine._affine32_permutations(num_perm, seed)
        ref = datasketch.MinHash(num_perm=num_perm, seed=seed, scheme="affine32").permutations
        assert a.dtype == b.dtype == np.uint32
        assert np.array_equal(a, ref[0]) and np.array_equal(b, ref[1])
        assert (a % 2 == 1).all()
    rng = np.random.default_rng(1)
    edges = np.array([0, 1, 2**32 - 1, 2**32, 2**64 - 1], dtype=np.uint64)
    x64 = np.concatenate([rng.integers(0, 2**64 - 1, 5000, dtype=np.uint64), edges])
    assert x64.dtype == np.uint64
    assert np.array_equal(unit_hash._fmix64(x64.copy()), _fmix(x64, 64))
    assert [unit_hash._fmix64_int(int(v)) for v in x64[:200]] == _fmix(x64[:200], 64).tolist()
    x32 = x64.astype(np.uint32)
    assert np.array_equal(engine._fmix32(x32.copy()), _fmix(x32, 32))


def _spec_fmix64(x: int) -> int:
    return int(_fmix(np.array([x], dtype=np.uint64), 64)[0])


def _spec_fingerprint(units: list[str]) -> int:
    """The module docstring's definition, written out independently of the module."""
    m64 = 1 << 64
    k, c, r = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x27D4EB2F165667C5
    hashes = []
    for unit in units:
        poly = sum(ord(ch) * pow(k, i, m64) for i, ch in enumerate(unit)) % m64
        hashes.append(_spec_fmix64((poly + len(unit) * c) % m64))
    m = len(hashes)
    acc = sum(u * pow(r, m - 1 - i, m64) for i, u in enumerate(hashes)) % m64
    return _spec_fmix64((acc + m) % m64)


def test_v2_scalar_reference_follows_the_documented_definition():
    texts = _golden_texts() + _unicode_texts(60)
    checked = 0
    for text in texts:
        for units in shingle_units(text, V2)[:20]:
            assert fingerprint64_units(units) == _spec_fingerprint(list(units)), units
            checked += 1
    assert checked > 500
    # Pinned values: any change to the v2 definition must come with a new version.
    assert fingerprint64("the quick brown fox jumps") == 0x31B8F17AA5F79D03
    assert fingerprint64("hello") == 0x7E839500E4B82888
    assert fingerprint64("a") == 0x76EFD33DB82B96BD
    assert fingerprint64("数据去重是", unspaced=True) == 0x907EBA798F9095D6
    assert unit_hash64("the") == 0xCE3F1378860BE8A4
    # Word mode splits the shingle text at " ", char mode takes its code points.
    assert fingerprint64("a b c") == fingerprint64_units(["a", "b", "c"])
    assert fingerprint64("a b", unspaced=True) == fingerprint64_units(["a", " ", "b"])
    assert fingerprint64("ab") != fingerprint64("ab", unspaced=True)
    assert unit_hash64("a\x00") != unit_hash64("a")  # the length is hashed too


@pytest.mark.parametrize(
    "spec",
    [
        V2,
        SignatureSpec(shingle_words=1, shingle_chars=1),
        SignatureSpec(shingle_words=2, shingle_chars=3),
        SignatureSpec(shingle_words=9, shingle_chars=7),
    ],
    ids=["5-5", "1-1", "2-3", "9-7"],
)
def test_v2_vectorised_fingerprints_match_scalar_reference(spec):
    texts = _golden_texts() + _unicode_texts(400) + _long_texts()
    norms = [shingling.normalise(t) for t in texts]
    chars = [n for n in norms if n and shingling.is_unspaced(n)]
    words = [n for n in norms if n and not shingling.is_unspaced(n)]
    assert len(chars) > 100 and len(words) > 150  # both modes well covered, and
    assert sum(len(n.split(" ")) >= 9 for n in words) > 30  # long and short documents
    assert sum(len(n) < 5 for n in chars) > 10 and sum(len(n) >= 9 for n in chars) > 50
    got = fingerprints(texts, spec)
    assert len(got) == len(texts)
    for text, fp in zip(texts, got, strict=True):
        assert fp.dtype == np.uint64, text
        assert fp.tolist() == _reference_fps(text, spec), text


def test_v2_lone_surrogates_are_hashed_as_code_points():
    texts = ["abc \ud800 def ghi jkl mno", "数据\udfff去重是一个签名问题"]
    for text, fp in zip(texts, fingerprints(texts, V2), strict=True):
        assert len(fp) > 1 and fp.tolist() == _reference_fps(text, V2)


def test_v2_short_document_rule_and_empty_documents():
    assert fingerprints(["", " \n\t "], V2)[0].tolist() == []
    fp = fingerprints(["", "Hello   WORLD", "one two three four", "中文", "数据去重是一个"], V2)
    assert fp[0].dtype == np.uint64 and len(fp[0]) == 0
    assert fp[1].tolist() == [fingerprint64("hello world")]
    assert fp[2].tolist() == [fingerprint64("one two three four")]
    assert fp[3].tolist() == [fingerprint64("中文", unspaced=True)]
    assert len(fp[4]) == 3  # 7 chars, 5-grams
    sig = signatures(["", "x", " "], V2)
    assert (sig[0] == MAX_HASH).all() and (sig[2] == MAX_HASH).all()
    assert not (sig[1] == MAX_HASH).all()
    assert signatures([], V2).shape == (0, 128) and fingerprints([], V2) == []


def test_v2_normalisation_equivalences():
    a, b, c = fingerprints(
        ["Café  au\nlait ok fine", "CAFE\u0301 AU LAIT OK FINE", "cafe au lait ok fine"], V2
    )
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert fingerprints(["a b c d e a b c d e"], V2)[0].size == 5  # a set


@BOTH
def test_sketch_is_signatures_plus_fingerprints(spec):
    texts = [*_golden_texts(), *_unicode_texts(50)]
    sig, fps = sketch(texts, spec)
    assert np.array_equal(sig, signatures(texts, spec))
    ref = fingerprints(texts, spec)
    assert len(fps) == len(ref) == len(texts)
    for text, x, y in zip(texts, fps, ref, strict=True):
        assert np.array_equal(x, y)
        assert (np.diff(x.astype(np.float64)) > 0).all() or len(x) < 2  # sorted, unique
        assert len(x) == len(set(shingles(text, spec)))  # no fingerprint collisions here


@BOTH
def test_block_sizes_do_not_change_results(monkeypatch, spec):
    texts = _golden_texts() + _unicode_texts(80) + _long_texts()
    whole_sig, whole_fp = sketch(texts, spec)
    one_by_one = np.vstack([signatures([t], spec) for t in texts])
    assert np.array_equal(whole_sig, one_by_one)
    for codepoints, rows in [(7, 3), (64, 7), (1000, 1), (5000, 50)]:
        monkeypatch.setattr(engine, "_BLOCK_CODEPOINTS", codepoints)  # long: in pieces
        monkeypatch.setattr(engine, "_AFFINE_BLOCK_CELLS", 128 * rows)  # span blocks
        monkeypatch.setattr(shingling, "_SPLIT_MAX", codepoints)
        sig, fps = sketch(texts, spec)
        assert np.array_equal(whole_sig, sig), codepoints
        assert all(np.array_equal(x, y) for x, y in zip(whole_fp, fps, strict=True))


def test_v2_long_documents_in_pieces_match_scalar_reference(monkeypatch):
    texts = [*_long_texts(), "w" * 40, "p q", "a" + " b" * 30, "数据" * 30]
    for spec in (V2, SignatureSpec(shingle_words=1, shingle_chars=2)):
        for limit in (3, 5, 16, 101):
            monkeypatch.setattr(engine, "_BLOCK_CODEPOINTS", limit)
            for text, fp in zip(texts, fingerprints(texts, spec), strict=True):
                assert fp.tolist() == _reference_fps(text, spec), (limit, text[:40])
            assert np.array_equal(
                signatures(texts, spec),
                np.array([_datasketch_v2(t, spec) for t in texts], dtype=np.uint32),
            )


def test_long_text_whitespace_collapse_equals_split_join():
    assert sorted(shingling._SPACES) == [c for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    rng = random.Random(2)
    texts = [*_unicode_texts(200, seed=4), "  a   b  ", "\u3000\u3000x\u2028\u2029y\x1c"]
    texts += [
        "".join(rng.choice(" \t\n\xa0ab") for _ in range(rng.randrange(300))) for _ in "x" * 50
    ]
    normal = [shingling.normalise(t) for t in texts]
    saved = shingling._SPLIT_MAX
    try:
        shingling._SPLIT_MAX = 0
        assert [shingling.normalise(t) for t in texts] == normal
    finally:
        shingling._SPLIT_MAX = saved


def test_long_text_collapse_in_small_segments_equals_split_join(monkeypatch):
    rng = random.Random(3)
    texts = [*_unicode_texts(100, seed=5), "  a   b  ", "x" * 40, "\u3000\u3000x\u2028\u2029y\x1c"]
    texts += [
        "".join(rng.choice(" \t\n\xa0\u2003ab") for _ in range(rng.randrange(300)))
        for _ in "x" * 50
    ]
    monkeypatch.setattr(shingling, "_SEGMENT", 7)  # many segments, tokens longer than one
    for text in texts:
        assert shingling._collapse_segments(text) == " ".join(text.split())


@pytest.mark.parametrize("spec", [V2, "v2-long"], ids=["v2", "v2-long"])
def test_memory_is_bounded_by_blocks(monkeypatch, spec):
    rng = random.Random(9)
    texts = [_english(rng, 150) + str(i) for i in range(2000)]  # ~1.8 M code points
    if spec == "v2-long":
        spec, texts = V2, [" ".join(texts[:600])]
    monkeypatch.setattr(engine, "_BLOCK_CODEPOINTS", 1 << 14)
    monkeypatch.setattr(engine, "_AFFINE_BLOCK_CELLS", 1 << 16)
    sketch(["warm up caches and lazy imports", "x " * 30], spec)
    for fn in (signatures, fingerprints):
        tracemalloc.start()
        try:
            out = fn(texts, spec)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        kept = out.nbytes if isinstance(out, np.ndarray) else sum(x.nbytes + 120 for x in out)
        # Whole-input temporaries would be tens of bytes per code point (> 40 MB here).
        assert peak - kept < 4 << 20, (fn.__name__, peak, kept)


# --- v2 and v3 ------------------------------------------------------------------------------


@BOTH
def test_estimated_jaccard_tracks_exact(spec):
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
    sigs, fps = sketch([base, *variants], spec)
    sb = set(shingles(base, spec))
    for text, sig, fp in zip(variants, sigs[1:], fps[1:], strict=True):
        exact = jaccard(sb, set(shingles(text, spec)))
        assert jaccard_sorted(fps[0], fp) == exact
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
    assert (sig[0] == MAX_HASH).all()  # no shingles: datasketch's empty value
    assert not (sig[1] == MAX_HASH).all()


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


def test_shingle_units_are_the_shingles():
    for text in _golden_texts() + _unicode_texts(100):
        norm = shingling.normalise(text)
        sep = "" if norm and shingling.is_unspaced(norm) else " "
        assert [sep.join(u).encode() for u in shingle_units(text, V2)] == shingles(text, V2)


def test_spec_payload_and_validation():
    v2 = spec_payload(V2)
    assert all(isinstance(v, int | str) and not isinstance(v, bool) for v in v2.values())
    assert v2["version"] == "minhash.v2" and v2["num_perm"] == 128
    assert v2["permutation"] == "datasketch_affine32_fmix32"
    assert spec_payload(SignatureSpec(version="minhash.v2", seed=2)) != v2
    assert spec_payload(SignatureSpec())["shingling"] != v2["shingling"]
    with pytest.raises(ValueError):
        SignatureSpec(num_perm=0)
    with pytest.raises(ValueError):
        SignatureSpec(version="minhash.v4")


def test_jaccard_exact():
    assert jaccard({1, 2}, {1, 2, 3}) == pytest.approx(2 / 3)
    assert jaccard({1}, {2}) == 0.0
    assert jaccard(set(), set()) == 1.0


def test_jaccard_sorted_matches_set_jaccard():
    empty = np.zeros(0, dtype=np.uint64)
    one = np.array([5], dtype=np.uint64)
    assert jaccard_sorted(empty, empty) == 1.0
    assert jaccard_sorted(empty, one) == jaccard_sorted(one, empty) == 0.0
    assert jaccard_sorted(one, one) == 1.0
    top = np.array([2**64 - 2, 2**64 - 1], dtype=np.uint64)
    assert jaccard_sorted(top, one) == 0.0  # every lookup lands past the end
    assert jaccard_sorted(top, top[1:]) == 0.5
    rng = np.random.default_rng(4)
    for _ in range(300):
        pool = rng.integers(0, 2**64 - 1, int(rng.integers(1, 700)), dtype=np.uint64)
        if rng.random() < 0.5:
            pool = pool % np.uint64(rng.integers(1, 900))  # dense: many shared values
        a = np.unique(rng.choice(pool, int(rng.integers(0, 400))))
        b = np.unique(rng.choice(pool, int(rng.integers(0, 400))))
        ref = jaccard(set(a.tolist()), set(b.tolist()))
        assert jaccard_sorted(a, b) == ref
        assert jaccard_sorted(b, a) == ref
